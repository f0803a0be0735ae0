//! kernels/gemv16.cu: the W4A16 GEMV (16-bit activation row times NVFP4 weights), its kernel
//! symbols and the sizes its host plan shares with it. The tiles, K-steps and
//! chunks are the W4A4 GEMV's (`super::gemv`), so one plan serves both; what differs is the shared
//! memory a window of the activation takes and the staging's load slots. `cuda_sizes` writes them
//! into generated.cuh, where gemv16.cu reads them; its parameter struct is the W4A4 GEMV's
//! (`super::gemv::GemvParams`, read by the skeleton both kernels share).

use super::module::KernelModule;
use crate::format::{OutputDtype, ScaleLayout};

pub use super::gemv::{Chunk, KSTEP_CHUNKS, ROWS_PER_CTA, THREADS};

/// Per-thread load slots of the activation staging (gemv16.cu's `stage_x` issues every 16-byte
/// load of a window before storing any).
pub const STAGE_LOADS_PER_THREAD: usize = 8;
/// Bytes of activation a window may hold: the staging's slots of every thread (32 KiB, so that
/// 2 CTAs per SM fit easily).
pub const MAX_WINDOW_BYTES: usize = THREADS as usize * STAGE_LOADS_PER_THREAD * 16;

/// Shared memory per chunk of an activation window: the 2 * `chunk.bytes()` activations (2 bytes
/// each) that meet the chunk's weights. gemv16.cu's `stage_x` lays them out and checks its
/// `X_BYTES` against this (`WindowChunk` in generated.cuh).
pub fn x_smem_per_chunk(chunk: Chunk) -> usize {
    4 * chunk.bytes()
}

/// The `namespace gemv16` part of generated.cuh.
pub fn cuda_sizes() -> String {
    super::gemv::sizes_namespace(
        "gemv16",
        &[
            ("THREADS", THREADS as usize),
            ("ROWS_PER_CTA", ROWS_PER_CTA),
            ("KSTEP_CHUNKS", KSTEP_CHUNKS),
            ("STAGE_LOADS_PER_THREAD", STAGE_LOADS_PER_THREAD),
            ("COLS_ROW_PAD", COLS_ROW_PAD),
            ("MAX_COLS", MAX_COLS),
            ("MAX_COLS_WINDOW_BYTES", MAX_COLS_WINDOW_BYTES),
            ("MOE_MAX_EXPERTS", MOE_MAX_EXPERTS),
            ("MOE_SMEM_BYTES", MOE_SMEM_BYTES),
        ],
        "an activation window (backend/cuda/kernels/gemv16.rs,\n// x_smem_per_chunk), by bytes of weights per thread per row per K-step",
        x_smem_per_chunk,
    )
}

/// Activation rows the `_cols` kernels take: the 8 columns of one mma.sync n8 tile.
pub const MAX_COLS: usize = 8;

/// Bytes between two activation rows of a `_cols` window beyond a row's size: 64 so that a
/// quarter warp's 16-byte reads of two rows fall in distinct banks (a row's size is a multiple of
/// 128).
pub const COLS_ROW_PAD: usize = 64;
/// Bytes of activation a `_cols` window may hold, padding included (two CTAs per SM fit with
/// their static shared memory).
pub const MAX_COLS_WINDOW_BYTES: usize = 96 * 1024;

/// Experts the `_moe` kernels take: each CTA holds a table of their rows and segments in shared
/// memory (2 x 4 bytes per expert, beside two CTAs' windows).
pub const MOE_MAX_EXPERTS: usize = 512;
/// Dynamic shared memory of a `_moe` kernel: its weight ring (kernels/gemv16_moe.cuh sizes it)
/// and the window of the tokens after it; two CTAs per SM fit with their static shared memory.
pub const MOE_SMEM_BYTES: usize = 100 * 1024;

/// The activation a kernel reads: 16-bit (W4A16), or NVFP4 in the weight's scale layout (the W4A4
/// GEMM of 2 to [`MAX_COLS`] rows, decoded to f16 as it is staged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XType {
    /// f16 or bf16.
    Dense(OutputDtype),
    /// NVFP4 values and scales.
    Nvfp4,
}

/// The kernel of a variant: activation type x scale layout x chunk (16 B when K % 32 == 0, else
/// 8 B) x output type, for one activation row (x staged in shared memory) or `cols` > 1 (the
/// `_cols` kernels: a window of every row, column g of the MMA from row g; an NVFP4 activation
/// has only these).
pub fn symbol(act: XType, layout: ScaleLayout, chunk: Chunk, out: OutputDtype, cols: usize) -> &'static str {
    let index = |d: OutputDtype| usize::from(d == OutputDtype::Bf16);
    let (rows, act) = match act {
        XType::Dense(d) => (usize::from(cols > 1), index(d)),
        XType::Nvfp4 => (2, 0),
    };
    let i = 16 * rows
        + 8 * act
        + 4 * index(out)
        + 2 * usize::from(chunk == Chunk::B8)
        + usize::from(layout == ScaleLayout::Blocked);
    SYMBOLS[i]
}

impl XType {
    /// The output type of an operation on this activation: the output's when it is known, else
    /// the activation's (f16 for an NVFP4 one).
    pub fn out_or(self, given: Option<OutputDtype>) -> OutputDtype {
        given.unwrap_or(match self {
            XType::Dense(d) => d,
            XType::Nvfp4 => OutputDtype::F16,
        })
    }
}

/// The `_moe` kernel of a variant (the MoE form; K % 32 == 0, so 16 B chunks only): activation
/// type x scale layout x output type.
pub fn moe_symbol(act: XType, layout: ScaleLayout, out: OutputDtype) -> &'static str {
    let act = match act {
        XType::Dense(OutputDtype::F16) => 0,
        XType::Dense(OutputDtype::Bf16) => 1,
        XType::Nvfp4 => 2,
    };
    SYMBOLS[40 + 4 * act + 2 * usize::from(out == OutputDtype::Bf16) + usize::from(layout == ScaleLayout::Blocked)]
}

/// In `symbol`'s order: rows (and the NVFP4 activation last), activation, output, chunk, layout
/// (the last varying fastest); then the `_moe` kernels in `moe_symbol`'s order.
const SYMBOLS: [&str; 52] = [
    "gemv16_nvfp4_sm90_f16_plain_to_f16",
    "gemv16_nvfp4_sm90_f16_blocked_to_f16",
    "gemv16_nvfp4_sm90_f16_plain_k16_to_f16",
    "gemv16_nvfp4_sm90_f16_blocked_k16_to_f16",
    "gemv16_nvfp4_sm90_f16_plain_to_bf16",
    "gemv16_nvfp4_sm90_f16_blocked_to_bf16",
    "gemv16_nvfp4_sm90_f16_plain_k16_to_bf16",
    "gemv16_nvfp4_sm90_f16_blocked_k16_to_bf16",
    "gemv16_nvfp4_sm90_bf16_plain_to_f16",
    "gemv16_nvfp4_sm90_bf16_blocked_to_f16",
    "gemv16_nvfp4_sm90_bf16_plain_k16_to_f16",
    "gemv16_nvfp4_sm90_bf16_blocked_k16_to_f16",
    "gemv16_nvfp4_sm90_bf16_plain_to_bf16",
    "gemv16_nvfp4_sm90_bf16_blocked_to_bf16",
    "gemv16_nvfp4_sm90_bf16_plain_k16_to_bf16",
    "gemv16_nvfp4_sm90_bf16_blocked_k16_to_bf16",
    "gemv16_nvfp4_sm90_f16_plain_to_f16_cols",
    "gemv16_nvfp4_sm90_f16_blocked_to_f16_cols",
    "gemv16_nvfp4_sm90_f16_plain_k16_to_f16_cols",
    "gemv16_nvfp4_sm90_f16_blocked_k16_to_f16_cols",
    "gemv16_nvfp4_sm90_f16_plain_to_bf16_cols",
    "gemv16_nvfp4_sm90_f16_blocked_to_bf16_cols",
    "gemv16_nvfp4_sm90_f16_plain_k16_to_bf16_cols",
    "gemv16_nvfp4_sm90_f16_blocked_k16_to_bf16_cols",
    "gemv16_nvfp4_sm90_bf16_plain_to_f16_cols",
    "gemv16_nvfp4_sm90_bf16_blocked_to_f16_cols",
    "gemv16_nvfp4_sm90_bf16_plain_k16_to_f16_cols",
    "gemv16_nvfp4_sm90_bf16_blocked_k16_to_f16_cols",
    "gemv16_nvfp4_sm90_bf16_plain_to_bf16_cols",
    "gemv16_nvfp4_sm90_bf16_blocked_to_bf16_cols",
    "gemv16_nvfp4_sm90_bf16_plain_k16_to_bf16_cols",
    "gemv16_nvfp4_sm90_bf16_blocked_k16_to_bf16_cols",
    "gemv16_nvfp4_sm90_nvfp4_plain_to_f16_cols",
    "gemv16_nvfp4_sm90_nvfp4_blocked_to_f16_cols",
    "gemv16_nvfp4_sm90_nvfp4_plain_k16_to_f16_cols",
    "gemv16_nvfp4_sm90_nvfp4_blocked_k16_to_f16_cols",
    "gemv16_nvfp4_sm90_nvfp4_plain_to_bf16_cols",
    "gemv16_nvfp4_sm90_nvfp4_blocked_to_bf16_cols",
    "gemv16_nvfp4_sm90_nvfp4_plain_k16_to_bf16_cols",
    "gemv16_nvfp4_sm90_nvfp4_blocked_k16_to_bf16_cols",
    "gemv16_nvfp4_sm90_f16_plain_to_f16_moe",
    "gemv16_nvfp4_sm90_f16_blocked_to_f16_moe",
    "gemv16_nvfp4_sm90_f16_plain_to_bf16_moe",
    "gemv16_nvfp4_sm90_f16_blocked_to_bf16_moe",
    "gemv16_nvfp4_sm90_bf16_plain_to_f16_moe",
    "gemv16_nvfp4_sm90_bf16_blocked_to_f16_moe",
    "gemv16_nvfp4_sm90_bf16_plain_to_bf16_moe",
    "gemv16_nvfp4_sm90_bf16_blocked_to_bf16_moe",
    "gemv16_nvfp4_sm90_nvfp4_plain_to_f16_moe",
    "gemv16_nvfp4_sm90_nvfp4_blocked_to_f16_moe",
    "gemv16_nvfp4_sm90_nvfp4_plain_to_bf16_moe",
    "gemv16_nvfp4_sm90_nvfp4_blocked_to_bf16_moe",
];

/// The W4A16 GEMV kernels.
pub static GEMV16: KernelModule =
    KernelModule { file: "gemv16.cu", source: include_str!("../../../../kernels/gemv16.cu"), symbols: &SYMBOLS };

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_symbols_agree() {
        assert_eq!((x_smem_per_chunk(Chunk::B16), x_smem_per_chunk(Chunk::B8)), (64, 32));
        assert_eq!(MAX_WINDOW_BYTES, 32 * 1024);
        let h = cuda_sizes();
        assert!(h.contains("constexpr int STAGE_LOADS_PER_THREAD = 8;\n"), "{h}");
        assert!(h.contains("constexpr int COLS_ROW_PAD = 64;\n"), "{h}");
        assert!(h.contains("template <> struct WindowChunk<16> { static constexpr int BYTES = 64; };"), "{h}");
        let (f, b) = (OutputDtype::F16, OutputDtype::Bf16);
        let (xf, xb) = (XType::Dense(f), XType::Dense(b));
        assert_eq!(symbol(xf, ScaleLayout::Plain, Chunk::B16, f, 1), "gemv16_nvfp4_sm90_f16_plain_to_f16");
        assert_eq!(symbol(xb, ScaleLayout::Blocked, Chunk::B8, f, 1), "gemv16_nvfp4_sm90_bf16_blocked_k16_to_f16");
        assert_eq!(symbol(xf, ScaleLayout::Blocked, Chunk::B16, b, 1), "gemv16_nvfp4_sm90_f16_blocked_to_bf16");
        assert_eq!(symbol(xb, ScaleLayout::Plain, Chunk::B8, b, 1), "gemv16_nvfp4_sm90_bf16_plain_k16_to_bf16");
        assert_eq!(symbol(xb, ScaleLayout::Plain, Chunk::B16, f, 8), "gemv16_nvfp4_sm90_bf16_plain_to_f16_cols");
        let x4 = XType::Nvfp4;
        assert_eq!(
            symbol(x4, ScaleLayout::Blocked, Chunk::B8, b, 2),
            "gemv16_nvfp4_sm90_nvfp4_blocked_k16_to_bf16_cols"
        );
        // Every variant has its own kernel.
        let mut all = Vec::new();
        for out in [f, b] {
            for chunk in Chunk::ALL {
                for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
                    for act in [xf, xb] {
                        for cols in [1, MAX_COLS] {
                            all.push(symbol(act, layout, chunk, out, cols));
                        }
                    }
                    all.push(symbol(x4, layout, chunk, out, MAX_COLS));
                }
            }
        }
        for out in [f, b] {
            for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
                for act in [xf, xb, x4] {
                    let moe = moe_symbol(act, layout, out);
                    let to = if out == b { "_to_bf16_moe" } else { "_to_f16_moe" };
                    assert!(moe.ends_with(to), "{moe}");
                    all.push(moe);
                }
            }
        }
        assert_eq!(moe_symbol(xb, ScaleLayout::Blocked, f), "gemv16_nvfp4_sm90_bf16_blocked_to_f16_moe");
        assert_eq!(moe_symbol(x4, ScaleLayout::Plain, b), "gemv16_nvfp4_sm90_nvfp4_plain_to_bf16_moe");
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), SYMBOLS.len());
    }
}
