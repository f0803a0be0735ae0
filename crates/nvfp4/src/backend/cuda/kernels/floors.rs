//! kernels/floors.cu: the benchmark's floor kernels (an empty kernel, pure streaming reads) and
//! the parameter struct of the reads.

use super::module::KernelModule;
use crate::backend::cuda::runtime::kernel_struct;

/// The empty kernel: what a launch costs with no work (the launch floor).
pub const EMPTY_SYMBOL: &str = "floor_empty_sm90";
/// Grid-strided read, 4 loads of 16 B in flight per thread.
pub const READ_STRIDED4_SYMBOL: &str = "floor_read_strided4_sm90";
/// Grid-strided read, 8 loads in flight per thread.
pub const READ_STRIDED8_SYMBOL: &str = "floor_read_strided8_sm90";
/// One contiguous range per CTA, 8 loads in flight per thread.
pub const READ_CONTIGUOUS8_SYMBOL: &str = "floor_read_contiguous8_sm90";

/// The floor kernels.
pub static FLOORS: KernelModule = KernelModule {
    file: "floors.cu",
    source: include_str!("../../../../kernels/floors.cu"),
    symbols: &[EMPTY_SYMBOL, READ_STRIDED4_SYMBOL, READ_STRIDED8_SYMBOL, READ_CONTIGUOUS8_SYMBOL],
};

kernel_struct! {
    /// A streaming read's parameters.
    pub(crate) struct FloorReadParams {
        /// [words] uint4, 16-byte aligned
        src: u64 => "const void*",
        /// 16-byte words to read
        words: u64 => "u64",
        /// [gridDim.x] u32, one sum per CTA
        out: u64 => "void*",
    }
}
