//! The Hopper tensor-core GEMM (kernels/gemm_sm90.cu): which problems it takes, the
//! configuration heuristic, TMA descriptors, the parameter struct and the launch.
//!
//! The kernel computes `D[w, x] = Σ_k W[w, k]·X[x, k]` with W decoded in registers (wgmma M
//! side, `bm` rows per tile) and X decoded once per launch to an f16 copy by a pre-pass kernel,
//! which the TMA loads as the wgmma's shared-memory operand (N side, `bn` rows per tile). The
//! heuristic picks which GEMM operand is W (the larger one: for small M the weights B run on the
//! M side), the tile variant and how K is shared among CTAs (split-K or stream-K), from a small
//! cost model of the SM (tensor-core cycles, decode issue cycles, waves, split-K fixup). CTA pairs
//! that share X by TMA multicast exist as a forced option. The choice is deterministic and
//! printable; `NVFP4_PRINT_CONFIG=1` prints it per launch.

use std::fmt;

use cudarc::driver::sys as dsys;
use cudarc::driver::{CudaFunction, CudaSlice};

use super::compile::KernelModule;
use super::runtime::{cuda_err, tma_map, Gpu, LaunchOptions, TmaMap};
use crate::format::{Nvfp4Tensor, ScaleLayout};
use crate::ops::{effective_alpha, Gemm};
use crate::{Error, Result};

/// The kernel source and its variants.
pub static GEMM_SM90: KernelModule = KernelModule {
    file: "gemm_sm90.cu",
    source: include_str!("../../../kernels/gemm_sm90.cu"),
    symbols: &[
        "gemm_nvfp4_sm90_ws_m256n16",
        "gemm_nvfp4_sm90_ws_m256n32",
        "gemm_nvfp4_sm90_ws_m256n64",
        "gemm_nvfp4_sm90_ws_m256n128",
        "gemm_nvfp4_sm90_ws_m128n128",
        "gemm_nvfp4_sm90_ws_m128n256",
        X_DECODE_SYMBOL,
    ],
};

/// The pre-pass that decodes X to f16 (kernels/gemm_sm90.cu).
const X_DECODE_SYMBOL: &str = "decode_nvfp4_f16_sm90";
/// Its threads per block (one thread per row and 64-element group).
const X_DECODE_THREADS: u32 = 256;

/// Threads per CTA: a producer warpgroup (a W warp and an X thread issue the TMA) and two consumer
/// warpgroups.
pub const THREADS: u32 = 384;
/// K elements per sub-stage (one wgmma k16 per scale block); the cost model counts these.
pub const BK: usize = 64;
/// Bytes of a W row per TMA stage (256 K elements) and of an X row per sub-stage (64 f16): the
/// 128-byte swizzle width.
const RAW_ROW_BYTES: usize = 128;
/// Dynamic shared memory per block on sm_90, and the kernel's stage limits (`Cfg`).
const SMEM_CAP: usize = 232_448;
const MIN_X_STAGES: usize = 5;
const MAX_RAW_STAGES: usize = 8;
const MAX_X_STAGES: usize = 12;
/// The kernel folds 2^-7 into each decoded operand; the epilogue multiplies 2^14 back.
const DECODE_BIAS: f64 = 16384.0;
/// Most K slices per tile.
const MAX_SPLIT: usize = 16;

/// One compiled variant of the kernel: its tile and pipeline shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// W rows per tile (2 consumer warpgroups x 64 x WM).
    pub bm: usize,
    /// X rows per tile (wgmma N).
    pub bn: usize,
}

/// The variants `gemm_sm90.cu` instantiates, in `GEMM_SM90.symbols` order.
pub const VARIANTS: [Variant; 6] = [
    Variant { bm: 256, bn: 16 },
    Variant { bm: 256, bn: 32 },
    Variant { bm: 256, bn: 64 },
    Variant { bm: 256, bn: 128 },
    Variant { bm: 128, bn: 128 },
    Variant { bm: 128, bn: 256 },
];

impl Variant {
    /// Kernel symbol.
    pub fn symbol(self) -> &'static str {
        let i = VARIANTS.iter().position(|v| *v == self).expect("a listed variant");
        GEMM_SM90.symbols[i]
    }
    /// Bytes of one W stage (256 K elements): values, then scales (16 B per row in every layout).
    fn raw_bytes(self) -> usize {
        self.bm * RAW_ROW_BYTES + self.bm * 16
    }
    /// W stages of 256 K elements, values and scales: what fits next to 5 X stages, at most 8;
    /// mirrors `Cfg::RAW_STAGES`.
    pub fn raw_stages(self) -> usize {
        let fit = (SMEM_CAP - 1024 - 512 - MIN_X_STAGES * self.bn * RAW_ROW_BYTES) / self.raw_bytes();
        fit.min(MAX_RAW_STAGES)
    }
    /// Decoded-X (f16) sub-stages of 64 K elements: what fits next to the W stages, at most 12;
    /// mirrors `Cfg::X_STAGES`.
    pub fn x_stages(self) -> usize {
        let fit = (SMEM_CAP - 1024 - 512 - self.raw_stages() * self.raw_bytes()) / (self.bn * RAW_ROW_BYTES);
        fit.min(MAX_X_STAGES)
    }
    /// Dynamic shared memory in bytes; mirrors `Cfg::SMEM_BYTES` (the kernel traps on a mismatch).
    pub fn smem_bytes(self) -> usize {
        let bars = (2 * self.raw_stages() + 2 * self.x_stages()) * 8 + 8;
        1024 + self.x_stages() * self.bn * RAW_ROW_BYTES + self.raw_stages() * self.raw_bytes() + bars
    }
}

/// How a configuration shares K among CTAs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// Every tile in this many K slices, one work unit each, units dealt round-robin.
    Split(usize),
    /// Stream-K: the grid shares all tiles' k-steps evenly; a tile's pieces are summed by the CTA
    /// that finishes last.
    StreamK,
}

/// A forced choice from `NVFP4_GEMM_SM90` (tuning and tests): `off` sends every GEMM to the
/// general kernel; `m256n64` forces a variant, then optionally `c1` or `c2` the cluster size, and
/// `s3` a split or `sk` stream-K: `m128n128c2sk`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forced {
    /// The wgmma kernel takes no problem.
    Off,
    /// This variant, and this cluster size and schedule if given and legal.
    Config(Variant, Option<usize>, Option<Schedule>),
}

impl Forced {
    /// Parses the variable's value; `None` when it names nothing known.
    pub fn parse(s: &str) -> Option<Self> {
        if s == "off" {
            return Some(Forced::Off);
        }
        let (name, split) = match s.split_once('s') {
            Some((v, "k")) => (v, Some(Schedule::StreamK)),
            Some((v, sp)) => (v, Some(Schedule::Split(sp.parse().ok()?))),
            None => (s, None),
        };
        let (name, cluster) = match name.split_once('c') {
            Some((v, "1")) => (v, Some(1)),
            Some((v, "2")) => (v, Some(2)),
            Some(_) => return None,
            None => (name, None),
        };
        let v = VARIANTS.into_iter().find(|v| format!("m{}n{}", v.bm, v.bn) == name)?;
        Some(Forced::Config(v, cluster, split))
    }

    /// The value of `NVFP4_GEMM_SM90`, if set and valid (read on every call: tests change it).
    pub fn from_env() -> Option<Self> {
        std::env::var("NVFP4_GEMM_SM90").ok().and_then(|s| Self::parse(&s))
    }
}

/// Why the kernel cannot take a problem (the caller falls back to the general kernel).
pub fn rejects(p: &Gemm) -> Option<String> {
    let (m, n, k, l) = p.mnkl();
    if Forced::from_env() == Some(Forced::Off) {
        return Some("disabled by NVFP4_GEMM_SM90=off".into());
    }
    if k % 32 != 0 || k < BK {
        return Some(format!("K = {k}: TMA needs 16-byte row strides (K % 32 == 0) and K >= {BK}"));
    }
    let fits = |x: usize| x <= i32::MAX as usize;
    // The X pre-pass indexes its f16 output ([L, rows, K padded to 64]) with 32-bit offsets.
    if !fits(l * m * n) || !fits(m.max(n) * (k / 2)) || !fits(l * m.max(n) * k.next_multiple_of(BK)) {
        return Some(format!("{m}x{n}x{k}x{l} exceeds 32-bit indexing"));
    }
    None
}

/// The launch configuration of one GEMM shape.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmSm90Config {
    /// Tile variant.
    pub variant: Variant,
    /// (M, N, K, L).
    pub mnkl: (usize, usize, usize, usize),
    /// W = B and X = A (weights on the wgmma M side), else W = A and X = B.
    pub swapped: bool,
    /// Tiles along W and X.
    pub tiles: (usize, usize),
    /// CTAs per cluster: 2 pairs W tiles that share each X sub-stage by TMA multicast.
    pub cluster: usize,
    /// Split-K or stream-K.
    pub schedule: Schedule,
    /// K slices per tile (split-K), or the most pieces of any tile (stream-K): the workspace's
    /// partial tiles per tile.
    pub split: usize,
    /// 64-element stages in K, and per slice (split-K) or per CTA, rounded up (stream-K).
    pub k_iters: usize,
    /// See [`Self::k_iters`].
    pub iters_per_split: usize,
    /// Work units (tile groups x split; stream-K: tile groups) and persistent CTAs; a tile group
    /// is `cluster` W tiles of one X tile and batch.
    pub units: usize,
    /// See [`Self::units`].
    pub grid: usize,
    /// The cost model's estimate, in SM cycles.
    pub est_cycles: f64,
}

impl GemmSm90Config {
    /// W rows and X rows.
    fn wx_rows(&self) -> (usize, usize) {
        let (m, n, _, _) = self.mnkl;
        if self.swapped {
            (n, m)
        } else {
            (m, n)
        }
    }
}

impl fmt::Display for GemmSm90Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (m, n, k, l) = self.mnkl;
        let v = self.variant;
        write!(
            f,
            "{} {m}x{n}x{k}x{l}: W = {}, tile {}x{}x{BK}, stages {}+{}, tiles {}x{}, cluster {}, {} {} ({} of {} \
             k-steps), {} units on {} CTAs x {THREADS}, smem {} B, est {:.1} kcycles",
            v.symbol(),
            if self.swapped { "B (swap AB)" } else { "A" },
            v.bm,
            v.bn,
            v.raw_stages(),
            v.x_stages(),
            self.tiles.0,
            self.tiles.1,
            self.cluster,
            if self.schedule == Schedule::StreamK { "stream-K, pieces <=" } else { "split" },
            self.split,
            self.iters_per_split,
            self.k_iters,
            self.units,
            self.grid,
            v.smem_bytes(),
            self.est_cycles / 1e3
        )
    }
}

// Cost model (SM cycles per 64-K sub-stage), fitted to `dev_gemm_diag timing` on the H100:
// tensor cycles at 2048 f16 FMA per cycle and ~78% of that at best (the m128n256 variant on
// 8192³), or the consumers' issue- and latency-bound time when that is longer: ~950 cycles with
// one m64 tile per warpgroup (it decodes 2 W rows per thread; 0.47 µs at 1.98 GHz), ~2400 with
// two. Split-K partials move at about 48 B per cycle per SM through L2 (each slice writes its
// tile, the last one reads the others).
const FMA_PER_CYCLE: f64 = 2048.0;
const MMA_EFFICIENCY: f64 = 0.78;
const ISSUE_CYCLES_PER_MTILE: [f64; 2] = [950.0, 2400.0];
const UNIT_OVERHEAD_CYCLES: f64 = 2500.0;
const PARTIAL_BYTES_PER_CYCLE: f64 = 48.0;

/// SM cycles per 64-K sub-stage of variant `v`.
fn stage_cycles(v: Variant) -> f64 {
    let mma = (v.bm * v.bn * BK) as f64 / FMA_PER_CYCLE / MMA_EFFICIENCY;
    mma.max(ISSUE_CYCLES_PER_MTILE[v.bm / 128 - 1])
}

/// Summing a tile cut into `pieces` K pieces: every piece's f32 partial through L2.
fn fixup_cycles(v: Variant, pieces: usize) -> f64 {
    if pieces > 1 {
        (pieces * v.bm * v.bn * 4) as f64 / PARTIAL_BYTES_PER_CYCLE
    } else {
        0.0
    }
}

/// Split-K: `units` units of `ips` sub-stages dealt round-robin over `slots` cluster slots.
fn cost_split(v: Variant, units: usize, split: usize, ips: usize, slots: usize) -> f64 {
    let rounds = units.div_ceil(units.min(slots)) as f64;
    rounds * (ips as f64 * stage_cycles(v) + UNIT_OVERHEAD_CYCLES) + fixup_cycles(v, split)
}

/// Stream-K over `slots` cluster slots: the slot with the largest share, its pieces' overheads,
/// and the fixup of the tiles split into `pieces` (at most).
fn cost_stream(v: Variant, groups: usize, k_iters: usize, slots: usize, pieces: usize) -> f64 {
    let share = (groups * k_iters).div_ceil(slots);
    let units_per_slot = share.div_ceil(k_iters) + 1;
    share as f64 * stage_cycles(v) + units_per_slot as f64 * UNIT_OVERHEAD_CYCLES + fixup_cycles(v, pieces)
}

/// Stream-K's slots for `groups` tile groups of `k_iters` stages on `slots` cluster slots (every
/// slot non-empty), and the most pieces any group is cut into (mirrors `stream_owner` of the
/// kernel).
pub fn stream_k_shape(groups: usize, k_iters: usize, slots: usize) -> (usize, usize) {
    let total = groups * k_iters;
    // At least 1/8 of a tile per slot keeps a tile's pieces (partials in the workspace) few.
    let slots = slots.min(total).min(groups * 8);
    let owner = |i: usize| ((i + 1) * slots - 1) / total;
    let pieces = (0..groups).map(|t| owner((t + 1) * k_iters - 1) - owner(t * k_iters) + 1).max().unwrap_or(1);
    (slots, pieces)
}

/// Picks orientation, variant, cluster and schedule for (M, N, K, L) on `sms` SMs. Deterministic.
pub fn choose(m: usize, n: usize, k: usize, l: usize, sms: usize) -> GemmSm90Config {
    choose_with(m, n, k, l, sms, None)
}

/// [`choose`] restricted to a forced variant (and cluster and schedule, when legal).
pub fn choose_with(m: usize, n: usize, k: usize, l: usize, sms: usize, forced: Option<Forced>) -> GemmSm90Config {
    // The larger operand runs on the wgmma M side (decoded once per X tile, in registers); the
    // smaller one is decoded into shared memory once per W tile.
    let swapped = m < n;
    let (w_rows, x_rows) = if swapped { (n, m) } else { (m, n) };
    let k_iters = k.div_ceil(BK);
    let mut best: Option<GemmSm90Config> = None;
    let (only, forced_cluster, forced_schedule) = match forced {
        Some(Forced::Config(v, c, s)) => (Some(v), c, s),
        _ => (None, None, None),
    };
    let mut consider = |c: GemmSm90Config| {
        if best.as_ref().is_none_or(|b| c.est_cycles < b.est_cycles) {
            best = Some(c);
        }
    };
    for v in VARIANTS {
        // Skip X tiles much wider than the X operand (a smaller variant covers it).
        let too_wide = v.bn > 16 && v.bn / 2 >= x_rows.next_multiple_of(16);
        if only.map_or(too_wide, |o| o != v) {
            continue;
        }
        for cluster in [1, 2] {
            let tiles_w = w_rows.div_ceil(v.bm);
            // Pairs need two W tiles, and the X tile's rows split evenly in 8-row swizzle groups.
            // NOTE: pairs only when forced: halving the L2 reads of X measured no faster on the
            // H100 (the bench shapes are not L2-bound); they stay for other GPUs and kernels.
            let paired_ok = tiles_w >= 2 && v.bn % 16 == 0 && forced_cluster == Some(2);
            if forced_cluster.is_some_and(|c| c != cluster) || (cluster > 1 && !paired_ok) {
                continue;
            }
            let tiles_wx = (tiles_w.next_multiple_of(cluster), x_rows.div_ceil(v.bn));
            let groups = tiles_wx.0 / cluster * tiles_wx.1 * l;
            let slots = sms / cluster;
            let config = |schedule, split, iters_per_split, units, slots: usize, est: f64| GemmSm90Config {
                variant: v,
                mnkl: (m, n, k, l),
                swapped,
                tiles: tiles_wx,
                cluster,
                schedule,
                split,
                k_iters,
                iters_per_split,
                units,
                grid: slots * cluster,
                est_cycles: est,
            };
            for split in 1..=MAX_SPLIT.min(k_iters) {
                // Slices start on TMA-stage boundaries (4 sub-stages) when that keeps them all
                // non-empty: a slice starting inside one loads sub-stages it does not use.
                let even = k_iters.div_ceil(split);
                let aligned = even.next_multiple_of(4);
                let ips = if (split - 1) * aligned < k_iters { aligned } else { even };
                // Every slice must be non-empty, and split-K only to fill idle SMs.
                let legal = (split - 1) * ips < k_iters;
                let wanted = match forced_schedule {
                    Some(f) => f == Schedule::Split(split),
                    None => split == 1 || groups * split <= slots,
                };
                if legal && wanted {
                    let units = groups * split;
                    let est = cost_split(v, units, split, ips, slots);
                    consider(config(Schedule::Split(split), split, ips, units, units.min(slots), est));
                }
            }
            // Stream-K for a single partial wave of tile groups (its workspace holds every split
            // tile), unforced only for tiles of at most 128x128: larger ones sum their pieces one
            // quad at a time (registers) and measured slower than split-K.
            let (stream_slots, pieces) = stream_k_shape(groups, k_iters, slots);
            let wanted = forced_schedule.map_or(v.bm * v.bn <= 128 * 128, |f| f == Schedule::StreamK);
            if wanted && groups < slots && pieces > 1 && pieces <= MAX_SPLIT {
                let est = cost_stream(v, groups, k_iters, stream_slots, pieces);
                let ips = (groups * k_iters).div_ceil(stream_slots);
                consider(config(Schedule::StreamK, pieces, ips, groups, stream_slots, est));
            }
        }
    }
    match best {
        Some(b) => b,
        // A forced cluster or schedule that is not legal for this shape: the forced variant's
        // best configuration.
        None => choose_with(m, n, k, l, sms, only.map(|v| Forced::Config(v, None, None))),
    }
}

/// How an operand's scales reach the kernel; mirrors `enum SfMode` of gemm_sm90.cu.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum SfMode {
    /// Plain layout with K % 256 != 0: byte loads by the W producer warp (correct, slower).
    Direct = 0,
    /// Plain layout: a TMA box `[rows, 16 B]` per TMA stage (256 K elements).
    Tma = 1,
    /// Blocked layout: a 2 KB bulk copy per 128 rows per TMA stage.
    Bulk = 2,
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

/// Mirrors `struct GemmSm90Params` of gemm_sm90.cu field for field (512 bytes).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub(crate) struct GemmSm90Params {
    tmap_w: TmaMap,
    tmap_x: TmaMap,
    tmap_sw: TmaMap,
    sf_w: u64,
    c: u64,
    workspace: u64,
    counters: u64,
    alpha: f64,
    alpha_f32: f32,
    alpha_pow2: i32,
    c_stride_w: i64,
    c_stride_x: i64,
    c_stride_l: i64,
    w_rows: i32,
    x_rows: i32,
    k: i32,
    l: i32,
    w_sf_mode: i32,
    tiles_w: i32,
    tiles_x: i32,
    split: i32,
    k_iters: i32,
    iters_per_split: i32,
    units: i32,
    stream_k: i32,
    cluster: i32,
}

const _: () = {
    assert!(std::mem::size_of::<GemmSm90Params>() == 512);
    assert!(std::mem::offset_of!(GemmSm90Params, sf_w) == 384);
    assert!(std::mem::offset_of!(GemmSm90Params, alpha) == 416);
    assert!(std::mem::offset_of!(GemmSm90Params, c_stride_w) == 432);
    assert!(std::mem::offset_of!(GemmSm90Params, w_rows) == 456);
    assert!(std::mem::offset_of!(GemmSm90Params, units) == 496);
    assert!(std::mem::offset_of!(GemmSm90Params, stream_k) == 500);
};

/// Mirrors `struct XDecodeParams` of gemm_sm90.cu (3 pointers, 6 x i32; 48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct XDecodeParams {
    x: u64,
    sf: u64,
    out: u64,
    rows: i32,
    k: i32,
    k64: i32,
    l: i32,
    blocked: i32,
    pad: i32,
}

const _: () = assert!(std::mem::size_of::<XDecodeParams>() == 48);

/// The f32 form of `alpha` when it is ± a power of two that f32 holds as a normal number: then
/// `f32 sum * alpha` is exact and one f32 -> f16 rounding equals the reference's.
fn pow2_f32(alpha: f64) -> Option<f32> {
    let bits = alpha.to_bits();
    let (mantissa, exp) = (bits & ((1 << 52) - 1), ((bits >> 52) & 0x7FF) as i64 - 1023);
    (alpha != 0.0 && mantissa == 0 && (-126..=127).contains(&exp)).then_some(alpha as f32)
}

fn to_i32(x: usize, what: &str) -> Result<i32> {
    i32::try_from(x).map_err(|_| Error::Invalid(format!("{what} = {x} exceeds the kernel's 32-bit indexing")))
}

/// A GEMM with operands on the device, ready to launch repeatedly.
pub(crate) struct GemmSm90Launch {
    pub config: GemmSm90Config,
    func: CudaFunction,
    params: GemmSm90Params,
    x_decode: CudaFunction,
    x_params: XDecodeParams,
    x_blocks: u32,
    // Operands, decoded X, split-K workspace and counters the params point into.
    _buffers: Vec<CudaSlice<u8>>,
    _x16: CudaSlice<u16>,
    _workspace: Option<(CudaSlice<f32>, CudaSlice<u32>)>,
}

impl GemmSm90Launch {
    /// Uploads `p`'s operands and prepares the launch into `c` (`[L, M, N]` f16).
    /// `function` loads a kernel symbol of [`GEMM_SM90`].
    pub fn prepare(
        gpu: &Gpu,
        p: &Gemm,
        c: &CudaSlice<u16>,
        function: impl Fn(&str) -> Result<CudaFunction>,
    ) -> Result<Self> {
        if let Some(why) = rejects(p) {
            return Err(Error::Unsupported { backend: "cuda".into(), what: format!("gemm_sm90: {why}") });
        }
        let (m, n, k, l) = p.mnkl();
        let sms = gpu.info().sms as usize;
        let mut config = choose_with(m, n, k, l, sms, Forced::from_env());
        let v = config.variant;
        let func = function(v.symbol())?;
        let x_decode = function(X_DECODE_SYMBOL)?;
        func.set_attribute(
            dsys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            to_i32(v.smem_bytes(), "shared memory")?,
        )
        .map_err(cuda_err("setting the kernel's shared memory size"))?;
        // The schedule assumes every cluster of the grid runs at once (sms / 2 pairs); where the
        // GPU holds fewer, unpaired CTAs instead.
        if config.cluster > 1 {
            let fit = gpu.max_active_clusters(&func, (THREADS, 1, 1), v.smem_bytes() as u32, config.cluster as u32)?;
            if (fit as usize) * config.cluster < config.grid {
                config = choose_with(m, n, k, l, sms, Some(Forced::Config(v, Some(1), None)));
            }
        }
        let (w, x): (&Nvfp4Tensor, &Nvfp4Tensor) = if config.swapped { (&p.b, &p.a) } else { (&p.a, &p.b) };
        let (w_rows, x_rows) = config.wx_rows();

        let mut buffers = Vec::new();
        let mut up = |bytes: &[u8]| gpu.upload_kept(bytes, &mut buffers);
        let (w_vals, w_sf, x_vals, x_sf) = (up(w.values())?, up(w.scales())?, up(x.values())?, up(x.scales())?);
        // X decoded to f16, K padded to whole 64-element sub-stages.
        let k64 = config.k_iters * BK;
        let x16 = gpu.zeros::<u16>(l * x_rows * k64)?;
        let x_params = XDecodeParams {
            x: x_vals,
            sf: x_sf,
            out: gpu.addr(&x16),
            rows: to_i32(x_rows, "X rows")?,
            k: to_i32(k, "K")?,
            k64: to_i32(k64, "K")?,
            l: to_i32(l, "L")?,
            blocked: i32::from(x.layout() == ScaleLayout::Blocked),
            pad: 0,
        };
        // One pre-pass thread per 16-byte output chunk, 8 per 64-element group.
        let x_blocks =
            to_i32((l * x_rows * config.k_iters * 8).div_ceil(X_DECODE_THREADS as usize), "X decode blocks")?;
        let tiles_total = config.tiles.0 * config.tiles.1 * l;
        let workspace = if config.split > 1 {
            let ws = gpu.zeros::<f32>(tiles_total * config.split * v.bm * v.bn)?;
            let counters = gpu.zeros::<u32>(tiles_total)?;
            Some((ws, counters))
        } else {
            None
        };
        let (ws_addr, cnt_addr) = workspace.as_ref().map_or((0, 0), |(ws, cn)| (gpu.addr(ws), gpu.addr(cn)));
        // C is [L, M, N]: W rows step by N (or 1 when W = B), X rows by 1 (or N).
        let (c_stride_w, c_stride_x) = if config.swapped { (1, n as i64) } else { (n as i64, 1) };
        let w_mode = SfMode::of(w.layout(), k);
        // Plain W scales as [L, rows, K/16] boxes of 16 bytes (4 stages); unused otherwise.
        use dsys::CUtensorMapSwizzle::{CU_TENSOR_MAP_SWIZZLE_128B as SW128, CU_TENSOR_MAP_SWIZZLE_NONE as SW0};
        let tmap_sw = match w_mode {
            SfMode::Tma => tma_map(w_sf, w_rows, k / 16, l, (v.bm, 16), SW0)?,
            _ => TmaMap([0; 16]),
        };
        let alpha = effective_alpha(p.alpha, &p.a, &p.b) as f64 * DECODE_BIAS;
        let params = GemmSm90Params {
            tmap_w: tma_map(w_vals, w_rows, k / 2, l, (v.bm, RAW_ROW_BYTES), SW128)?,
            // In a cluster each CTA loads 1/cluster of the X tile's rows (multicast to all).
            tmap_x: tma_map(gpu.addr(&x16), x_rows, k64 * 2, l, (v.bn / config.cluster, RAW_ROW_BYTES), SW128)?,
            tmap_sw,
            sf_w: w_sf,
            c: gpu.addr(c),
            workspace: ws_addr,
            counters: cnt_addr,
            alpha,
            alpha_f32: pow2_f32(alpha).unwrap_or(0.0),
            alpha_pow2: i32::from(pow2_f32(alpha).is_some()),
            c_stride_w,
            c_stride_x,
            c_stride_l: (m * n) as i64,
            w_rows: to_i32(w_rows, "W rows")?,
            x_rows: to_i32(x_rows, "X rows")?,
            k: to_i32(k, "K")?,
            l: to_i32(l, "L")?,
            w_sf_mode: w_mode as i32,
            tiles_w: to_i32(config.tiles.0, "W tiles")?,
            tiles_x: to_i32(config.tiles.1, "X tiles")?,
            split: to_i32(config.split, "split")?,
            k_iters: to_i32(config.k_iters, "k steps")?,
            iters_per_split: to_i32(config.iters_per_split, "k steps per split")?,
            units: to_i32(config.units, "units")?,
            stream_k: i32::from(config.schedule == Schedule::StreamK),
            cluster: to_i32(config.cluster, "cluster")?,
        };
        Ok(Self {
            config,
            func,
            params,
            x_decode,
            x_params,
            x_blocks: x_blocks as u32,
            _buffers: buffers,
            _x16: x16,
            _workspace: workspace,
        })
    }

    /// Enqueues the X pre-pass and the GEMM.
    pub fn launch(&self, gpu: &Gpu) -> Result<()> {
        let v = self.config.variant;
        gpu.launch(&self.x_decode, (self.x_blocks, 1, 1), (X_DECODE_THREADS, 1, 1), 0, &self.x_params)?;
        // The GEMM starts while the pre-pass runs (barrier setup, first W loads) and waits for
        // it before its first X load.
        let options = LaunchOptions { dependent: true, cluster_x: self.config.cluster as u32 };
        gpu.launch_with(
            &self.func,
            (self.config.grid as u32, 1, 1),
            (THREADS, 1, 1),
            v.smem_bytes() as u32,
            &self.params,
            options,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smem_fits_and_symbols_line_up() {
        for v in VARIANTS {
            assert!(v.smem_bytes() <= 232_448, "{v:?}: {}", v.smem_bytes());
            assert_eq!(v.symbol(), format!("gemm_nvfp4_sm90_ws_m{}n{}", v.bm, v.bn));
        }
        // Mirrors Cfg<2, 128>: 4 W stages of 36 KB next to 5 X stages of 16 KB.
        let v = Variant { bm: 256, bn: 128 };
        assert_eq!((v.raw_stages(), v.x_stages()), (4, 5));
        assert_eq!(v.smem_bytes(), 1024 + 5 * 16384 + 4 * (32768 + 4096) + (8 + 10) * 8 + 8);
    }

    #[test]
    fn heuristic_is_deterministic_and_legal() {
        for &(m, n, k, l) in &[
            (128, 7168, 16384, 1),
            (128, 4096, 7168, 1),
            (128, 7168, 2048, 1),
            (4096, 4096, 4096, 1),
            (8192, 8192, 8192, 1),
            (1, 7, 256, 3),
            (257, 130, 256, 1),
        ] {
            let c = choose(m, n, k, l, 132);
            assert_eq!(c, choose(m, n, k, l, 132));
            assert!(c.grid <= 132 && c.grid >= 1);
            assert!(c.grid.is_multiple_of(c.cluster) && c.tiles.0.is_multiple_of(c.cluster), "{c}");
            let slots = 132 / c.cluster;
            match c.schedule {
                Schedule::Split(split) => {
                    assert_eq!(split, c.split);
                    assert!((c.split - 1) * c.iters_per_split < c.k_iters, "{c}");
                    assert!(c.split == 1 || c.units <= slots, "{c}");
                }
                Schedule::StreamK => {
                    assert!(c.units < slots && c.grid / c.cluster <= c.units * c.k_iters, "{c}")
                }
            }
            let (w, x) = c.wx_rows();
            assert!(w >= x, "{c}");
        }
        // Small M: weights on the wgmma M side, all tokens in one X tile.
        let c = choose(128, 7168, 16384, 1, 132);
        assert!(c.swapped && c.variant.bn == 128, "{c}");
    }

    #[test]
    fn scale_modes_and_pow2_alpha() {
        assert_eq!(SfMode::of(ScaleLayout::Blocked, 96), SfMode::Bulk);
        assert_eq!(SfMode::of(ScaleLayout::Plain, 7168), SfMode::Tma);
        assert_eq!(SfMode::of(ScaleLayout::Plain, 224), SfMode::Direct);
        assert_eq!(pow2_f32(16384.0), Some(16384.0));
        assert_eq!(pow2_f32(8192.0 * 0.5), Some(4096.0));
        assert_eq!(pow2_f32(0.75 * 16384.0), None);
        assert_eq!(pow2_f32(0.0), None);
        assert_eq!(pow2_f32(-2.0), Some(-2.0));
        assert_eq!(pow2_f32(2f64.powi(200)), None);
    }

    #[test]
    fn forced_configs() {
        assert_eq!(Forced::parse("off"), Some(Forced::Off));
        let v = Variant { bm: 256, bn: 64 };
        assert_eq!(Forced::parse("m256n64"), Some(Forced::Config(v, None, None)));
        assert_eq!(Forced::parse("m256n64s3"), Some(Forced::Config(v, None, Some(Schedule::Split(3)))));
        assert_eq!(Forced::parse("m256n64sk"), Some(Forced::Config(v, None, Some(Schedule::StreamK))));
        assert_eq!(Forced::parse("m256n64c2"), Some(Forced::Config(v, Some(2), None)));
        assert_eq!(Forced::parse("m256n64c1s3"), Some(Forced::Config(v, Some(1), Some(Schedule::Split(3)))));
        assert_eq!(Forced::parse("m256n64c2sk"), Some(Forced::Config(v, Some(2), Some(Schedule::StreamK))));
        assert_eq!(Forced::parse("m256n64sx"), None);
        assert_eq!(Forced::parse("m256n64c3"), None);
        assert_eq!(Forced::parse("m100n64"), None);
        let c = choose_with(128, 4096, 7168, 1, 132, Some(Forced::Config(v, Some(1), Some(Schedule::Split(3)))));
        assert_eq!((c.variant, c.cluster, c.schedule, c.split), (v, 1, Schedule::Split(3), 3));
        let c = choose_with(128, 4096, 7168, 1, 132, Some(Forced::Config(v, Some(1), Some(Schedule::StreamK))));
        assert_eq!((c.variant, c.schedule, c.grid), (v, Schedule::StreamK, 132));
        // Pairs: 16 x 2 tiles make 16 groups; stream-K over the 66 pair slots.
        let c = choose_with(128, 4096, 7168, 1, 132, Some(Forced::Config(v, Some(2), Some(Schedule::StreamK))));
        assert_eq!((c.cluster, c.units, c.grid), (2, 16, 132), "{c}");
        // One W tile cannot pair: the variant's best unpaired configuration instead.
        let c = choose_with(128, 200, 256, 1, 132, Some(Forced::Config(v, Some(2), None)));
        assert_eq!((c.variant, c.cluster), (v, 1));
        // Split 16 of 4 k-steps is not legal: the variant's own best split instead.
        let c = choose_with(128, 4096, 256, 1, 132, Some(Forced::Config(v, None, Some(Schedule::Split(16)))));
        assert_eq!(c.variant, v);
        assert!((c.split - 1) * c.iters_per_split < c.k_iters);
    }

    /// The kernel's stream-K walk, replayed on the host: every CTA gets a non-empty share, every
    /// k-step of every tile is covered once, and the piece counts match `stream_k_shape`.
    #[test]
    fn stream_k_shares_cover_every_stage_once() {
        for &(tiles, k_iters, sms) in &[
            (56, 256, 132),
            (32, 112, 132),
            (56, 32, 132),
            (1, 1, 132),
            (3, 5, 132),
            (131, 2, 132),
            (3, 64, 132),
            (9, 3, 132),
        ] {
            let (grid, pieces) = stream_k_shape(tiles, k_iters, sms);
            let total = tiles * k_iters;
            assert_eq!(grid, sms.min(total).min(tiles * 8));
            assert!(pieces <= 10);
            let first = |c: usize| c * total / grid;
            let mut seen = vec![0u32; total];
            let mut per_tile = vec![Vec::new(); tiles];
            for c in 0..grid {
                assert!(first(c) < first(c + 1), "CTA {c} of {grid} has no stage");
                let mut u = first(c);
                while u < first(c + 1) {
                    let t = u / k_iters;
                    let k1 = (t * k_iters + k_iters).min(first(c + 1));
                    (u..k1).for_each(|i| seen[i] += 1);
                    per_tile[t].push(c);
                    u = k1;
                }
            }
            assert!(seen.iter().all(|&x| x == 1));
            let owner = |i: usize| ((i + 1) * grid - 1) / total;
            for (t, ctas) in per_tile.iter().enumerate() {
                let lo = owner(t * k_iters);
                let expect: Vec<usize> = (lo..=owner(t * k_iters + k_iters - 1)).collect();
                assert_eq!(*ctas, expect, "tile {t}");
            }
            assert_eq!(pieces, per_tile.iter().map(Vec::len).max().unwrap());
        }
    }

    #[test]
    fn rejects_unaligned_k() {
        use crate::problem::{generate, Shape};
        let gemm = |k| match generate(&Shape::Gemm { m: 3, n: 5, k, l: 1 }, 1).unwrap() {
            crate::problem::Problem::Gemm(g) => g,
            _ => unreachable!(),
        };
        assert!(rejects(&gemm(48)).is_some());
        assert!(rejects(&gemm(32)).is_some());
        assert!(rejects(&gemm(4112)).is_some());
        assert!(rejects(&gemm(256)).is_none());
    }
}
