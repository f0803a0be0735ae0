//! kernels/gemm_small.cu: the one-launch GEMM of small problems, its sizes and its parameters.

use super::module::KernelModule;
use crate::backend::cuda::runtime::kernel_struct;

/// The small-GEMM kernel.
pub static SMALL: KernelModule = KernelModule {
    file: "gemm_small.cu",
    source: include_str!("../../../../kernels/gemm_small.cu"),
    symbols: &[SMALL_SYMBOL],
};

/// Its one kernel.
pub const SMALL_SYMBOL: &str = "gemm_nvfp4_small";

/// Warps per CTA, each a share of K.
pub const WARPS: usize = 4;
/// Threads per CTA.
pub const THREADS: u32 = 32 * WARPS as u32;
/// n8 tiles per CTA: the CTA's output tile is [`TILE_M`] x 8 * NT.
pub const NT: usize = 4;
/// Output rows (of A) per CTA: one m16 tile.
pub const TILE_M: usize = 16;
/// Output columns (rows of B) per CTA.
pub const TILE_N: usize = 8 * NT;
/// K elements per chunk (one mma.sync fragment row of four scale blocks per quad lane).
pub const CHUNK_K: usize = 64;

/// The `namespace small` part of generated.cuh: the sizes above.
pub fn cuda_sizes() -> String {
    format!(
        "namespace small {{\nconstexpr int THREADS = {THREADS};\nconstexpr int WARPS = {WARPS};\nconstexpr int NT = {NT};\n}}  \
         // namespace small\n"
    )
}

kernel_struct! {
    /// The small GEMM's parameters: one problem, by value.
    pub(crate) struct SmallParams {
        /// [L, M, K/2]
        a: u64 => "const u8*",
        /// scales of a, plain or blocked
        sfa: u64 => "const u8*",
        /// [L, N, K/2]
        b: u64 => "const u8*",
        sfb: u64 => "const u8*",
        /// [L, M, N] f16 or bf16 (out_bf16)
        c: u64 => "u16*",
        /// alpha * both global scales * 2^14 (the two biased decodes' 2^-7 each)
        alpha: f64 => "double",
        m: i32 => "i32",
        n: i32 => "i32",
        k: i32 => "i32",
        l: i32 => "i32",
        /// bit 0: sfa blocked, bit 1: sfb blocked
        layouts: i32 => "i32",
        /// 1: c is bf16, 0: f16
        out_bf16: i32 => "i32",
    }
}
