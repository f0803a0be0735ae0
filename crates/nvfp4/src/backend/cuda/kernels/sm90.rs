//! The Hopper GEMM skeleton's modules (kernels/sm90/, gemm_sm90.cu, dual_gemm_sm90.cu,
//! grouped_gemm_sm90.cu, decode_x_sm90.cu), their parameter structs (the grouped GEMM's are in
//! `grouped`), and every size the host and the kernels share: thread roles and register budgets,
//! the tile variants, and each variant's shared-memory carve-up. `cuda_sizes` writes them into
//! generated.cuh, where sm90/config.cuh reads them.

use std::fmt::Write;

use super::module::KernelModule;
use crate::backend::cuda::runtime::{kernel_struct, TmaMap};
use crate::format::w16_pack::{FRAG_ROT, PACK_CHUNK, PACK_K, PACK_ROWS, PACK_SCALES, PACK_VALUES};
use crate::format::{OutputDtype, PackAct, ScaleLayout};

/// Threads per CTA: a producer warpgroup (a W warp and an X thread issue the TMA) and two
/// consumer warpgroups.
pub const THREADS: u32 = 384;
/// K elements per sub-stage (one wgmma k16 per scale block; 32 bytes of a W row).
pub const BK: usize = 64;
/// Sub-stages per raw (W) stage of 256 K elements.
pub const SUB: usize = 4;
/// Bytes of a W row per raw stage and of an X row per sub-stage: the 128-byte swizzle width.
pub const ROW_BYTES: usize = 128;
/// Blocked scale layout: bytes per (128 rows, 4 scale columns).
pub const SF_CHUNK: usize = 512;
/// Dynamic shared memory per block on sm_90.
pub const SMEM_CAP: usize = 232_448;
/// X ring depth reserved before the W ring takes the rest, and the rings' limits.
pub const MIN_X_STAGES: usize = 5;
/// See [`MIN_X_STAGES`].
pub const MAX_RAW_STAGES: usize = 8;
/// See [`MIN_X_STAGES`].
pub const MAX_X_STAGES: usize = 12;
/// Registers per thread at launch (65536 / THREADS, down to a multiple of 8), and after
/// `setmaxnreg` for the producer warpgroup and the consumers.
pub const LAUNCH_REGS: u32 = 168;
/// See [`LAUNCH_REGS`].
pub const PRODUCER_REGS: u32 = 88;
/// See [`LAUNCH_REGS`].
pub const CONSUMER_REGS: u32 = 208;
/// Threads per block of the X pre-pass (one per 16-byte output chunk).
pub const DECODE_X_THREADS: u32 = 256;
/// Threads of the grouped pre-pass's table builder (its block 0; the decode blocks have as many).
pub const BUILD_THREADS: u32 = DECODE_X_THREADS;
/// Threads of the W4A16 grouped launch's table kernel (a block of its own): the builder's passes
/// over the tile groups are latency-bound, so more threads, fewer passes (a decode-sized MoE
/// launch spent ~8 of its builder's ~10 µs in three passes of 256, H200).
pub const TABLE_THREADS: u32 = 1024;
/// Most groups (or experts) of one grouped launch: the builder's prefix sums live in shared
/// memory.
pub const MAX_SEGMENTS: usize = 1024;
/// `Sm90Schedule::k_mode`: split-K, pieces summed through the workspace.
pub const K_SPLIT: i32 = 0;
/// `Sm90Schedule::k_mode`: stream-K.
pub const K_STREAM: i32 = 1;
/// `Sm90Schedule::k_mode`: split-K, pieces summed in a cluster.
pub const K_CLUSTER: i32 = 2;
/// The kernels fold 2^-7 into each decoded operand; the epilogue multiplies 2^14 back.
pub const DECODE_BIAS: f64 = 16384.0;

/// The operation a skeleton kernel computes: how many operand tensors share a W tile, and what
/// its epilogue does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// GEMM: one W operand, f16 store with alpha.
    Gemm,
    /// Gated dual GEMM: B1 and B2 share each W tile, SwiGLU epilogue.
    Dual,
    /// Grouped GEMM: one W operand per group, f16 store with alpha, the grouped scheduler.
    Grouped,
}

impl Op {
    /// Operand tensors per W tile.
    pub fn parts(self) -> usize {
        match self {
            Op::Gemm | Op::Grouped => 1,
            Op::Dual => 2,
        }
    }
    /// The prefix of its kernel symbols.
    pub fn name(self) -> &'static str {
        match self {
            Op::Gemm => "gemm",
            Op::Dual => "dual_gemm",
            Op::Grouped => "grouped_gemm",
        }
    }
    /// Its module.
    pub fn module(self) -> &'static KernelModule {
        match self {
            Op::Gemm => &GEMM_SM90,
            Op::Dual => &DUAL_SM90,
            Op::Grouped => &GROUPED_SM90,
        }
    }
}

/// What a skeleton kernel's X operand is: NVFP4, decoded to f16 by the pre-pass (W4A4), or a
/// 16-bit activation tensor that the kernel loads as it is (W4A16, SPEC §8), of this type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum XKind {
    /// NVFP4 x NVFP4: the `OP_nvfp4_sm90_ws_*` kernels and the X pre-pass.
    Nvfp4,
    /// A bf16 or f16 activation: the `OP_w4a16{bf16,f16}_sm90_ws_*` kernels, one launch.
    Dense(OutputDtype),
}

impl Op {
    /// The module of its W4A16 kernels for a packed weight (format/w16_pack.rs) and activations
    /// of `act` (a dual GEMM's pair packed as one operand).
    pub fn packed_module(self, act: PackAct) -> Option<&'static KernelModule> {
        match (self, act) {
            (Op::Gemm, PackAct::Bf16) => Some(&GEMM16P_BF16_SM90),
            (Op::Gemm, PackAct::F16) => Some(&GEMM16P_F16_SM90),
            (Op::Grouped, PackAct::Bf16) => Some(&GROUPED16P_BF16_SM90),
            (Op::Grouped, PackAct::F16) => Some(&GROUPED16P_F16_SM90),
            (Op::Dual, PackAct::Bf16) => Some(&DUAL16P_BF16_SM90),
            (Op::Dual, PackAct::F16) => Some(&DUAL16P_F16_SM90),
        }
    }

    /// The module of its kernels for X of kind `x` (W4A16: one per activation type, so that a
    /// call compiles only its type's kernels).
    pub fn module_for(self, x: XKind) -> &'static KernelModule {
        use OutputDtype::{Bf16, F16};
        match (self, x) {
            (_, XKind::Nvfp4) => self.module(),
            (Op::Gemm, XKind::Dense(Bf16)) => &GEMM16_BF16_SM90,
            (Op::Gemm, XKind::Dense(F16)) => &GEMM16_F16_SM90,
            (Op::Dual, XKind::Dense(Bf16)) => &DUAL16_BF16_SM90,
            (Op::Dual, XKind::Dense(F16)) => &DUAL16_F16_SM90,
            (Op::Grouped, XKind::Dense(Bf16)) => &GROUPED16_BF16_SM90,
            (Op::Grouped, XKind::Dense(F16)) => &GROUPED16_F16_SM90,
        }
    }
}

/// The W4A16 kernels that are not instantiated (their symbols exist and trap; no plan picks
/// them): the dual GEMM's m128n256. NOTE: its 128 accumulators per thread and the W4A16 decode
/// left the W tile index, needed once per unit for the blocked scales' row group, spilled (8 B of
/// local memory per thread, once per unit) in every ordering tried.
pub const W16_SKIPPED: [(Op, Variant); 1] = [(Op::Dual, Variant { bm: 128, bn: 256 })];

/// One compiled tile shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    /// W rows per tile (2 consumer warpgroups x 64 x WM; a dual GEMM's tile is BM / 2 output
    /// columns, the matching rows of B1 and B2).
    pub bm: usize,
    /// X rows per tile (wgmma N).
    pub bn: usize,
}

/// Writes the variant list once: `VARIANTS`, and each skeleton module's kernel symbols
/// `OP_nvfp4_sm90_ws_m{BM}n{BN}` (W4A4) and `OP_w4a16{bf16,f16}_sm90_ws_m{BM}n{BN}` (W4A16, one
/// module per activation type) in the same order (the CUDA side stamps its kernels out of the same list:
/// `NVFP4_SM90_VARIANTS` in generated.cuh, written from `VARIANTS` by [`cuda_sizes`]).
macro_rules! variants {
    ($(($bm:literal, $bn:literal)),+ $(,)?) => {
        /// The variants every skeleton module instantiates, in symbol order.
        pub const VARIANTS: [Variant; [$($bm),+].len()] = [$(Variant { bm: $bm, bn: $bn }),+];
        const GEMM_SYMBOLS: [&str; VARIANTS.len()] = [$(concat!("gemm_nvfp4_sm90_ws_m", $bm, "n", $bn)),+];
        const DUAL_SYMBOLS: [&str; VARIANTS.len()] = [$(concat!("dual_gemm_nvfp4_sm90_ws_m", $bm, "n", $bn)),+];
        /// The grouped module also holds its pre-pass, after the variants.
        const GROUPED_SYMBOLS: [&str; VARIANTS.len() + 1] =
            [$(concat!("grouped_gemm_nvfp4_sm90_ws_m", $bm, "n", $bn),)+ PREPARE_SYMBOL];
        const GEMM16_BF16_SYMBOLS: [&str; VARIANTS.len()] = [$(concat!("gemm_w4a16bf16_sm90_ws_m", $bm, "n", $bn)),+];
        const GEMM16_F16_SYMBOLS: [&str; VARIANTS.len()] = [$(concat!("gemm_w4a16f16_sm90_ws_m", $bm, "n", $bn)),+];
        const DUAL16_BF16_SYMBOLS: [&str; VARIANTS.len()] =
            [$(concat!("dual_gemm_w4a16bf16_sm90_ws_m", $bm, "n", $bn)),+];
        const DUAL16_F16_SYMBOLS: [&str; VARIANTS.len()] = [$(concat!("dual_gemm_w4a16f16_sm90_ws_m", $bm, "n", $bn)),+];
        /// The W4A16 grouped modules also hold their table builder, after the variants.
        const GROUPED16_BF16_SYMBOLS: [&str; VARIANTS.len() + 1] =
            [$(concat!("grouped_gemm_w4a16bf16_sm90_ws_m", $bm, "n", $bn),)+ TABLE_SYMBOL];
        const GROUPED16_F16_SYMBOLS: [&str; VARIANTS.len() + 1] =
            [$(concat!("grouped_gemm_w4a16f16_sm90_ws_m", $bm, "n", $bn),)+ TABLE_SYMBOL];
        const DUAL16P_BF16_SYMBOLS: [&str; VARIANTS.len()] =
            [$(concat!("dual_gemm_w4a16bf16p_sm90_ws_m", $bm, "n", $bn)),+];
        const DUAL16P_F16_SYMBOLS: [&str; VARIANTS.len()] = [$(concat!("dual_gemm_w4a16f16p_sm90_ws_m", $bm, "n", $bn)),+];
        const GEMM16P_BF16_SYMBOLS: [&str; VARIANTS.len()] = [$(concat!("gemm_w4a16bf16p_sm90_ws_m", $bm, "n", $bn)),+];
        const GEMM16P_F16_SYMBOLS: [&str; VARIANTS.len()] = [$(concat!("gemm_w4a16f16p_sm90_ws_m", $bm, "n", $bn)),+];
        const GROUPED16P_BF16_SYMBOLS: [&str; VARIANTS.len() + 1] =
            [$(concat!("grouped_gemm_w4a16bf16p_sm90_ws_m", $bm, "n", $bn),)+ TABLE_SYMBOL];
        const GROUPED16P_F16_SYMBOLS: [&str; VARIANTS.len() + 1] =
            [$(concat!("grouped_gemm_w4a16f16p_sm90_ws_m", $bm, "n", $bn),)+ TABLE_SYMBOL];
    };
}

variants![(256, 16), (256, 32), (256, 64), (256, 128), (128, 128), (128, 256)];

/// The shared-memory carve-up of one variant of one operation and X kind (mirrored by
/// `Layout<PARTS, BM, BN, W16>` in generated.cuh, which sm90/config.cuh checks): the X ring from
/// offset 0, the W ring, the barriers; offsets from a 1024-aligned base.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// W stages of 256 K elements, values and scales: what fits next to `MIN_X_STAGES` X stages
    /// in `SMEM_CAP` (`W16_NARROW_SMEM` for the W4A16 kernels of narrow X tiles), at most
    /// `MAX_RAW_STAGES`.
    pub raw_stages: usize,
    /// Decoded-X (f16) sub-stages of 64 K elements: what fits next to the W stages, at most
    /// `MAX_X_STAGES`.
    pub x_stages: usize,
    /// Scale bytes per W stage: 16 per row (plain), or each part's whole 128-row groups of
    /// blocked chunks, whichever is more.
    pub sw_bytes: usize,
    /// Offset of the W ring.
    pub raw_off: usize,
    /// Offset of the barriers.
    pub bar_off: usize,
    /// Dynamic shared memory to launch with (1024 bytes of alignment slack included).
    pub smem_bytes: usize,
}

/// Shared memory the W4A16 kernels of X tiles up to [`W16_NARROW_BN`] rows carve up: two W
/// stages instead of the five that fill the SM. NOTES.md, session 19 (one process per wheel,
/// alternated): on the H100 the dense M = 16 / 32 calls ran 0-17% faster with two (7168 x 16384:
/// 43.7 -> 36.3 µs) and the MoE form's grouped rows 4-8%; on the H200 0-2%. Why fewer stages in
/// flight run faster is not established.
pub const W16_NARROW_SMEM: usize = 114_688;
/// See [`W16_NARROW_SMEM`].
pub const W16_NARROW_BN: usize = 32;

impl Variant {
    /// The carve-up for `op` with X of kind `x`.
    pub fn layout(self, op: Op, x: XKind) -> Layout {
        let parts = op.parts();
        let part_groups = (self.bm / parts).div_ceil(128);
        let sw_bytes = (self.bm * 16).max(parts * part_groups * SUB * SF_CHUNK);
        let raw_bytes = self.bm * ROW_BYTES + sw_bytes;
        let x_bytes = self.bn * ROW_BYTES;
        let cap = if x != XKind::Nvfp4 && self.bn <= W16_NARROW_BN { W16_NARROW_SMEM } else { SMEM_CAP };
        let room = cap - 1024 - 512; // alignment slack and barriers
        let raw_stages = ((room - MIN_X_STAGES * x_bytes) / raw_bytes).min(MAX_RAW_STAGES);
        let x_stages = ((room - raw_stages * raw_bytes) / x_bytes).min(MAX_X_STAGES);
        let raw_off = x_stages * x_bytes;
        let bar_off = raw_off + raw_stages * raw_bytes;
        // A full and an empty barrier per stage of each ring, the split-K flag, the fixup barrier,
        // the two barriers of the cluster sum of K pieces.
        let bar_bytes = (2 * raw_stages + 2 * x_stages) * 8 + 32;
        Layout { raw_stages, x_stages, sw_bytes, raw_off, bar_off, smem_bytes: 1024 + bar_off + bar_bytes }
    }

    /// Whether `op` has a kernel of this variant for X of kind `x` (every W4A4 one does).
    pub fn instantiated(self, op: Op, x: XKind) -> bool {
        x == XKind::Nvfp4 || !W16_SKIPPED.contains(&(op, self))
    }

    /// Kernel symbol of this variant of `op` (W4A4).
    pub fn symbol(self, op: Op) -> &'static str {
        self.symbol_for(op, XKind::Nvfp4)
    }

    /// Kernel symbol of this variant of `op` for X of kind `x`.
    pub fn symbol_for(self, op: Op, x: XKind) -> &'static str {
        self.symbol_in(op.module_for(x))
    }
    /// Its kernel's symbol in a skeleton module (every one lists the variants in order).
    pub fn symbol_in(self, module: &'static KernelModule) -> &'static str {
        let i = VARIANTS.iter().position(|v| *v == self).expect("a listed variant");
        module.symbols[i]
    }
}

/// How W's scales reach shared memory; mirrors `SF_*` in generated.cuh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum SfMode {
    /// Plain layout with K % 256 != 0: byte loads by the W producer warp (correct, slower).
    Direct = 0,
    /// Plain layout: a TMA box `[rows, 16 B]` per W stage (256 K elements).
    Tma = 1,
    /// Blocked layout: a 2 KB bulk copy per 128 rows per W stage.
    Bulk = 2,
    /// The packed form of W4A16 (format/w16_pack.rs): one bulk copy per 64-row group per W
    /// stage, values and scales together.
    Packed = 3,
}

impl SfMode {
    /// The mode for a tensor's scale layout and K.
    pub fn of(layout: ScaleLayout, k: usize) -> Self {
        match layout {
            ScaleLayout::Blocked => SfMode::Bulk,
            // The tensor map's row stride (K/16 bytes) must be a multiple of 16.
            ScaleLayout::Plain if (k / 16).is_multiple_of(16) => SfMode::Tma,
            ScaleLayout::Plain => SfMode::Direct,
        }
    }
}

/// The X pre-pass.
pub static DECODE_X: KernelModule = KernelModule {
    file: "decode_x_sm90.cu",
    source: include_str!("../../../../kernels/decode_x_sm90.cu"),
    symbols: &[DECODE_X_SYMBOL],
};

/// The pre-pass kernel.
pub const DECODE_X_SYMBOL: &str = "decode_nvfp4_f16_sm90";

kernel_struct! {
    /// The X pre-pass's parameters.
    pub(crate) struct XDecodeParams {
        /// [L, rows, K/2] packed e2m1
        x: u64 => "const u8*",
        /// [L, rows, K/16] e4m3, plain or blocked (SPEC §2)
        sf: u64 => "const u8*",
        /// [L, rows, K64] f16, K permuted per 64, zero past K
        out: u64 => "u16*",
        rows: i32 => "i32",
        k: i32 => "i32",
        k64: i32 => "i32",
        l: i32 => "i32",
        blocked: i32 => "i32",
        /// a grouped pre-pass: the first block that decodes this operand
        block0: i32 => "i32",
    }
}

/// The GEMM on the skeleton.
pub static GEMM_SM90: KernelModule = KernelModule {
    file: "gemm_sm90.cu",
    source: include_str!("../../../../kernels/gemm_sm90.cu"),
    symbols: &GEMM_SYMBOLS,
};

/// The fused dual GEMM on the skeleton.
pub static DUAL_SM90: KernelModule = KernelModule {
    file: "dual_gemm_sm90.cu",
    source: include_str!("../../../../kernels/dual_gemm_sm90.cu"),
    symbols: &DUAL_SYMBOLS,
};

/// The grouped GEMM on the skeleton: its pre-pass (every group's X decoded, the work table built)
/// and the main kernel's variants; the structs they take are in `super::grouped`.
pub static GROUPED_SM90: KernelModule = KernelModule {
    file: "grouped_gemm_sm90.cu",
    source: include_str!("../../../../kernels/grouped_gemm_sm90.cu"),
    symbols: &GROUPED_SYMBOLS,
};

/// The grouped pre-pass kernel.
pub const PREPARE_SYMBOL: &str = "grouped_prepare_sm90";

/// Declares one W4A16 skeleton module per (operation, activation type).
macro_rules! module16 {
    ($($(#[$doc:meta])* $name:ident = $file:literal, $symbols:ident;)+) => {$(
        $(#[$doc])*
        pub static $name: KernelModule = KernelModule {
            file: $file,
            source: include_str!(concat!("../../../../kernels/", $file)),
            symbols: &$symbols,
        };
    )+};
}

module16! {
    /// The W4A16 GEMM on the skeleton, bf16 activations (X = the activation, W = the weights).
    GEMM16_BF16_SM90 = "gemm_w4a16bf16_sm90.cu", GEMM16_BF16_SYMBOLS;
    /// The W4A16 GEMM on the skeleton, f16 activations.
    GEMM16_F16_SM90 = "gemm_w4a16f16_sm90.cu", GEMM16_F16_SYMBOLS;
    /// The fused W4A16 dual GEMM on the skeleton, bf16 activations.
    DUAL16_BF16_SM90 = "dual_gemm_w4a16bf16_sm90.cu", DUAL16_BF16_SYMBOLS;
    /// The fused W4A16 dual GEMM on the skeleton, f16 activations.
    DUAL16_F16_SM90 = "dual_gemm_w4a16f16_sm90.cu", DUAL16_F16_SYMBOLS;
    /// The W4A16 grouped GEMM on the skeleton, bf16 activations: its table builder (nothing to
    /// decode: each group's activation is loaded as it is) and the main kernel's variants.
    GROUPED16_BF16_SM90 = "grouped_gemm_w4a16bf16_sm90.cu", GROUPED16_BF16_SYMBOLS;
    /// The W4A16 grouped GEMM on the skeleton, f16 activations.
    GROUPED16_F16_SM90 = "grouped_gemm_w4a16f16_sm90.cu", GROUPED16_F16_SYMBOLS;
    /// The W4A16 GEMM of a packed weight (format/w16_pack.rs), bf16 activations.
    GEMM16P_BF16_SM90 = "gemm_w4a16bf16p_sm90.cu", GEMM16P_BF16_SYMBOLS;
    /// The W4A16 GEMM of a packed weight, f16 activations.
    GEMM16P_F16_SM90 = "gemm_w4a16f16p_sm90.cu", GEMM16P_F16_SYMBOLS;
    /// The fused W4A16 dual GEMM of a packed pair (B1 and B2, rows interleaved by 8), bf16.
    DUAL16P_BF16_SM90 = "dual_gemm_w4a16bf16p_sm90.cu", DUAL16P_BF16_SYMBOLS;
    /// The fused W4A16 dual GEMM of a packed pair, f16 activations.
    DUAL16P_F16_SM90 = "dual_gemm_w4a16f16p_sm90.cu", DUAL16P_F16_SYMBOLS;
    /// The W4A16 grouped GEMM of packed weights, bf16 activations.
    GROUPED16P_BF16_SM90 = "grouped_gemm_w4a16bf16p_sm90.cu", GROUPED16P_BF16_SYMBOLS;
    /// The W4A16 grouped GEMM of packed weights, f16 activations.
    GROUPED16P_F16_SM90 = "grouped_gemm_w4a16f16p_sm90.cu", GROUPED16P_F16_SYMBOLS;
}

/// The W4A16 grouped launch's table builder (one block; takes a `GroupedBuild`).
pub const TABLE_SYMBOL: &str = "grouped_table_sm90";

kernel_struct! {
    /// What the producers and the mainloop read of a problem: the W operand (one tensor, or the two
    /// parts of a dual GEMM's tile) and the decoded X. (The scalars' order: see [`Sm90Problem`].)
    pub(crate) struct Sm90MainloopArgs align(64) {
        /// W values per part: 3-D (K/2 bytes, rows, L) u8, box (128 B, BM / parts, 1), 128-byte swizzle
        tmap_w: [TmaMap; 2] => "TmaMap" [2],
        /// W plain scales per part (SF_TMA): 3-D (K/16 bytes, rows, L), box (16 B, BM / parts, 1)
        tmap_sw: [TmaMap; 2] => "TmaMap" [2],
        /// decoded X: 3-D (2 * K64 bytes, x_rows, L) f16, box (128 B, BN / cluster, 1), 128-byte swizzle
        tmap_x: TmaMap => "TmaMap",
        /// W scales per part: [L, rows, K/16] e4m3 (plain) or [L, R, C, 512] (blocked)
        sf_w: [u64; 2] => "const u8*" [2],
        /// W's batches (the host's; no kernel reads it)
        l: i32 => "i32",
        /// SfMode of W (SF_DIRECT, SF_TMA, SF_BULK)
        w_sf_mode: i32 => "i32",
        /// rows of each W part
        w_rows: i32 => "i32",
        /// X has no batch index (a MoE launch: W's batch is the expert, X holds every expert's
        /// rows, x_base places a tile)
        x_flat: i32 => "i32",
        k: i32 => "i32",
    }
}

kernel_struct! {
    /// What the epilogue reads of a problem: the output, its extent and its scaling. (The
    /// fields' order: see [`Sm90Problem`].)
    pub(crate) struct Sm90EpilogueArgs align(64) {
        /// output, f16 or bf16 (out_bf16)
        c: u64 => "u16*",
        /// per part: the f32 sum is multiplied by this (alpha with the 2^14 decode bias)
        alpha: [f64; 2] => "double" [2],
        /// the same in f32 (exact when alpha_pow2)
        alpha_f32: [f32; 2] => "float" [2],
        /// alpha[0] is a power of two that f32 holds: f32 math is exact
        alpha_pow2: i32 => "i32",
        /// unused (the order's)
        pad: i32 => "i32",
        /// tmap_c is valid (W = B and N % 8 == 0: 16-byte row strides)
        c_tma: i32 => "i32",
        /// c has no batch index (a MoE launch: c holds every expert's rows, as X does)
        c_flat: i32 => "i32",
        /// elements between consecutive W rows (output rows of a part) in c
        c_stride_w: i64 => "i64",
        /// elements between consecutive X rows in c
        c_stride_x: i64 => "i64",
        /// elements between batches in c
        c_stride_l: i64 => "i64",
        /// the output's W rows and X rows: the store clips there (the mainloop's operands hold
        /// the same W rows)
        w_rows: i32 => "i32",
        x_rows: i32 => "i32",
        /// 1: c is bf16, 0: f16
        out_bf16: i32 => "i32",
        /// unused (out_bf16 keeps its 16 bytes, as before these fields: see Sm90Problem's note)
        pad2: [i32; 3] => "i32" [3],
        /// [L] f32 alphas, one per batch of W (the MoE form's experts), on the device, or null:
        /// alpha then. Batch l's factor is (alpha_l[l] * global[0]) * global[1] in f32 (the
        /// reference's order), times DECODE_BIAS (sm90/epilogue.cuh, StoreF16ByBatch)
        alpha_l: u64 => "const float*",
        /// the global scales of A (1 for a 16-bit activation) and B, for alpha_l
        global: [f32; 2] => "float" [2],
        /// output for TMA stores when W rows are contiguous in c: 3-D (2 * N bytes, M, L), box
        /// (128 B, BN, 1), 128-byte swizzle (valid when c_tma)
        tmap_c: TmaMap => "TmaMap",
    }
}

kernel_struct! {
    /// What a work unit computes on, in the two parts that the pipeline's two halves read: the
    /// operands (producers, mainloop) and the output (epilogue). A single-problem launch passes it
    /// in its parameters; a grouped launch keeps one per group in device memory.
    ///
    /// NOTE: each part's scalars keep the 16-byte alignment and the neighbours they had in the one
    /// struct this was split from (hence the epilogue's `pad`, and `l` first), and the epilogue
    /// part's tensor map comes last. NVVM merges adjacent parameter (and global) loads into vector
    /// loads by alignment, and other orders changed the skeleton kernels' code: grouped by
    /// meaning, the scalars made the GEMM m256n16 spill 4 B and reordered m256n64 (NVRTC 13.0);
    /// with the map first, the grouped kernel formed the map's address where the epilogue part's
    /// was taken, not where the store uses it. This order compiles to the instructions of before
    /// the split, but for offsets and one swapped predicate register.
    pub(crate) struct Sm90Problem align(64) {
        main: Sm90MainloopArgs => "Sm90MainloopArgs",
        epi: Sm90EpilogueArgs => "Sm90EpilogueArgs",
    }
}

kernel_struct! {
    /// How a single-problem launch shares its tiles and K among CTAs.
    pub(crate) struct Sm90Schedule {
        /// W tiles (a multiple of cluster) and X tiles
        tiles_w: i32 => "i32",
        tiles_x: i32 => "i32",
        /// split-K: K slices per tile; stream-K: the most pieces of any tile
        split: i32 => "i32",
        /// 64-element k-steps in K, ceil(K / 64)
        k_iters: i32 => "i32",
        /// k-steps per slice (every slice non-empty)
        iters_per_split: i32 => "i32",
        /// split-K: tile groups * split; stream-K: the tile groups
        units: i32 => "i32",
        /// How K is shared (K_SPLIT, K_STREAM, K_CLUSTER): split-K, pieces summed through the
        /// workspace; stream-K (the grid shares all k-steps evenly); split-K with the pieces of a
        /// tile in one cluster of `split` CTAs (one unit each, piece = cluster rank), summed in
        /// the first one's shared memory
        k_mode: i32 => "i32",
        /// CTAs per cluster (1 or 2): a tile group, sharing X by TMA multicast
        cluster: i32 => "i32",
    }
}

kernel_struct! {
    /// What the X pre-pass of a single-problem launch prefetches into L2 before it waits for the
    /// previous launch: the first W raw stage (values, and plain scales loaded by TMA) of every
    /// CTA of the main kernel, i.e. its first unit's tile rows at its first k-step.
    pub(crate) struct WPrefetch {
        /// the main kernel's schedule (no CTA pairs), its grid and W tile rows
        sched: Sm90Schedule => "Sm90Schedule",
        /// W values [L, rows, K/2] (0: prefetch nothing)
        values: u64 => "const u8*",
        /// W plain scales [L, rows, K/16] when the main kernel loads them by TMA, else 0
        scales: u64 => "const u8*",
        rows: i32 => "i32",
        /// K / 2 and K / 16
        row_bytes: i32 => "i32",
        sf_cols: i32 => "i32",
        grid: i32 => "i32",
        bm: i32 => "i32",
    }
}

kernel_struct! {
    /// The parameters of a single-problem launch's X pre-pass.
    pub(crate) struct DecodeXParams {
        x: XDecodeParams => "XDecodeParams",
        w: WPrefetch => "WPrefetch",
    }
}

kernel_struct! {
    /// The parameters of a single-problem skeleton kernel (GEMM, dual GEMM).
    pub(crate) struct Sm90Params align(64) {
        prob: Sm90Problem => "Sm90Problem",
        sched: Sm90Schedule => "Sm90Schedule",
        /// [tiles, split, BM * BN] f32 partials of split tiles (the consumers' register image)
        workspace: u64 => "float*",
        /// [tiles] arrivals per split tile, zero between launches
        counters: u64 => "u32*",
    }
}

/// The `namespace sm90` part of generated.cuh: constants and every variant's `Layout`; then the
/// variant list as an X-macro.
pub fn cuda_sizes() -> String {
    let mut s = String::from("namespace sm90 {\n");
    let consts: [(&str, i64); 25] = [
        ("THREADS", THREADS as i64),
        ("BK", BK as i64),
        ("SUB", SUB as i64),
        ("ROW_BYTES", ROW_BYTES as i64),
        ("SF_CHUNK", SF_CHUNK as i64),
        ("SMEM_CAP", SMEM_CAP as i64),
        ("LAUNCH_REGS", LAUNCH_REGS as i64),
        ("PRODUCER_REGS", PRODUCER_REGS as i64),
        ("CONSUMER_REGS", CONSUMER_REGS as i64),
        ("DECODE_X_THREADS", DECODE_X_THREADS as i64),
        ("SF_DIRECT", SfMode::Direct as i64),
        ("SF_TMA", SfMode::Tma as i64),
        ("SF_BULK", SfMode::Bulk as i64),
        ("SF_PACKED", SfMode::Packed as i64),
        ("PACK_ROWS", PACK_ROWS as i64),
        ("PACK_K", PACK_K as i64),
        ("PACK_VALUES", PACK_VALUES as i64),
        ("PACK_SCALES", PACK_SCALES as i64),
        ("PACK_CHUNK", PACK_CHUNK as i64),
        ("K_SPLIT", K_SPLIT as i64),
        ("K_STREAM", K_STREAM as i64),
        ("K_CLUSTER", K_CLUSTER as i64),
        ("BUILD_THREADS", BUILD_THREADS as i64),
        ("TABLE_THREADS", TABLE_THREADS as i64),
        ("MAX_SEGMENTS", MAX_SEGMENTS as i64),
    ];
    for (name, v) in consts {
        let _ = writeln!(s, "constexpr int {name} = {v};");
    }
    let _ = writeln!(s, "constexpr double DECODE_BIAS = {DECODE_BIAS:?};");
    // The packed form's rotations (format/w16_pack.rs, FRAG_ROT): [act][fragment register][code bit].
    let rows = |t: &[[u32; 4]; 4]| t.map(|r| format!("{{{}, {}, {}, {}}}", r[0], r[1], r[2], r[3])).join(", ");
    let _ =
        writeln!(s, "constexpr int PACK_ROT[2][4][4] = {{{{{}}}, {{{}}}}};", rows(&FRAG_ROT[0]), rows(&FRAG_ROT[1]));
    s += "\n// The shared-memory carve-up of each variant (backend/cuda/kernels/sm90.rs, Variant::layout).\n";
    s += "template <int PARTS, int BM, int BN, bool W16>\nstruct Layout;\n";
    // One carve-up per operand count and X kind (W16: a 16-bit activation): the grouped GEMM's
    // is the GEMM's.
    for (op, x) in
        [Op::Gemm, Op::Dual].into_iter().flat_map(|op| [(op, XKind::Nvfp4), (op, XKind::Dense(OutputDtype::Bf16))])
    {
        for v in VARIANTS {
            let l = v.layout(op, x);
            let _ = writeln!(
                s,
                "template <> struct Layout<{}, {}, {}, {}> {{ static constexpr int RAW_STAGES = {}, X_STAGES = {}, \
                 SW_BYTES = {}, RAW_OFF = {}, BAR_OFF = {}, SMEM_BYTES = {}; }};",
                op.parts(),
                v.bm,
                v.bn,
                x != XKind::Nvfp4,
                l.raw_stages,
                l.x_stages,
                l.sw_bytes,
                l.raw_off,
                l.bar_off,
                l.smem_bytes
            );
        }
    }
    s += "\n// The W4A16 kernels that trap instead of running (backend/cuda/kernels/sm90.rs, W16_SKIPPED).\n";
    for op in [Op::Gemm, Op::Dual, Op::Grouped] {
        let mut cond = String::from("false");
        for (o, v) in W16_SKIPPED {
            if o == op {
                let _ = write!(cond, " || (BM == {} && BN == {})", v.bm, v.bn);
            }
        }
        let _ = writeln!(s, "template <int BM, int BN>\nconstexpr bool W16_SKIP_{} = {cond};", op.name());
    }
    s += "}  // namespace sm90\n\n";
    s += "// The tile variants in symbol order (backend/cuda/kernels/sm90.rs, VARIANTS): each skeleton module\n\
          // expands NVFP4_SM90_VARIANTS(X) once, X(BM, BN) stamping out its kernel of that tile.\n\
          #define NVFP4_SM90_VARIANTS(X)";
    for v in VARIANTS {
        let _ = write!(s, " X({}, {})", v.bm, v.bn);
    }
    s += "\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_fit_and_symbols_line_up() {
        let w16 = XKind::Dense(OutputDtype::Bf16);
        for op in [Op::Gemm, Op::Dual, Op::Grouped] {
            for v in VARIANTS {
                for x in [XKind::Nvfp4, w16] {
                    let l = v.layout(op, x);
                    assert!(l.smem_bytes <= SMEM_CAP, "{op:?} {v:?}: {l:?}");
                    assert!(l.raw_stages >= 2 && l.x_stages >= 3, "{op:?} {v:?}: {l:?}");
                }
                assert_eq!(v.symbol(op), format!("{}_nvfp4_sm90_ws_m{}n{}", op.name(), v.bm, v.bn));
            }
        }
        // The W4A16 kernels of narrow X tiles: two W stages (packed: 36 KB each), the X ring to 12.
        let l = Variant { bm: 256, bn: 16 }.layout(Op::Gemm, w16);
        assert_eq!((l.raw_stages, l.x_stages), (2, 12));
        assert!(l.smem_bytes <= W16_NARROW_SMEM);
        assert_eq!(Variant { bm: 256, bn: 16 }.layout(Op::Gemm, XKind::Nvfp4).raw_stages, 5);
        assert_eq!(
            Variant { bm: 256, bn: 64 }.layout(Op::Gemm, w16),
            Variant { bm: 256, bn: 64 }.layout(Op::Gemm, XKind::Nvfp4)
        );
        assert_eq!(GROUPED_SM90.symbols.last(), Some(&PREPARE_SYMBOL));
        // GEMM m256n128: 4 W stages of 36 KB next to 5 X stages of 16 KB.
        let l = Variant { bm: 256, bn: 128 }.layout(Op::Gemm, XKind::Nvfp4);
        assert_eq!((l.raw_stages, l.x_stages, l.sw_bytes), (4, 5, 4096));
        assert_eq!(l.smem_bytes, 1024 + 5 * 16384 + 4 * (32768 + 4096) + (8 + 10) * 8 + 32);
        // A dual m128 tile holds 64 rows of each part: blocked scales need a whole 128-row group
        // per part, twice the plain layout's 2 KB.
        assert_eq!(Variant { bm: 128, bn: 128 }.layout(Op::Dual, XKind::Nvfp4).sw_bytes, 4096);
        assert_eq!(Variant { bm: 128, bn: 128 }.layout(Op::Gemm, XKind::Nvfp4).sw_bytes, 2048);
        assert_eq!(Variant { bm: 256, bn: 64 }.layout(Op::Dual, XKind::Nvfp4).sw_bytes, 4096);
    }

    #[test]
    fn scale_modes() {
        assert_eq!(SfMode::of(ScaleLayout::Blocked, 96), SfMode::Bulk);
        assert_eq!(SfMode::of(ScaleLayout::Plain, 7168), SfMode::Tma);
        assert_eq!(SfMode::of(ScaleLayout::Plain, 224), SfMode::Direct);
    }

    #[test]
    fn struct_layouts() {
        // Each part is whole 64-byte units (its tensor maps' alignment): the operands, then the
        // output. The scalars' offsets modulo 16 are those of the struct before the split (see
        // Sm90Problem's note): w_sf_mode at 820, w_rows 856, x_flat 828, k 864; c at 784, alpha_pow2
        // 816, c_tma 824, the strides 832, 840, 848, w_rows 856; out_bf16 (at 872, beside k and l)
        // has its 16 bytes to itself.
        assert_eq!(std::mem::size_of::<Sm90MainloopArgs>(), 704);
        assert_eq!(std::mem::size_of::<Sm90EpilogueArgs>(), 256);
        assert_eq!(std::mem::offset_of!(Sm90Problem, epi), 704);
        use std::mem::offset_of;
        let main = [
            (offset_of!(Sm90MainloopArgs, w_sf_mode), 820),
            (offset_of!(Sm90MainloopArgs, w_rows), 856),
            (offset_of!(Sm90MainloopArgs, x_flat), 828),
            (offset_of!(Sm90MainloopArgs, k), 864),
        ];
        let epi = [
            (offset_of!(Sm90EpilogueArgs, c), 784),
            (offset_of!(Sm90EpilogueArgs, alpha_pow2), 816),
            (offset_of!(Sm90EpilogueArgs, c_tma), 824),
            (offset_of!(Sm90EpilogueArgs, c_flat), 828),
            (offset_of!(Sm90EpilogueArgs, c_stride_w), 832),
            (offset_of!(Sm90EpilogueArgs, w_rows), 856),
            (offset_of!(Sm90EpilogueArgs, x_rows), 860),
        ];
        for (now, before) in main.into_iter().chain(epi) {
            assert_eq!(now % 16, before % 16, "{now} {before}");
        }
        assert_eq!((offset_of!(Sm90EpilogueArgs, out_bf16), offset_of!(Sm90EpilogueArgs, tmap_c)), (80, 128));
        // The per-batch alphas come after out_bf16's 16 bytes, in the room before the map.
        assert_eq!((offset_of!(Sm90EpilogueArgs, alpha_l), offset_of!(Sm90EpilogueArgs, global)), (96, 104));
        assert_eq!(std::mem::size_of::<Sm90Problem>(), 960);
        assert_eq!(std::mem::size_of::<Sm90Params>(), 1024);
        // The kernel parameter limit (4 KB on every architecture the kernels build for).
        assert!(std::mem::size_of::<Sm90Params>() <= 4096);
        assert_eq!(std::mem::size_of::<XDecodeParams>(), 48);
        assert_eq!(std::mem::align_of::<Sm90Params>(), 64);
    }
}
