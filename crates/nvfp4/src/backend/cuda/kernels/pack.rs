//! kernels/pack_w16.cu: the packed W4A16 weight form built on the device, and its parameters.

use super::module::KernelModule;
use crate::backend::cuda::runtime::kernel_struct;

/// The packing kernel.
pub const PACK_SYMBOL: &str = "pack_w16";
/// Threads per block of the packing kernel (one per lane of a (chunk, block, sub-stage)).
pub const PACK_THREADS: u32 = 256;
/// Threads per packed chunk.
pub const THREADS_PER_CHUNK: usize = 512;

/// The packing module.
pub static PACK: KernelModule = KernelModule {
    file: "pack_w16.cu",
    source: include_str!("../../../../kernels/pack_w16.cu"),
    symbols: &[PACK_SYMBOL],
};

kernel_struct! {
    /// One packing launch: one operand, or a dual GEMM's two of one shape.
    pub(crate) struct PackW16Params {
        /// per operand: [L, rows, K/2] e2m1
        values: [u64; 2] => "const u8*" [2],
        /// per operand: its scales (plain, or blocked when `blocked`)
        scales: [u64; 2] => "const u8*" [2],
        /// [chunks, PACK_CHUNK] the packed form
        out: u64 => "u8*",
        /// chunks to write: L * ceil(packed_rows / 64) * ceil(K / 256)
        chunks: i64 => "i64",
        /// rows of each operand
        rows: i32 => "i32",
        /// packed rows: `rows`, or 16 per 8 rows of a pair
        packed_rows: i32 => "i32",
        k: i32 => "i32",
        /// 1 or 2 operands
        parts: i32 => "i32",
        blocked: i32 => "i32",
        /// bf16 activations (else f16)
        bf16: i32 => "i32",
    }
}
