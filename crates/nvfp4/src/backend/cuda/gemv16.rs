//! The W4A16 GEMV family (SPEC §8 with one activation row): plan, bind and launch of
//! kernels/gemv16.cu.
//!
//! It takes the two operations that are this computation: `Op::Gemv` with a dense 16-bit vector
//! `b` `[L, 1, K]` (the matrix `a` is the NVFP4 weight, output `[L, N, 1]`), and `Op::Gemm` with a
//! dense activation `a` of one row `[L, 1, K]` (the weight is `b`, output `[L, 1, N]`, the same
//! memory), or of 2 to [`MAX_COLS`] rows (output `[L, M, N]`: the `_cols` kernels, whose MMA
//! columns are the activation rows; a W4A4 GEMM's NVFP4 rows too, decoded as they are staged). The
//! plan is the W4A4 GEMV's tiling ([`Tiling`]) with the activation's window (for the `_cols`
//! kernels a window of every row); the kernel is chosen by rows, activation type, scale layout,
//! chunk and output type.

use std::fmt;

use cudarc::driver::CudaFunction;

use super::device::{product_alpha, to_i32, DeviceOp, F16View, Nvfp4View, Workspace, WorkspaceNeeds};
use super::family::{DeviceFacts, Kernels, Launch, Plan, Verdict};
pub use super::gemv_launch::Form;
use super::gemv_launch::{beyond_i32, takes, GemvLaunch, Operands};
use super::gemv_tiling::Tiling;
use super::kernels::gemv16::{
    symbol, x_smem_per_chunk, Chunk, XType, COLS_ROW_PAD, GEMV16, KSTEP_CHUNKS, MAX_COLS, MAX_COLS_WINDOW_BYTES,
    MAX_WINDOW_BYTES, STAGE_LOADS_PER_THREAD, THREADS,
};
use super::overrides::Overrides;
use super::runtime::Gpu;
use crate::format::{OutputDtype, ScaleLayout};
use crate::ops::{Act, Op, OpMeta};
use crate::{Error, Result};

/// The launch configuration of one W4A16 GEMV shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gemv16Config {
    /// Kernel symbol.
    pub symbol: &'static str,
    /// The operation it serves.
    pub form: Form,
    /// The activation's type.
    pub act: XType,
    /// The output's type.
    pub out: OutputDtype,
    /// Scale layout of the weight.
    pub layout: ScaleLayout,
    /// Bytes of weight per thread per row per K-step.
    pub chunk: Chunk,
    /// (N, K, L): weight rows, reduction length, batches.
    pub nkl: (usize, usize, usize),
    /// Activation rows (M): 1, or up to [`MAX_COLS`] in the Gemm form.
    pub cols: usize,
    /// Tiles, split-K, grid, window.
    pub tiling: Tiling,
    /// SMs of the device.
    pub sms: usize,
}

impl Gemv16Config {
    /// The heuristic: [`Tiling::choose`] with the activation's window (2 bytes per element, at
    /// most the staging's load slots, [`MAX_WINDOW_BYTES`]; for the `_cols` kernels every row's,
    /// within [`MAX_COLS_WINDOW_BYTES`]). `occupancy(symbol, smem_bytes)` is the number of CTAs
    /// of the kernel that fit one SM.
    pub fn choose(
        (form, cols): (Form, usize),
        nkl: (usize, usize, usize),
        (act, layout, out): (XType, ScaleLayout, OutputDtype),
        sms: usize,
        mut occupancy: impl FnMut(&'static str, usize) -> usize,
    ) -> Self {
        let chunk = if nkl.1.is_multiple_of(32) { Chunk::B16 } else { Chunk::B8 };
        let symbol = symbol(act, layout, chunk, out, cols);
        let (kstep_smem, fixed_smem, max_window) = if cols > 1 {
            // Every row's window, each padded; the staging loops over its load slots.
            let (kstep_smem, pad) = (cols * KSTEP_CHUNKS * x_smem_per_chunk(chunk), cols * COLS_ROW_PAD);
            (kstep_smem, pad, (MAX_COLS_WINDOW_BYTES - pad) / kstep_smem)
        } else {
            let kstep_smem = KSTEP_CHUNKS * x_smem_per_chunk(chunk);
            // 16-byte loads of the activation per K-step: one per 8 elements.
            let loads_per_kstep = KSTEP_CHUNKS * chunk.bytes() / 4;
            let max_window =
                (MAX_WINDOW_BYTES / kstep_smem).min(THREADS as usize * STAGE_LOADS_PER_THREAD / loads_per_kstep);
            (kstep_smem, 0, max_window)
        };
        let tiling =
            Tiling::choose(nkl, chunk, (kstep_smem, fixed_smem), max_window, sms, |smem| occupancy(symbol, smem));
        Self { symbol, form, act, out, layout, chunk, nkl, cols, tiling, sms }
    }

    /// Workspace: [`Tiling::scratch`] of the `[L, cols, N]` output.
    pub fn scratch(&self) -> WorkspaceNeeds {
        let (n, _, l) = self.nkl;
        self.tiling.scratch(n, self.cols, l)
    }
}

impl fmt::Display for Gemv16Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (n, k, l) = self.nkl;
        write!(
            f,
            "{} ({:?} form) N={n} K={k} L={l} M={}: {} B/thread/row/K-step, ",
            self.symbol,
            self.form,
            self.cols,
            self.chunk.bytes()
        )?;
        self.tiling.fmt_split(f, l, self.sms, "x")
    }
}

/// The family's verdict: a GEMV whose vector is 16-bit, a GEMM whose 16-bit activation has at
/// most [`MAX_COLS`] rows, and a W4A4 GEMM of 2 to [`MAX_COLS`] rows whose operands share a scale
/// layout (the W4A4 GEMV takes one row); a GEMM of more than one row only while the GEMM's kernel
/// is not forced elsewhere, and no GEMM past the kernels' 32-bit offsets. The other operations are
/// not its.
pub(crate) fn route(op: &OpMeta, facts: &dyn DeviceFacts, overrides: &Overrides) -> Result<Verdict> {
    let (form, w, act, cols, c) = match op {
        Op::Gemv { a, b: Act::Dense(x), c, .. } => (Form::Gemv, a, XType::Dense(x.dtype), x.shape[1], c),
        Op::Gemm { a: Act::Dense(x), b, c, .. } => (Form::Gemm, b, XType::Dense(x.dtype), x.shape[1], c),
        Op::Gemm { a: Act::Nvfp4(x), b, c, .. } if x.rows > 1 && x.rows <= MAX_COLS => {
            if x.layout != b.layout {
                return Ok(Verdict::Declines(
                    "an NVFP4 activation of several rows in the weight's scale layout".into(),
                ));
            }
            (Form::Gemm, b, XType::Nvfp4, x.rows, c)
        }
        _ => return Ok(Verdict::NotItsOp),
    };
    if cols > MAX_COLS {
        return Ok(Verdict::Declines(format!("at most {MAX_COLS} activation rows, has M = {cols}")));
    }
    if cols > 1 && overrides.gemm.is_some() {
        return Ok(Verdict::Declines("M > 1 and the GEMM's kernel is forced (NVFP4_GEMM_SM90)".into()));
    }
    // A GEMM past the kernel's 32-bit offsets goes to a family with 64-bit ones (a GEMV has none).
    if let Some(why) = beyond_i32((w.rows, w.k, w.l), cols).filter(|_| form == Form::Gemm) {
        return Ok(Verdict::Declines(why));
    }
    let out = act.out_or(c.map(|c| c.dtype));
    takes(facts, &GEMV16, |occupancy| {
        Gemv16Config::choose((form, cols), (w.rows, w.k, w.l), (act, w.layout, out), facts.sms(), occupancy)
    })
}

impl Plan for Gemv16Config {
    fn family(&self) -> &'static str {
        "gemv16"
    }
    fn needs(&self) -> WorkspaceNeeds {
        self.scratch()
    }
    fn bind(&self, k: &dyn Kernels, op: &DeviceOp<'_>, ws: &Workspace) -> Result<Box<dyn Launch>> {
        let (w, x, alpha, c) = match *op {
            Op::Gemv { a, b: Act::Dense(x), alpha, c } if self.form == Form::Gemv => (a, X::Dense(x), alpha, c),
            Op::Gemm { a: Act::Dense(x), b, alpha, c } if self.form == Form::Gemm => (b, X::Dense(x), alpha, c),
            Op::Gemm { a: Act::Nvfp4(x), b, alpha, c } if self.form == Form::Gemm => (b, X::Nvfp4(x), alpha, c),
            _ => {
                return Err(Error::Invalid(format!(
                    "a W4A16 GEMV plan ({:?} form) bound to a {} ({})",
                    self.form,
                    op.name(),
                    op.meta().activation().map_or("no activation".into(), |a| a.mode())
                )))
            }
        };
        let f = k.function(&GEMV16, self.symbol)?;
        Ok(Box::new(bind(k.gpu(), self, f, (w, x), alpha, c, ws)?))
    }
}

/// The activation a plan is bound to.
enum X<'a> {
    Dense(&'a F16View),
    Nvfp4(&'a Nvfp4View),
}

/// Binds `config` (from [`Gemv16Config::choose`]) and its kernel `func` to the weight `w`
/// `[L, N, K]` (in the config's scale layout), the activation `x` `[L, M, K]` (of the config's
/// type and rows; NVFP4 in the weight's scale layout), the output (`[L, N, 1]` or `[L, M, N]` by
/// the config's form, of its output type) and `ws`.
fn bind(
    gpu: &Gpu,
    config: &Gemv16Config,
    func: CudaFunction,
    (w, x): (&Nvfp4View, X<'_>),
    alpha: Option<f32>,
    c: &F16View,
    ws: &Workspace,
) -> Result<GemvLaunch> {
    let (n, k, l) = config.nkl;
    let m = config.cols;
    let (x_shape, x_type) = match x {
        X::Dense(x) => ([x.shape[0], x.shape[1], x.shape[2]], XType::Dense(x.dtype)),
        X::Nvfp4(x) => ([x.meta.l, x.meta.rows, x.meta.k], XType::Nvfp4),
    };
    if (w.meta.l, w.meta.rows, w.meta.k) != (l, n, k) || x_shape != [l, m, k] {
        return Err(Error::Shape(format!(
            "gemv16: weight {:?} and activation {x_shape:?} do not match (N, K, L) = {:?}",
            w.meta, config.nkl
        )));
    }
    if w.meta.layout != config.layout || matches!(x, X::Nvfp4(x) if x.meta.layout != config.layout) {
        return Err(Error::Shape(format!(
            "gemv16: the weight's (and an NVFP4 activation's) scales must be {:?}",
            config.layout
        )));
    }
    if (x_type, c.dtype) != (config.act, config.out) {
        return Err(Error::Shape(format!(
            "gemv16: a {x_type:?} activation and a {} output need another kernel than {}",
            c.dtype, config.symbol
        )));
    }
    let want = match config.form {
        Form::Gemv if m == 1 => [l, n, 1],
        Form::Gemv => return Err(Error::Shape(format!("gemv16: a GEMV has one activation row, the plan {m}"))),
        Form::Gemm => [l, m, n],
    };
    if c.shape != want {
        return Err(Error::Shape(format!("gemv16: output is {:?}, wants {want:?}", c.shape)));
    }
    to_i32(l * n, "gemv16: L * N")?;
    to_i32(n * (k / 2), "gemv16: N * K / 2 (one batch of the weight)")?;
    to_i32(l * m * k, "gemv16: L * M * K")?;
    let (b, sfb, alpha, x_keep) = match x {
        X::Dense(x) => {
            if !x.addr.is_multiple_of(16) {
                return Err(Error::Invalid("gemv16: the activation must be 16-byte aligned".into()));
            }
            // alpha x the weight's global scale, in f32 as the reference forms it (a dense
            // activation's factor is 1), widened for the epilogue.
            (x.addr, 0, f64::from(alpha.unwrap_or(1.0) * w.meta.global_scale), x.keep())
        }
        // The reference's f32 product: alpha x the activation's x the weight's global scale.
        X::Nvfp4(x) => (x.values, x.scales, product_alpha(alpha, x, w), x.keep()),
    };
    let ops = Operands {
        a: w.values,
        sfa: w.scales,
        b,
        sfb,
        c: c.addr,
        alpha,
        keep: [w.keep(), x_keep, c.keep()].into_iter().flatten().collect(),
    };
    GemvLaunch::new(gpu, (config.symbol, &config.tiling), func, ops, (config.nkl, m), ws, ("gemv16", "N"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::family::Modeled;
    use crate::backend::cuda::route::route as route_op;
    use crate::problem::Shape;

    const F16: OutputDtype = OutputDtype::F16;
    const BF16: OutputDtype = OutputDtype::Bf16;

    fn cfg(n: usize, k: usize, l: usize) -> Gemv16Config {
        Gemv16Config::choose((Form::Gemv, 1), (n, k, l), (XType::Dense(BF16), ScaleLayout::Plain, BF16), 132, |_, _| 2)
    }

    #[test]
    fn decode_shapes_fill_one_wave_and_windows_fit() {
        // 1 x 8192 x 8192: 256 row tiles over 264 slots, no split, the whole K in one window.
        let c = cfg(8192, 8192, 1);
        let t = &c.tiling;
        assert_eq!(c.symbol, "gemv16_nvfp4_sm90_bf16_plain_to_bf16");
        assert_eq!((t.row_ctas, t.split, t.ksteps, t.grid, t.window_ksteps, t.smem_bytes), (256, 1, 8, 256, 8, 16384));
        // K = 16384 needs 16 K-steps of x: 32 KiB, the largest window.
        let c = cfg(7168, 16384, 1);
        assert_eq!((c.tiling.window_ksteps, c.tiling.smem_bytes), (16, 32768));
        // Longer K is staged in windows; the K % 32 == 16 path takes 8 B chunks.
        assert_eq!(cfg(4096, 65536, 1).tiling.window_ksteps, 16);
        let c = cfg(4096, 8208, 1);
        assert_eq!((c.chunk, c.symbol), (Chunk::B8, "gemv16_nvfp4_sm90_bf16_plain_k16_to_bf16"));
        assert_eq!(c.tiling.ksteps, 17); // 8208 / 2 / 8 = 513 chunks
        for (n, k, l) in [(1, 16, 1), (7, 48, 3), (40, 4112, 1), (130, 64, 3), (2432, 4608, 2), (64, 65536, 1)] {
            let c = cfg(n, k, l);
            let t = &c.tiling;
            let loads = t.window_ksteps * KSTEP_CHUNKS * c.chunk.bytes() / 4;
            assert!(loads <= THREADS as usize * STAGE_LOADS_PER_THREAD && t.smem_bytes <= MAX_WINDOW_BYTES, "{c}");
            assert!(t.ksteps_per_slice * t.split >= t.ksteps && t.grid <= 264, "{c}");
        }
    }

    #[test]
    fn workspace_only_when_split() {
        assert_eq!(cfg(8192, 8192, 1).scratch(), WorkspaceNeeds::default());
        let c = cfg(128, 16384, 2);
        assert!(c.tiling.split > 1, "{c}");
        assert_eq!(c.scratch(), WorkspaceNeeds { bytes: c.tiling.split * 2 * 128 * 4, counters: 2 * 4 });
    }

    /// Both operations of this computation route here, with the kernel of their types; other
    /// activations and more rows do not.
    #[test]
    fn the_gemv_and_the_one_row_gemm_route_here() {
        let run =
            |shape: Shape, layout, act| route_op(&shape.op_meta_in(layout, act), &Modeled::HOPPER, &Overrides::NONE);
        let gemv = Shape::Gemv { m: 8192, k: 8192, l: 1 };
        let gemm = Shape::Gemm { m: 1, n: 8192, k: 8192, l: 2 };
        for (shape, form) in [(gemv.clone(), "Gemv form"), (gemm.clone(), "Gemm form")] {
            for (layout, act, sym) in [
                (ScaleLayout::Plain, BF16, "gemv16_nvfp4_sm90_bf16_plain_to_bf16"),
                (ScaleLayout::Blocked, F16, "gemv16_nvfp4_sm90_f16_blocked_to_f16"),
            ] {
                let r = run(shape.clone(), layout, Some(act)).expect("routed");
                assert_eq!(r.family(), "gemv16", "{r}");
                assert!(r.plan().starts_with(sym) && r.plan().contains(form), "{r}");
            }
        }
        // W4A4 stays with the W4A4 families.
        assert_eq!(run(gemv, ScaleLayout::Plain, None).unwrap().family(), "gemv");
        assert_ne!(run(gemm, ScaleLayout::Plain, None).unwrap().family(), "gemv16");
        // Up to 8 activation rows take the `_cols` kernels; more are not this family's: it
        // declines, saying why.
        for m in [2, 5, MAX_COLS] {
            let r = run(Shape::Gemm { m, n: 8192, k: 8192, l: 1 }, ScaleLayout::Blocked, Some(BF16)).unwrap();
            assert_eq!(r.family(), "gemv16", "{r}");
            let plan = r.plan();
            assert!(
                plan.starts_with("gemv16_nvfp4_sm90_bf16_blocked_to_bf16_cols") && plan.contains(&format!("M={m}:"))
            );
            // 8 K-steps of 2 KiB per row fit 96 KiB up to 5 rows; 8 rows take windows of 5.
            let window = if m <= 5 { 8 } else { 5 };
            assert!(plan.ends_with(&format!("x window {window} K-steps = {} B smem", m * (window * 2048 + 64))), "{r}");
        }
        let many = Shape::Gemm { m: 16, n: 256, k: 256, l: 1 };
        let said = match run(many, ScaleLayout::Plain, Some(BF16)) {
            Ok(r) => r.to_string(),
            Err(e) => e.to_string(),
        };
        assert!(said.contains("gemv16: at most 8 activation rows, has M = 16"), "{said}");
        // A GEMM past the kernels' 32-bit offsets (a 2 GiB weight) goes to a kernel with 64-bit
        // ones, in both modes and with one row.
        for (m, act) in [(4, Some(BF16)), (1, Some(BF16)), (4, None), (1, None)] {
            let huge = Shape::Gemm { m, n: 262144, k: 16384, l: 1 };
            let r = run(huge, ScaleLayout::Plain, act).unwrap();
            assert!(!["gemv", "gemv16"].contains(&r.family()), "{r}");
            assert!(r.to_string().contains("exceeds the GEMV kernels' 32-bit offsets"), "{r}");
        }
        // A forced GEMM kernel takes the rows the `_cols` kernels would (so the two can be timed).
        let four = Shape::Gemm { m: 4, n: 256, k: 256, l: 1 }.op_meta_in(ScaleLayout::Plain, Some(BF16));
        let forced = route_op(&four, &Modeled::HOPPER, &Overrides::gemm(crate::backend::cuda::sm90::Forced::Skeleton));
        assert_eq!(forced.unwrap().family(), "sm90");
    }
}
