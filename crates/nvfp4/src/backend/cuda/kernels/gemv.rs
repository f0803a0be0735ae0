//! kernels/gemv.cu: the batched GEMV, its parameter struct, and every size the host's plan
//! (backend/cuda/gemv.rs) and the kernel share: threads, rows per CTA, chunks per K-step, the B
//! staging's load slots and the shared memory of a B window. `cuda_sizes` writes them into
//! generated.cuh, where gemv.cu reads them.

use std::fmt::Write;

use super::module::KernelModule;
use crate::backend::cuda::runtime::kernel_struct;

/// Threads per CTA (8 warps).
pub const THREADS: u32 = 256;
/// Rows per CTA tile: 8 warps x 4 rows. Four tiles cover one 128-row scale tile.
pub const ROWS_PER_CTA: usize = 32;
/// Chunks per K-step: one per lane.
pub const KSTEP_CHUNKS: usize = 32;
/// Shared memory for the decoded B window: at most this many bytes (2 CTAs per SM fit easily).
/// The host's bound alone: the kernel sizes its window from `window_ksteps`.
pub const MAX_WINDOW_BYTES: usize = 36 * 1024;
/// Per-thread load slots of the B staging (gemv.cu's `stage_b` issues every load of a window
/// before decoding any): packed words and scale bytes.
pub const STAGE_WORDS_PER_THREAD: usize = 8;
/// See [`STAGE_WORDS_PER_THREAD`].
pub const STAGE_SCALES_PER_THREAD: usize = 4;
/// Packed words a window may hold: the staging's slots of every thread.
pub const STAGE_WORDS: usize = THREADS as usize * STAGE_WORDS_PER_THREAD;
/// Scale bytes a window may hold.
pub const STAGE_SCALES: usize = THREADS as usize * STAGE_SCALES_PER_THREAD;

/// Bytes of A per lane per K-step: 16 (32 elements) when K % 32 == 0, else 8 (the general path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chunk {
    /// 16 B, 2 scale blocks.
    B16,
    /// 8 B, 1 scale block (K % 32 == 16).
    B8,
}

impl Chunk {
    /// Both, as the kernels instantiate them.
    pub const ALL: [Chunk; 2] = [Chunk::B16, Chunk::B8];

    /// Bytes of packed A per chunk.
    pub fn bytes(self) -> usize {
        match self {
            Chunk::B16 => 16,
            Chunk::B8 => 8,
        }
    }
    /// Shared memory per chunk of a B window: int8 b and -b (2 planes of 16 B per 8 B of A),
    /// plus an f32 scale per block. gemv.cu's `stage_b` lays it out, and checks its
    /// `WINDOW_BYTES_PER_CHUNK` against this (`WindowChunk` in generated.cuh).
    pub fn smem_per_chunk(self) -> usize {
        let (planes, blocks) = (self.bytes() / 8, self.bytes() / 8);
        2 * planes * 16 + blocks * 4
    }
}

/// The `namespace gemv` part of generated.cuh: the sizes above that the kernel reads, and each
/// chunk size's window bytes.
pub fn cuda_sizes() -> String {
    sizes_namespace(
        "gemv",
        &[
            ("THREADS", THREADS as usize),
            ("ROWS_PER_CTA", ROWS_PER_CTA),
            ("KSTEP_CHUNKS", KSTEP_CHUNKS),
            ("STAGE_WORDS_PER_THREAD", STAGE_WORDS_PER_THREAD),
            ("STAGE_SCALES_PER_THREAD", STAGE_SCALES_PER_THREAD),
        ],
        "a B window (backend/cuda/kernels/gemv.rs, Chunk::smem_per_chunk),\n// by bytes of A per lane per K-step",
        Chunk::smem_per_chunk,
    )
}

/// A GEMV family's namespace of generated.cuh: its `consts`, and `WindowChunk<CB>::BYTES`, the
/// shared memory per chunk of `window` (a comment) for each chunk size.
pub(super) fn sizes_namespace(
    name: &str,
    consts: &[(&str, usize)],
    window: &str,
    per_chunk: fn(Chunk) -> usize,
) -> String {
    let mut s = format!("namespace {name} {{\n");
    for (name, v) in consts {
        let _ = writeln!(s, "constexpr int {name} = {v};");
    }
    let _ = writeln!(s, "// Shared memory per chunk of {window}.\ntemplate <int CB>\nstruct WindowChunk;");
    for c in Chunk::ALL {
        let _ = writeln!(
            s,
            "template <> struct WindowChunk<{}> {{ static constexpr int BYTES = {}; }};",
            c.bytes(),
            per_chunk(c)
        );
    }
    let _ = writeln!(s, "}}  // namespace {name}");
    s
}

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
    /// The parameters of both GEMV kernels (gemv.cu, W4A4; gemv16.cu, W4A16): their skeleton
    /// (gemv_tiles.cuh) reads the output, the workspace and the tiling from the same fields.
    pub(crate) struct GemvParams {
        /// [L, M, K/2] packed e2m1: the NVFP4 matrix (W4A16: the weight)
        a: u64 => "const u8*",
        /// [L, M, K/16] e4m3 (plain) or [L, R, C, 512] (blocked)
        sfa: u64 => "const u8*",
        /// [L, 1, K/2] NVFP4; W4A16: [L, 1, K] f16 or bf16 (the kernel's activation type), 16-byte
        /// aligned
        b: u64 => "const u8*",
        /// [L, 1, K/16] or [L, 1, C, 512]; W4A16: unused (0)
        sfb: u64 => "const u8*",
        /// [L, cols, M] f16, or bf16 in the `_bf16` / `_to_bf16` kernels
        c: u64 => "u16*",
        /// [split, L, cols, M] f32, split-K partial sums
        partial: u64 => "float*",
        /// [L, row_ctas], zero between launches
        counters: u64 => "u32*",
        /// applied in f64 before the single rounding to the output type
        alpha: f64 => "double",
        /// rows of the matrix (W4A16: N)
        m: i32 => "i32",
        k: i32 => "i32",
        l: i32 => "i32",
        /// row tiles per batch (4 per 128 rows)
        row_ctas: i32 => "i32",
        /// K slices
        split: i32 => "i32",
        /// K-steps (32 chunks) per slice
        ksteps_per_slice: i32 => "i32",
        /// K-steps of the vector held in shared memory at a time
        window_ksteps: i32 => "i32",
        /// row_ctas * l * split
        tiles: i32 => "i32",
        tiles_per_cta: i32 => "i32",
        /// activation rows per batch: 1, 2..=8 in gemv16.cu's `_cols` kernels (the output's
        /// columns; b is [L, cols, K]), or the tokens T in its `_moe` kernels (b is [1, T, K])
        cols: i32 => "i32",
        /// the `_moe` kernels: [L] end rows of each expert's tokens (L = the experts); else 0
        offsets: u64 => "const i32*",
        /// the `_moe` kernels: [L] f32 per-expert alphas, or 0 (alpha applies)
        alpha_l: u64 => "const u32*",
        /// the `_moe` kernels with alpha_l: the global scales of the tokens and the weights
        global: [f32; 2] => "float" [2],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_agree() {
        assert_eq!(ROWS_PER_CTA * 4, 128, "four row tiles per 128-row scale tile");
        assert_eq!(KSTEP_CHUNKS, 32, "one chunk per lane");
        assert_eq!((Chunk::B16.smem_per_chunk(), Chunk::B8.smem_per_chunk()), (72, 36));
        let h = cuda_sizes();
        assert!(h.contains("constexpr int STAGE_WORDS_PER_THREAD = 8;\n"), "{h}");
        assert!(h.contains("template <> struct WindowChunk<8> { static constexpr int BYTES = 36; };"), "{h}");
    }
}
