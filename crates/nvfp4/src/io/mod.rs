//! safetensors case files and checkpoint weights.
//!
//! - [`case`]: a problem's operands in the physical layouts of SPEC §2 ([`save_problem`],
//!   [`load_problem`] and in-memory variants); [`output`]: an operation's output ([`save_output`],
//!   [`load_output`]); `names.rs` says which tensor names a reader accepts.
//! - [`case16`], [`output16`]: the same for W4A16 problems (SPEC §8: a BF16 or F16 activation
//!   tensor beside the NVFP4 weights; outputs in either type); [`load_case`] reads a case file
//!   of either mode.
//! - [`atomic`]: every file is written through a temporary file renamed into place when complete
//!   (a character device or a FIFO in place; `destination.rs` says which), and [`check_output`]
//!   refuses an output that cannot be written before any work; [`same_file`] tells when an output
//!   path names the input.
//! - [`weights`]: one NVFP4 linear weight from a ModelOpt or compressed-tensors checkpoint.
//! - [`quantize`]: a dense f32/f16/bf16 file to NVFP4 in the ModelOpt convention.
//!
//! Every malformed input (missing tensor, wrong dtype or shape, truncated or garbage bytes,
//! ambiguous names) is a typed [`Error`](crate::Error) naming the tensor or the file; nothing
//! panics, and no reader allocates more than the file holds.

mod any_case;
mod archive;
pub mod atomic;
pub mod case;
pub mod case16;
mod destination;
mod io_error;
mod names;
pub mod output;
pub mod output16;
pub mod quantize;
pub mod same_file;
pub mod weights;

pub use any_case::{case_from_bytes, load_case, CaseProblem};
pub use atomic::{check_output, write_atomically, write_bytes_atomically};
pub use case::{
    check_file_form, load_problem, problem_from_bytes, problem_to_bytes, save_problem, stored_problem_kind, PROBLEM_KEY,
};
pub use case16::{check_file_form16, load_problem16, problem16_from_bytes, problem16_to_bytes, save_problem16};
pub use output::{load_output, output_from_bytes, output_to_bytes, save_output};
pub use output16::{load_outputs16, outputs16_from_bytes, outputs16_to_bytes, save_outputs16};
pub use quantize::{quantize_file, QuantizeOptions, QuantizeSummary, SkipReason, Skipped, QUANTIZED_KEY};
pub use same_file::{refuse_same_file, same_file};
pub use weights::{
    load_compressed_tensors_weight, load_modelopt_weight, load_weight, weight_from_bytes, WeightConvention,
};
