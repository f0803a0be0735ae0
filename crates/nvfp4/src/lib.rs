//! nvfp4: exact NVFP4 matrix kernels (4-bit E2M1 values, an E4M3 scale per 16 elements) for
//! NVIDIA Hopper, with an exact multi-threaded CPU backend that doubles as the reference.
//!
//! Layers: [`format`] (codecs, packing, quantizer, scale layouts, tensors), [`problem`] (shapes,
//! catalogue, generators), [`ops`] (the operation API and the [`Backend`] trait), [`backend`]
//! (cpu, cuda), [`check`] (the SPEC §4 comparison), [`io`] (safetensors files) and [`memory`]
//! (what the host can give, checked before allocating).

// The library runs inside the CLI and inside Python processes: a print that panics when the
// stream is closed (the std macros) would take them down.
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod backend;
pub mod bench;
pub mod check;
mod error;
pub mod format;
pub mod io;
pub mod memory;
pub mod ops;
pub mod problem;

pub use backend::CpuBackend;
pub use error::{Error, Result};
pub use format::{F16Tensor, GlobalScale, Nvfp4Tensor, OutTensor, OutputDtype, ScaleLayout};
pub use ops::{Backend, DualGemm, Gemm, Gemv, GroupedGemm, MoeAlpha, MoeGemm};
pub use problem::{Output, Problem, ProblemKind, Shape};
