//! safetensors case files and checkpoint weights.
//!
//! - [`case`]: a problem's operands and an operation's output in the physical layouts of SPEC §2
//!   ([`save_problem`], [`load_problem`], [`save_output`], [`load_output`] and in-memory variants).
//! - [`weights`]: one NVFP4 linear weight from a ModelOpt or compressed-tensors checkpoint.
//! - [`quantize`]: a dense f32/f16/bf16 file to NVFP4 in the ModelOpt convention.
//!
//! Every malformed input (missing tensor, wrong dtype or shape, truncated or garbage bytes) is a
//! typed [`Error`](crate::Error) naming the tensor or the file; nothing panics.

mod archive;
pub mod case;
pub mod quantize;
pub mod weights;

pub use case::{
    load_output, load_problem, output_from_bytes, output_to_bytes, problem_from_bytes, problem_to_bytes, save_output,
    save_problem, stored_problem_kind, PROBLEM_KEY,
};
pub use quantize::{quantize_file, QuantizeSummary, QUANTIZED_KEY};
pub use weights::{
    load_compressed_tensors_weight, load_modelopt_weight, load_weight, weight_from_bytes, WeightConvention,
};
