//! The Hopper tensor-core GEMM (kernels/gemm_sm90.cu): which problems it takes, the
//! configuration heuristic, TMA descriptors, the parameter struct and the launch.
//!
//! The kernel computes `D[w, x] = Σ_k W[w, k]·X[x, k]` with W decoded in registers (wgmma M
//! side, `bm` rows per tile) and X decoded to f16 in shared memory (wgmma N side, `bn` rows per
//! tile). The heuristic picks which GEMM operand is W (the larger one: for small M the weights B
//! run on the M side), the tile variant and the split of K, from a small cost model of the SM
//! (tensor-core cycles, decode issue cycles, waves, split-K fixup). It is deterministic and
//! printable; `NVFP4_PRINT_CONFIG=1` prints it per launch.

use std::fmt;

use cudarc::driver::sys as dsys;
use cudarc::driver::{CudaFunction, CudaSlice};

use super::compile::KernelModule;
use super::runtime::{cuda_err, tma_map, Gpu, TmaMap};
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
    ],
};

/// Threads per CTA: a decoder warpgroup and two consumer warpgroups.
pub const THREADS: u32 = 384;
/// K elements per sub-stage (one wgmma k16 per scale block); the cost model counts these.
pub const BK: usize = 64;
/// Bytes of a row per TMA stage (256 K elements, the 128-byte swizzle width).
const RAW_ROW_BYTES: usize = 128;
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
    /// Raw (TMA) stages of 256 K elements, values and scales; mirrors `Cfg::RAW_STAGES`.
    pub fn raw_stages(self) -> usize {
        if self.bn >= 256 {
            2
        } else {
            3
        }
    }
    /// Decoded-X (f16) sub-stages of 64 K elements; mirrors `Cfg::XF_STAGES`.
    pub fn xf_stages(self) -> usize {
        if self.bn >= 256 || self.bm * self.bn >= 256 * 128 {
            3
        } else {
            5
        }
    }
    /// Dynamic shared memory in bytes; mirrors `Cfg::SMEM_BYTES` (the kernel traps on a mismatch).
    pub fn smem_bytes(self) -> usize {
        // A raw stage: 128 B per row of W and X values, then their scales (plain: a [rows, 16 B]
        // box; blocked: 4 x 512 B per 128 rows, the same room for W, at least one group for X).
        let raw = (self.bm + self.bn) * RAW_ROW_BYTES + self.bm * 16 + (self.bn * 16).max(2048);
        let xf = self.bn * BK * 2;
        let bars = (2 * self.raw_stages() + 2 * self.xf_stages()) * 8 + 8;
        1024 + self.xf_stages() * xf + self.raw_stages() * raw + bars
    }
}

/// A forced choice from `NVFP4_GEMM_SM90` (tuning and tests): `off` sends every GEMM to the
/// general kernel; `m256n64` forces a variant, `m256n64s3` a variant and a split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forced {
    /// The wgmma kernel takes no problem.
    Off,
    /// This variant, and this split if given and legal.
    Config(Variant, Option<usize>),
}

impl Forced {
    /// Parses the variable's value; `None` when it names nothing known.
    pub fn parse(s: &str) -> Option<Self> {
        if s == "off" {
            return Some(Forced::Off);
        }
        let (name, split) = match s.split_once('s') {
            Some((v, sp)) => (v, Some(sp.parse().ok()?)),
            None => (s, None),
        };
        let v = VARIANTS.into_iter().find(|v| format!("m{}n{}", v.bm, v.bn) == name)?;
        Some(Forced::Config(v, split))
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
    if !fits(l * m * n) || !fits(m.max(n) * (k / 2)) || !fits(k) {
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
    /// K slices per tile.
    pub split: usize,
    /// 64-element stages in K, and per slice.
    pub k_iters: usize,
    /// See [`Self::k_iters`].
    pub iters_per_split: usize,
    /// Work units (tiles x L x split) and persistent CTAs.
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
            "{} {m}x{n}x{k}x{l}: W = {}, tile {}x{}x{BK}, stages {}+{}, tiles {}x{}, split {} ({} of {} k-steps), \
             {} units on {} CTAs x {THREADS}, smem {} B, est {:.1} kcycles",
            v.symbol(),
            if self.swapped { "B (swap AB)" } else { "A" },
            v.bm,
            v.bn,
            v.raw_stages(),
            v.xf_stages(),
            self.tiles.0,
            self.tiles.1,
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

// Cost model constants (SM cycles). Tensor peak: 2048 f16 FMA per cycle per SM, at about 85%.
// Decode: per stage each scheduler runs 2 consumer warps (2 * WM rows * 2 words of 8 elements
// per thread) and 1 decoder warp (ceil(BN / 128) rows * 8 words), ~17 instructions per word at
// ~1.5 cycles each (the integer pipe is half rate). Split-K partials move at about 48 B per cycle
// per SM through L2 (each slice writes its tile, the last one reads the others).
const FMA_PER_CYCLE: f64 = 2048.0;
const MMA_EFFICIENCY: f64 = 0.85;
const DECODE_CYCLES_PER_WORD: f64 = 17.0 * 1.5;
const UNIT_OVERHEAD_CYCLES: f64 = 2500.0;
const PARTIAL_BYTES_PER_CYCLE: f64 = 48.0;

fn cost(v: Variant, tiles: usize, split: usize, ips: usize, sms: usize) -> f64 {
    let mma = (v.bm * v.bn * BK) as f64 / FMA_PER_CYCLE / MMA_EFFICIENCY;
    let words = 2 * (v.bm / 128) * 2 * 2 + v.bn.div_ceil(128) * 8;
    let decode = words as f64 * DECODE_CYCLES_PER_WORD;
    let stage = mma.max(decode) + 40.0;
    let units = tiles * split;
    let grid = units.min(sms);
    let rounds = units.div_ceil(grid) as f64;
    let tile_bytes = (v.bm * v.bn * 4) as f64;
    let fixup = if split > 1 { split as f64 * tile_bytes / PARTIAL_BYTES_PER_CYCLE } else { 0.0 };
    rounds * (ips as f64 * stage + UNIT_OVERHEAD_CYCLES) + fixup
}

/// Picks orientation, variant and split for (M, N, K, L) on `sms` SMs. Deterministic.
pub fn choose(m: usize, n: usize, k: usize, l: usize, sms: usize) -> GemmSm90Config {
    choose_with(m, n, k, l, sms, None)
}

/// [`choose`] restricted to a forced variant (and split, when legal).
pub fn choose_with(m: usize, n: usize, k: usize, l: usize, sms: usize, forced: Option<Forced>) -> GemmSm90Config {
    // The larger operand runs on the wgmma M side (decoded once per X tile, in registers); the
    // smaller one is decoded into shared memory once per W tile.
    let swapped = m < n;
    let (w_rows, x_rows) = if swapped { (n, m) } else { (m, n) };
    let k_iters = k.div_ceil(BK);
    let mut best: Option<GemmSm90Config> = None;
    let (only, forced_split) = match forced {
        Some(Forced::Config(v, s)) => (Some(v), s),
        _ => (None, None),
    };
    for v in VARIANTS {
        // Skip X tiles much wider than the X operand (a smaller variant covers it).
        let too_wide = v.bn > 16 && v.bn / 2 >= x_rows.next_multiple_of(16);
        if only.map_or(too_wide, |o| o != v) {
            continue;
        }
        let tiles = w_rows.div_ceil(v.bm) * x_rows.div_ceil(v.bn) * l;
        for split in 1..=MAX_SPLIT.min(k_iters) {
            // Slices start on TMA-stage boundaries (4 sub-stages) when that keeps them all
            // non-empty: a slice starting inside one loads sub-stages it does not use.
            let even = k_iters.div_ceil(split);
            let aligned = even.next_multiple_of(4);
            let ips = if (split - 1) * aligned < k_iters { aligned } else { even };
            // Every slice must be non-empty, and split-K only to fill idle SMs.
            let legal = (split - 1) * ips < k_iters;
            let wanted = match forced_split {
                Some(f) => f == split,
                None => split == 1 || tiles * split <= sms,
            };
            if !legal || !wanted {
                continue;
            }
            let est = cost(v, tiles, split, ips, sms);
            if best.as_ref().is_none_or(|b| est < b.est_cycles) {
                let units = tiles * split;
                best = Some(GemmSm90Config {
                    variant: v,
                    mnkl: (m, n, k, l),
                    swapped,
                    tiles: (w_rows.div_ceil(v.bm), x_rows.div_ceil(v.bn)),
                    split,
                    k_iters,
                    iters_per_split: ips,
                    units,
                    grid: units.min(sms),
                    est_cycles: est,
                });
            }
        }
    }
    match best {
        Some(b) => b,
        // A forced split that is not legal for this shape: the forced variant's best split.
        None => choose_with(m, n, k, l, sms, only.map(|v| Forced::Config(v, None))),
    }
}

/// How an operand's scales reach the kernel; mirrors `enum SfMode` of gemm_sm90.cu.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum SfMode {
    /// Plain layout with K % 256 != 0: global loads in the pipeline (correct, slower).
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

/// Mirrors `struct GemmSm90Params` of gemm_sm90.cu field for field (640 bytes).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub(crate) struct GemmSm90Params {
    tmap_w: TmaMap,
    tmap_x: TmaMap,
    tmap_sw: TmaMap,
    tmap_sx: TmaMap,
    sf_w: u64,
    sf_x: u64,
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
    x_sf_mode: i32,
    tiles_w: i32,
    tiles_x: i32,
    split: i32,
    k_iters: i32,
    iters_per_split: i32,
    units: i32,
}

const _: () = {
    assert!(std::mem::size_of::<GemmSm90Params>() == 640);
    assert!(std::mem::offset_of!(GemmSm90Params, sf_w) == 512);
    assert!(std::mem::offset_of!(GemmSm90Params, alpha) == 552);
    assert!(std::mem::offset_of!(GemmSm90Params, c_stride_w) == 568);
    assert!(std::mem::offset_of!(GemmSm90Params, w_rows) == 592);
    assert!(std::mem::offset_of!(GemmSm90Params, units) == 636);
};

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
    // Operands, split-K workspace and counters the params point into.
    _buffers: Vec<CudaSlice<u8>>,
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
        let config = choose_with(m, n, k, l, gpu.info().sms as usize, Forced::from_env());
        let v = config.variant;
        let func = function(v.symbol())?;
        let (w, x): (&Nvfp4Tensor, &Nvfp4Tensor) = if config.swapped { (&p.b, &p.a) } else { (&p.a, &p.b) };
        let (w_rows, x_rows) = config.wx_rows();

        let mut buffers = Vec::new();
        let mut up = |bytes: &[u8]| gpu.upload_kept(bytes, &mut buffers);
        let (w_vals, w_sf, x_vals, x_sf) = (up(w.values())?, up(w.scales())?, up(x.values())?, up(x.scales())?);
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
        let (w_mode, x_mode) = (SfMode::of(w.layout(), k), SfMode::of(x.layout(), k));
        // Plain scales as [L, rows, K/16] boxes of 16 bytes (4 stages); unused otherwise.
        use dsys::CUtensorMapSwizzle::{CU_TENSOR_MAP_SWIZZLE_128B as SW128, CU_TENSOR_MAP_SWIZZLE_NONE as SW0};
        let scale_map = |mode: SfMode, addr: u64, rows: usize, box_rows: usize| -> Result<TmaMap> {
            match mode {
                SfMode::Tma => tma_map(addr, rows, k / 16, l, (box_rows, 16), SW0),
                _ => Ok(TmaMap([0; 16])),
            }
        };
        let alpha = effective_alpha(p.alpha, &p.a, &p.b) as f64 * DECODE_BIAS;
        let params = GemmSm90Params {
            tmap_w: tma_map(w_vals, w_rows, k / 2, l, (v.bm, RAW_ROW_BYTES), SW128)?,
            tmap_x: tma_map(x_vals, x_rows, k / 2, l, (v.bn, RAW_ROW_BYTES), SW128)?,
            tmap_sw: scale_map(w_mode, w_sf, w_rows, v.bm)?,
            tmap_sx: scale_map(x_mode, x_sf, x_rows, v.bn)?,
            sf_w: w_sf,
            sf_x: x_sf,
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
            x_sf_mode: x_mode as i32,
            tiles_w: to_i32(config.tiles.0, "W tiles")?,
            tiles_x: to_i32(config.tiles.1, "X tiles")?,
            split: to_i32(config.split, "split")?,
            k_iters: to_i32(config.k_iters, "k steps")?,
            iters_per_split: to_i32(config.iters_per_split, "k steps per split")?,
            units: to_i32(config.units, "units")?,
        };
        func.set_attribute(
            dsys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            to_i32(v.smem_bytes(), "shared memory")?,
        )
        .map_err(cuda_err("setting the kernel's shared memory size"))?;
        Ok(Self { config, func, params, _buffers: buffers, _workspace: workspace })
    }

    /// Enqueues the kernel.
    pub fn launch(&self, gpu: &Gpu) -> Result<()> {
        let v = self.config.variant;
        gpu.launch(&self.func, (self.config.grid as u32, 1, 1), (THREADS, 1, 1), v.smem_bytes() as u32, &self.params)
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
        // Mirrors Cfg<2, 128>: 1024 + 3 * 16384 + 3 * (49152 + 4096 + 2048) + (6 + 6) * 8 + 8.
        assert_eq!(Variant { bm: 256, bn: 128 }.smem_bytes(), 1024 + 49152 + 165888 + 104);
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
            assert!((c.split - 1) * c.iters_per_split < c.k_iters, "{c}");
            assert!(c.split == 1 || c.units <= 132, "{c}");
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
        assert_eq!(Forced::parse("m256n64"), Some(Forced::Config(v, None)));
        assert_eq!(Forced::parse("m256n64s3"), Some(Forced::Config(v, Some(3))));
        assert_eq!(Forced::parse("m100n64"), None);
        let c = choose_with(128, 4096, 7168, 1, 132, Some(Forced::Config(v, Some(3))));
        assert_eq!((c.variant, c.split), (v, 3));
        // Split 16 of 4 k-steps is not legal: the variant's own best split instead.
        let c = choose_with(128, 4096, 256, 1, 132, Some(Forced::Config(v, Some(16))));
        assert_eq!(c.variant, v);
        assert!((c.split - 1) * c.iters_per_split < c.k_iters);
    }

    #[test]
    fn rejects_unaligned_k() {
        use crate::problem::{generate, Shape};
        let gemm = |k| match generate(&Shape::Gemm { m: 3, n: 5, k, l: 1 }, 1).unwrap() {
            crate::ops::Problem::Gemm(g) => g,
            _ => unreachable!(),
        };
        assert!(rejects(&gemm(48)).is_some());
        assert!(rejects(&gemm(32)).is_some());
        assert!(rejects(&gemm(4112)).is_some());
        assert!(rejects(&gemm(256)).is_none());
    }
}
