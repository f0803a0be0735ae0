//! The batched GEMV: launch configuration heuristic (the plan), bind and launch.
//!
//! The kernel (kernels/gemv.cu) gives each CTA 32 rows of one batch and a slice of K. The
//! heuristic below picks the variant, the split of K and the persistent grid from the shape, the
//! SM count and the kernel's occupancy: deterministic, printable (`NVFP4_PRINT_CONFIG=1`).

use std::fmt;

use cudarc::driver::CudaFunction;

use super::device::{product_alpha, to_i32, DeviceOp, F16View, Nvfp4View, Workspace, WorkspaceNeeds};
use super::family::{nvfp4_act, DeviceFacts, Kernels, Launch, Plan, Verdict};
pub use super::gemv_launch::Form;
use super::gemv_launch::{beyond_i32, takes, GemvLaunch, Operands};
use super::kernels::gemv::{GEMV, KSTEP_CHUNKS, MAX_WINDOW_BYTES, STAGE_SCALES, STAGE_WORDS};
use super::overrides::Overrides;
use super::runtime::Gpu;
use crate::format::{OutputDtype, ScaleLayout};
use crate::ops::{Act, Op, OpMeta};
use crate::{Error, Result};

pub use super::gemv_tiling::Tiling;
// The kernel's sizes and chunk shapes live with it in the registry, which writes them into
// generated.cuh.
pub use super::kernels::gemv::{Chunk, ROWS_PER_CTA, THREADS};

/// The launch configuration of one GEMV shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GemvConfig {
    /// Kernel symbol.
    pub symbol: &'static str,
    /// The operation it serves: the GEMV, or a GEMM of one activation row (the weight is the
    /// kernel's matrix).
    pub form: Form,
    /// Scale layout of both operands.
    pub layout: ScaleLayout,
    /// Bytes of A per lane per K-step.
    pub chunk: Chunk,
    /// (M, K, L).
    pub mkl: (usize, usize, usize),
    /// Tiles, split-K, grid, window ([`Tiling::choose`], shared with the W4A16 GEMV).
    pub tiling: Tiling,
    /// SMs of the device.
    pub sms: usize,
}

/// The kernel symbol of a variant: 16 B chunks need K % 32 == 0 (16-byte aligned rows); any
/// other K % 16 == 0 takes the 8 B path. The output type is a kernel of its own (`_bf16`): a
/// runtime choice in the epilogue cost registers (kernels/gemv.cu's note).
pub fn variant(k: usize, layout: ScaleLayout, out: OutputDtype) -> (&'static str, Chunk) {
    let wide = k.is_multiple_of(32);
    let bf16 = out == OutputDtype::Bf16;
    let symbol = match (layout, wide, bf16) {
        (ScaleLayout::Plain, true, false) => "gemv_nvfp4_sm90_plain",
        (ScaleLayout::Blocked, true, false) => "gemv_nvfp4_sm90_blocked",
        (ScaleLayout::Plain, false, false) => "gemv_nvfp4_sm90_plain_k16",
        (ScaleLayout::Blocked, false, false) => "gemv_nvfp4_sm90_blocked_k16",
        (ScaleLayout::Plain, true, true) => "gemv_nvfp4_sm90_plain_bf16",
        (ScaleLayout::Blocked, true, true) => "gemv_nvfp4_sm90_blocked_bf16",
        (ScaleLayout::Plain, false, true) => "gemv_nvfp4_sm90_plain_k16_bf16",
        (ScaleLayout::Blocked, false, true) => "gemv_nvfp4_sm90_blocked_k16_bf16",
    };
    (symbol, if wide { Chunk::B16 } else { Chunk::B8 })
}

impl GemvConfig {
    /// The heuristic ([`Tiling::choose`], shared with the W4A16 GEMV): the B window holds the
    /// slice's K when its decoded form fits [`MAX_WINDOW_BYTES`] and the staging's per-thread load
    /// slots, else pieces of it. `occupancy(symbol, smem_bytes)` is the number of CTAs of the
    /// kernel that fit one SM (from the driver; any positive number in tests).
    pub fn choose(
        form: Form,
        mkl: (usize, usize, usize),
        layout: ScaleLayout,
        out: OutputDtype,
        sms: usize,
        mut occupancy: impl FnMut(&'static str, usize) -> usize,
    ) -> Self {
        let (symbol, chunk) = variant(mkl.1, layout, out);
        let kstep_smem = KSTEP_CHUNKS * chunk.smem_per_chunk();
        let words_per_kstep = KSTEP_CHUNKS * chunk.bytes() / 4;
        let scales_per_kstep = KSTEP_CHUNKS * chunk.bytes() / 8;
        let max_window =
            (MAX_WINDOW_BYTES / kstep_smem).min(STAGE_WORDS / words_per_kstep).min(STAGE_SCALES / scales_per_kstep);
        let tiling = Tiling::choose(mkl, chunk, (kstep_smem, 0), max_window, sms, |smem| occupancy(symbol, smem));
        Self { symbol, form, layout, chunk, mkl, tiling, sms }
    }

    /// Workspace: [`Tiling::scratch`] of the `[L, M]` output.
    pub fn scratch(&self) -> WorkspaceNeeds {
        let (m, _, l) = self.mkl;
        self.tiling.scratch(m, 1, l)
    }
}

impl fmt::Display for GemvConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (m, k, l) = self.mkl;
        write!(f, "{} ({:?} form) M={m} K={k} L={l}: {} B/lane/K-step, ", self.symbol, self.form, self.chunk.bytes())?;
        self.tiling.fmt_split(f, l, self.sms, "B")
    }
}

/// The GEMV family's verdict: every GEMV whose operands share one scale layout (the kernel
/// reads both in one; the host path converts B first), and every W4A4 GEMM of one activation row
/// (its weight is the kernel's matrix, its activation the vector) unless the GEMM's kernel is
/// forced elsewhere or the shape is past the kernel's 32-bit offsets, with the heuristic's
/// configuration.
pub(crate) fn route(op: &OpMeta, facts: &dyn DeviceFacts, overrides: &Overrides) -> Result<Verdict> {
    let (form, a, b, c) = match op {
        Op::Gemv { a, b: Act::Nvfp4(b), c, .. } => (Form::Gemv, a, b, c),
        Op::Gemv { .. } => return Ok(Verdict::Declines("no kernel for a 16-bit vector (W4A16)".into())),
        Op::Gemm { a: Act::Nvfp4(x), b: w, c, .. } if x.rows == 1 => {
            if overrides.gemm.is_some() {
                return Ok(Verdict::Declines("the GEMM's kernel is forced (NVFP4_GEMM_SM90)".into()));
            }
            if let Some(why) = beyond_i32((w.rows, w.k, w.l), 1) {
                return Ok(Verdict::Declines(why));
            }
            (Form::Gemm, w, x, c)
        }
        _ => return Ok(Verdict::NotItsOp),
    };
    if a.layout != b.layout {
        return Ok(Verdict::Declines("A and B must share one scale layout".into()));
    }
    let dtype = c.map_or(OutputDtype::F16, |c| c.dtype);
    takes(facts, &GEMV, |occupancy| {
        GemvConfig::choose(form, (a.rows, a.k, a.l), a.layout, dtype, facts.sms(), occupancy)
    })
}

impl Plan for GemvConfig {
    fn family(&self) -> &'static str {
        "gemv"
    }
    fn needs(&self) -> WorkspaceNeeds {
        self.scratch()
    }
    fn bind(&self, k: &dyn Kernels, op: &DeviceOp<'_>, ws: &Workspace) -> Result<Box<dyn Launch>> {
        let (a, b, alpha, c) = match *op {
            Op::Gemv { a, ref b, alpha, c } if self.form == Form::Gemv => (a, nvfp4_act(b, "gemv")?, alpha, c),
            Op::Gemm { ref a, b, alpha, c } if self.form == Form::Gemm => (b, nvfp4_act(a, "gemv")?, alpha, c),
            _ => return Err(Error::Invalid(format!("a GEMV plan ({:?} form) bound to a {}", self.form, op.name()))),
        };
        let f = k.function(&GEMV, self.symbol)?;
        Ok(Box::new(bind(k.gpu(), self, f, (a, b), alpha, c, ws)?))
    }
}

/// Binds `config` (from [`GemvConfig::choose`]) and its kernel `func` to A `[L, M, K]`, B
/// `[L, 1, K]` (both in the config's scale layout), the output (`[L, M, 1]`, or `[L, 1, M]` in the
/// Gemm form, where A is the GEMM's weight and B its activation) and `ws`.
pub(crate) fn bind(
    gpu: &Gpu,
    config: &GemvConfig,
    func: CudaFunction,
    (a, b): (&Nvfp4View, &Nvfp4View),
    alpha: Option<f32>,
    c: &F16View,
    ws: &Workspace,
) -> Result<GemvLaunch> {
    let (m, k, l) = config.mkl;
    if (a.meta.l, a.meta.rows, a.meta.k) != (l, m, k) || (b.meta.l, b.meta.rows, b.meta.k) != (l, 1, k) {
        return Err(Error::Shape(format!("gemv: operands {:?}, {:?} do not match {:?}", a.meta, b.meta, config.mkl)));
    }
    if a.meta.layout != config.layout || b.meta.layout != config.layout {
        return Err(Error::Shape("gemv: both operands must have the config's scale layout".into()));
    }
    if variant(k, config.layout, c.dtype).0 != config.symbol {
        return Err(Error::Shape(format!("gemv: a {} output needs another kernel than {}", c.dtype, config.symbol)));
    }
    let want = match config.form {
        Form::Gemv => [l, m, 1],
        Form::Gemm => [l, 1, m],
    };
    if c.shape != want {
        return Err(Error::Shape(format!("gemv: output is {:?}, wants {want:?}", c.shape)));
    }
    to_i32(l * m, "gemv: L * M")?;
    to_i32(m * (k / 2), "gemv: M * K / 2")?;
    let ops = Operands {
        a: a.values,
        sfa: a.scales,
        b: b.values,
        sfb: b.scales,
        c: c.addr,
        // The reference's f32 product: alpha x the activation's x the weight's global scale.
        alpha: match config.form {
            Form::Gemv => product_alpha(alpha, a, b),
            Form::Gemm => product_alpha(alpha, b, a),
        },
        keep: [a.keep(), b.keep(), c.keep()].into_iter().flatten().collect(),
    };
    GemvLaunch::new(gpu, (config.symbol, &config.tiling), func, ops, (config.mkl, 1), ws, ("gemv", "M"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(m: usize, k: usize, l: usize) -> GemvConfig {
        GemvConfig::choose(Form::Gemv, (m, k, l), ScaleLayout::Plain, OutputDtype::F16, 132, |_, _| 2)
    }

    #[test]
    fn bench_shapes_fill_one_wave() {
        // 7168x16384x1: 224 tiles, no split, all resident.
        let c = cfg(7168, 16384, 1);
        assert_eq!(
            (c.symbol, c.tiling.row_ctas, c.tiling.split, c.tiling.ksteps, c.tiling.tiles, c.tiling.grid),
            ("gemv_nvfp4_sm90_plain", 224, 1, 16, 224, 224)
        );
        assert_eq!((c.tiling.window_ksteps, c.tiling.smem_bytes), (16, 36864));
        // 4096x7168x8: 1024 tiles over 264 slots -> 4 tiles per CTA.
        let c = cfg(4096, 7168, 8);
        assert_eq!((c.tiling.split, c.tiling.ksteps, c.tiling.tiles_per_cta, c.tiling.grid), (1, 7, 4, 256));
        // 7168x2048x4: 896 tiles -> 4 per CTA, 224 CTAs.
        let c = cfg(7168, 2048, 4);
        assert_eq!((c.tiling.split, c.tiling.tiles_per_cta, c.tiling.grid), (1, 4, 224));
    }

    #[test]
    fn small_shapes_split_k() {
        let c = cfg(128, 16384, 1);
        assert_eq!((c.tiling.row_ctas, c.tiling.split, c.tiling.ksteps_per_slice, c.tiling.tiles), (4, 16, 1, 64));
        // A slice never holds zero K-steps, the split covers K exactly, windows fit the staging.
        for (m, k, l) in
            [(1, 16, 1), (7, 48, 3), (40, 4112, 1), (130, 64, 3), (1000, 4112, 3), (2432, 4608, 2), (64, 65536, 1)]
        {
            let c = cfg(m, k, l);
            assert!(c.tiling.ksteps_per_slice * (c.tiling.split - 1) < c.tiling.ksteps, "{c}");
            assert!(c.tiling.ksteps_per_slice * c.tiling.split >= c.tiling.ksteps, "{c}");
            assert!(c.tiling.grid * c.tiling.tiles_per_cta >= c.tiling.tiles && c.tiling.grid <= 132 * 2, "{c}");
            assert!(c.tiling.window_ksteps * KSTEP_CHUNKS * c.chunk.bytes() / 4 <= STAGE_WORDS, "{c}");
            assert!(c.tiling.smem_bytes <= MAX_WINDOW_BYTES, "{c}");
            let last = c.tiling.row_ctas - 1;
            assert!((last / 4) * 128 + (last % 4) * 8 < m, "{c}");
        }
    }

    #[test]
    fn k16_path_and_row_ctas() {
        let c = cfg(7, 48, 1);
        assert_eq!(
            (c.symbol, c.chunk, c.tiling.row_ctas, c.tiling.ksteps),
            ("gemv_nvfp4_sm90_plain_k16", Chunk::B8, 1, 1)
        );
        assert_eq!(cfg(7, 96, 1).symbol, "gemv_nvfp4_sm90_plain");
        assert_eq!(cfg(40, 64, 1).tiling.row_ctas, 4); // rows 0..39: tile 3 holds rows 24..31
        assert_eq!(cfg(17, 64, 1).tiling.row_ctas, 3);
        assert_eq!(cfg(130, 64, 1).tiling.row_ctas, 5);
        assert_eq!(Chunk::B16.smem_per_chunk(), 72);
        assert_eq!(Chunk::B8.smem_per_chunk(), 36);
    }
}
