//! kernels/quantize.cu: the GPU quantizer (amax pass and quantize pass) and its parameter struct.

use super::module::KernelModule;
use crate::backend::cuda::runtime::kernel_struct;

/// The quantizer kernels: an amax, a quantize and a dequantizing kernel per input type.
pub static QUANTIZE: KernelModule = KernelModule {
    file: "quantize.cu",
    source: include_str!("../../../../kernels/quantize.cu"),
    symbols: &[
        "quantize_amax_f32",
        "quantize_amax_f16",
        "quantize_amax_bf16",
        "quantize_nvfp4_f32",
        "quantize_nvfp4_f16",
        "quantize_nvfp4_bf16",
        "quantize_dequant_f32",
        "quantize_dequant_f16",
        "quantize_dequant_bf16",
    ],
};

/// Threads per CTA of both quantizer kernels; in the quantize pass also the 16-blocks of a tile
/// (one per thread).
pub const THREADS: u32 = 256;
/// 16-blocks per thread and loop step in the amax pass.
pub const AMAX_UNROLL: usize = 4;
/// Threads per 16-block in the dequantizing pass (four elements each; the kernel's amax takes two
/// shuffles, so it is 4).
pub const DEQUANT_THREADS_PER_BLOCK: usize = 4;

/// The `namespace quant` part of generated.cuh: the sizes above.
pub fn cuda_sizes() -> String {
    format!(
        "namespace quant {{\nconstexpr int THREADS = {THREADS};\nconstexpr int AMAX_UNROLL = {AMAX_UNROLL};\n\
         constexpr int DEQUANT_THREADS_PER_BLOCK = {DEQUANT_THREADS_PER_BLOCK};\n}}  // namespace quant\n"
    )
}

kernel_struct! {
    /// The quantizer kernels' parameters.
    pub(crate) struct QuantizeParams {
        /// [L, rows, K] f32, f16 or bf16, 16-byte aligned
        x: u64 => "const void*",
        /// [L, rows, K/2] packed e2m1
        values: u64 => "u8*",
        /// [L, rows, K/16] e4m3 (plain) or [L, R, C, 512] (blocked, padding zeroed before)
        scales: u64 => "u8*",
        /// the dequantizing kernels' output: [L, rows, K] bf16 (f16 for f16 input), 16-byte
        /// aligned (the quantize kernels write `values` and `scales` instead)
        dequant: u64 => "void*",
        /// the global scale used, one f32
        global_out: u64 => "float*",
        /// global_mode 2: the global scale, one f32 on the device
        global_in: u64 => "const float*",
        /// global_mode 0: the amax as u32 bits, zeroed before the amax pass
        amax: u64 => "u32*",
        /// the smallest 4 * index + kind (0 NaN, 1 +inf, 2 -inf) of an element that is not
        /// finite, atomicMin'd (set to all ones before the launch, and read after it, only by
        /// the host's check)
        first_bad: u64 => "u64*",
        /// 16-blocks: L * rows * K / 16
        blocks: i64 => "i64",
        /// rows per batch
        rows: i64 => "i64",
        /// K / 16
        sf_cols: i64 => "i64",
        /// 0: from the amax, 1: global_value, 2: *global_in
        global_mode: i32 => "i32",
        /// global_mode 1: the global scale
        global_value: f32 => "float",
        /// 1: blocked scale layout
        blocked: i32 => "i32",
        /// 1: the quantize pass takes its tiles from the end of x (after the amax pass, whose
        /// last loads are there and may still be in L2)
        reverse: i32 => "i32",
    }
}
