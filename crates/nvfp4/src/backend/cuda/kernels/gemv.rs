//! kernels/gemv.cu: the batched GEMV and its parameter struct.

use super::module::KernelModule;
use crate::backend::cuda::runtime::kernel_struct;

/// The batched GEMV kernels: scale layout x 16- or 8-byte chunks of A per lane.
pub static GEMV: KernelModule = KernelModule {
    file: "gemv.cu",
    source: include_str!("../../../../kernels/gemv.cu"),
    symbols: &[
        "gemv_nvfp4_sm90_plain",
        "gemv_nvfp4_sm90_blocked",
        "gemv_nvfp4_sm90_plain_k16",
        "gemv_nvfp4_sm90_blocked_k16",
        "gemv_nvfp4_sm90_plain_bf16",
        "gemv_nvfp4_sm90_blocked_bf16",
        "gemv_nvfp4_sm90_plain_k16_bf16",
        "gemv_nvfp4_sm90_blocked_k16_bf16",
    ],
};

kernel_struct! {
    /// The GEMV kernels' parameters.
    pub(crate) struct GemvParams {
        /// [L, M, K/2] packed e2m1
        a: u64 => "const u8*",
        /// [L, M, K/16] e4m3 (plain) or [L, R, C, 512] (blocked)
        sfa: u64 => "const u8*",
        /// [L, 1, K/2]
        b: u64 => "const u8*",
        /// [L, 1, K/16] or [L, 1, C, 512]
        sfb: u64 => "const u8*",
        /// [L, M] f16, or bf16 in the `_bf16` kernels
        c: u64 => "u16*",
        /// [split, L, M] f32, split-K partial sums
        partial: u64 => "float*",
        /// [L, row_ctas], zero between launches
        counters: u64 => "u32*",
        /// applied in f64 before the single rounding to the output type
        alpha: f64 => "double",
        m: i32 => "i32",
        k: i32 => "i32",
        l: i32 => "i32",
        /// row tiles per batch (4 per 128 rows)
        row_ctas: i32 => "i32",
        /// K slices
        split: i32 => "i32",
        /// K-steps (32 chunks) per slice
        ksteps_per_slice: i32 => "i32",
        /// K-steps of B held in shared memory at a time
        window_ksteps: i32 => "i32",
        /// row_ctas * l * split
        tiles: i32 => "i32",
        tiles_per_cta: i32 => "i32",
        reserved: i32 => "i32",
    }
}
