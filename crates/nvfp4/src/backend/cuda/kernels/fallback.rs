//! kernels/gemm_fallback.cu and gemm_fallback_w4a16.cu: the `mma.sync` fallback for GEMM, dual
//! GEMM and grouped GEMM (W4A4, and W4A16 of either activation type), its per-problem descriptor
//! and its parameter struct.

use super::module::KernelModule;
use crate::backend::cuda::runtime::kernel_struct;

/// The fallback kernels.
pub static FALLBACK: KernelModule = KernelModule {
    file: "gemm_fallback.cu",
    source: include_str!("../../../../kernels/gemm_fallback.cu"),
    symbols: &[GEMM_SYMBOL, DUAL_SYMBOL],
};

/// GEMM and grouped GEMM.
pub const GEMM_SYMBOL: &str = "gemm_nvfp4_sm90_mma";
/// Gated dual GEMM.
pub const DUAL_SYMBOL: &str = "dual_gemm_nvfp4_sm90_mma";

/// The W4A16 fallback kernels, both activation types.
pub static FALLBACK16: KernelModule = KernelModule {
    file: "gemm_fallback_w4a16.cu",
    source: include_str!("../../../../kernels/gemm_fallback_w4a16.cu"),
    symbols: &[
        FALLBACK16_BF16.gemm,
        FALLBACK16_BF16.dual,
        FALLBACK16_BF16.moe,
        FALLBACK16_F16.gemm,
        FALLBACK16_F16.dual,
        FALLBACK16_F16.moe,
    ],
};

/// The W4A16 fallback kernels of one activation type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Symbols16 {
    /// GEMM and the grouped GEMM's list.
    pub gemm: &'static str,
    /// Gated dual GEMM.
    pub dual: &'static str,
    /// The grouped GEMM's MoE form (offsets read on the device).
    pub moe: &'static str,
}

/// bf16 activations.
pub const FALLBACK16_BF16: Symbols16 = Symbols16 {
    gemm: "gemm_w4a16bf16_sm90_mma",
    dual: "dual_gemm_w4a16bf16_sm90_mma",
    moe: "grouped_gemm_w4a16bf16_sm90_mma",
};
/// f16 activations.
pub const FALLBACK16_F16: Symbols16 = Symbols16 {
    gemm: "gemm_w4a16f16_sm90_mma",
    dual: "dual_gemm_w4a16f16_sm90_mma",
    moe: "grouped_gemm_w4a16f16_sm90_mma",
};

/// Threads per CTA (4 warps, 2 x 2, each a 32 x 32 sub-tile; two threads stage each tile row).
pub const THREADS: u32 = 128;
/// Output tile of one CTA (rows of A x rows of B).
pub const TILE_M: usize = 64;
/// See [`TILE_M`].
pub const TILE_N: usize = 64;
/// K elements per shared-memory stage (four scale blocks).
pub const TILE_K: usize = 64;
/// K-tiles whose raw bytes are in flight in registers ahead of the one being multiplied.
pub const PREFETCH: usize = 4;
/// [`PREFETCH`] with a 16-bit activation (W4A16): its half K-tile row takes 16 registers, an
/// NVFP4 one 6.
pub const PREFETCH16: usize = 2;

/// The `namespace mma` part of generated.cuh: the sizes above.
pub fn cuda_sizes() -> String {
    format!(
        "namespace mma {{\nconstexpr int THREADS = {THREADS};\nconstexpr int BM = {TILE_M};\nconstexpr int BN = {TILE_N};\n\
         constexpr int BK = {TILE_K};\nconstexpr int PF = {PREFETCH};\nconstexpr int PF16 = {PREFETCH16};\n\
         }}  // namespace mma\n"
    )
}

kernel_struct! {
    /// One problem of a fallback launch (an array of them in device memory).
    pub(crate) struct MmaProblem {
        /// [L, M, K/2] NVFP4, or [L, M, K] bf16 or f16 (W4A16)
        a: u64 => "const u8*",
        /// scales of a, plain or blocked (W4A4 only)
        sfa: u64 => "const u8*",
        /// [L, N, K/2]
        b: u64 => "const u8*",
        sfb: u64 => "const u8*",
        /// [L, N, K/2], dual GEMM only
        b2: u64 => "const u8*",
        sfb2: u64 => "const u8*",
        /// [L, M, N] f16 or bf16 (out_bf16)
        c: u64 => "u16*",
        /// applied to A*B (x1 for dual)
        alpha: f64 => "double",
        /// applied to A*B2 (dual only)
        alpha2: f64 => "double",
        m: i32 => "i32",
        n: i32 => "i32",
        k: i32 => "i32",
        l: i32 => "i32",
        /// bit 0: sfa blocked, bit 1: sfb blocked, bit 2: sfb2 blocked
        layouts: i32 => "i32",
        tiles_m: i32 => "i32",
        tiles_n: i32 => "i32",
        /// first CTA of this problem
        tile_start: i32 => "i32",
        /// 1: c is bf16, 0: f16
        out_bf16: i32 => "i32",
        /// the MoE form: E, the experts (b is [E, N, K/2]); else 0
        experts: i32 => "i32",
        /// the MoE form: [E] end rows of each expert's tokens in a; else 0
        offsets: u64 => "const i32*",
        /// the MoE form: [E] f32 alphas, one per expert, on the device, or 0: alpha then. Expert
        /// e's factor is (alphas[e] * global[0]) * global[1] in f32 (the reference's order)
        alphas: u64 => "const float*",
        /// the global scales of a (1 for a 16-bit activation) and b, for alphas
        global: [f32; 2] => "float" [2],
    }
}

kernel_struct! {
    /// The fallback kernels' parameters.
    pub(crate) struct MmaParams {
        /// [count], device memory; unused (0) when count == 1
        problems: u64 => "const MmaProblem*",
        count: i32 => "i32",
        reserved: i32 => "i32",
        /// the problem when count == 1, by value: a small GEMM's CTAs read their operands'
        /// addresses without a dependent load from device memory first
        one: MmaProblem => "MmaProblem",
    }
}
