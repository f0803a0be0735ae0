//! What both GEMV families (gemv.rs, W4A4; gemv16.rs, W4A16) do alike around their plans: the
//! route's occupancy question, and the bound launch. Their kernels share one skeleton
//! (kernels/gemv_tiles.cuh), one parameter struct ([`GemvParams`]) and one launch shape; only the
//! operands' checks and addresses are each family's.

use cudarc::driver::CudaFunction;

use super::device::{to_i32, Keep, Workspace};
use super::family::{DeviceFacts, Launch, Plan, Verdict};
use super::gemv_tiling::Tiling;
use super::kernels::gemv::{GemvParams, THREADS};
use super::kernels::pdl_ready;
use super::kernels::KernelModule;
use super::runtime::{Gpu, LaunchOptions, LaunchShape, StreamHandle};
use crate::Result;

/// Which operation a GEMV plan serves (the output's shape differs, its memory does not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// `Op::Gemv`: weight `a`, activation vector `b`, output `[L, N, 1]`.
    Gemv,
    /// `Op::Gemm` with few activation rows (one for the W4A4 GEMV): activation `a`, weight `b`,
    /// output `[L, M, N]`.
    Gemm,
}

/// Why a GEMV kernel cannot index a `(rows, K, L)` problem of `cols` activation rows with its
/// 32-bit offsets (`L * rows`, one batch of the matrix `rows * K / 2`, the activation
/// `L * cols * K`: what the binds check), or `None`. A family declines a GEMM it cannot index, so
/// that a kernel with 64-bit offsets takes it.
pub(crate) fn beyond_i32((rows, k, l): (usize, usize, usize), cols: usize) -> Option<String> {
    let fits = |x: Option<usize>| x.is_some_and(|x| i32::try_from(x).is_ok());
    let ok = fits(l.checked_mul(rows))
        && fits(rows.checked_mul(k / 2))
        && fits(l.checked_mul(cols).and_then(|x| x.checked_mul(k)));
    (!ok).then(|| format!("{rows} x {k} x {l} (M = {cols}) exceeds the GEMV kernels' 32-bit offsets"))
}

/// The verdict of a GEMV family that takes the operation: the plan `choose` makes, given the
/// number of CTAs of a kernel of `module` (by symbol and dynamic shared memory) that fit one SM.
/// The driver's error, if asking it failed, instead.
pub(crate) fn takes<C: Plan + 'static>(
    facts: &dyn DeviceFacts,
    module: &'static KernelModule,
    choose: impl FnOnce(&mut dyn FnMut(&'static str, usize) -> usize) -> C,
) -> Result<Verdict> {
    let mut failure = None;
    let config = choose(&mut |symbol, smem| {
        facts.ctas_per_sm(module, symbol, THREADS, smem).unwrap_or_else(|e| {
            failure = Some(e);
            1
        })
    });
    match failure {
        Some(e) => Err(e),
        None => Ok(Verdict::Takes(Box::new(config))),
    }
}

/// What a family binds a GEMV to: device addresses (the matrix `a`, the vector `b`, their scales;
/// 0 where the kernel reads none) and the output `c`, alpha as the kernel applies it, and what
/// keeps the operands alive.
pub(crate) struct Operands {
    pub a: u64,
    pub sfa: u64,
    pub b: u64,
    pub sfb: u64,
    pub c: u64,
    pub alpha: f64,
    pub keep: Vec<Keep>,
}

/// What the `_moe` kernels read beside [`Operands`]: the experts' end rows, their alphas (0: the
/// one alpha applies) and the global scales of the tokens and the weights.
pub(crate) struct MoeOperands {
    pub offsets: u64,
    pub alpha_l: u64,
    pub global: [f32; 2],
}

/// A GEMV bound to device operands, output and workspace.
pub(crate) struct GemvLaunch {
    symbol: &'static str,
    grid: usize,
    smem_bytes: usize,
    func: CudaFunction,
    params: GemvParams,
    keep: Vec<Keep>,
}

impl GemvLaunch {
    /// Binds kernel `func` (`symbol`, planned as `tiling` for `(m, k, l)`: rows, K, batches, and
    /// `cols` activation rows) to `ops` and the workspace `ws`. The family has checked the
    /// operands; `names` (the family, its name for the rows) word an index that does not fit the
    /// kernel's 32 bits.
    pub(crate) fn new(
        gpu: &Gpu,
        (symbol, tiling): (&'static str, &Tiling),
        func: CudaFunction,
        ops: Operands,
        ((m, k, l), cols): ((usize, usize, usize), usize),
        ws: &Workspace,
        (family, rows): (&str, &str),
    ) -> Result<Self> {
        gpu.allow_smem(&func, tiling.smem_bytes)?;
        let needs = tiling.scratch(m, cols, l);
        let int = |x: usize, what: &str| to_i32(x, &format!("{family}: {what}"));
        let params = GemvParams {
            a: ops.a,
            sfa: ops.sfa,
            b: ops.b,
            sfb: ops.sfb,
            c: ops.c,
            partial: if needs.bytes > 0 { ws.at(0, needs.bytes)? } else { 0 },
            counters: if needs.counters > 0 { ws.counters(needs.counters)? } else { 0 },
            alpha: ops.alpha,
            m: int(m, rows)?,
            k: int(k, "K")?,
            l: int(l, "L")?,
            row_ctas: int(tiling.row_ctas, "row tiles")?,
            split: int(tiling.split, "split")?,
            ksteps_per_slice: int(tiling.ksteps_per_slice, "K-steps")?,
            window_ksteps: int(tiling.window_ksteps, "window")?,
            tiles: int(tiling.tiles, "tiles")?,
            tiles_per_cta: int(tiling.tiles_per_cta, "tiles per CTA")?,
            cols: int(cols, "activation rows")?,
            offsets: 0,
            alpha_l: 0,
            global: [0.0; 2],
        };
        let keep = ops.keep.into_iter().chain([ws.keep()]).collect();
        Ok(Self { symbol, grid: tiling.grid, smem_bytes: tiling.smem_bytes, func, params, keep })
    }

    /// The launch of a `_moe` kernel: the MoE operands beside the GEMV's.
    pub(crate) fn with_moe(mut self, moe: MoeOperands) -> Self {
        self.params.offsets = moe.offsets;
        self.params.alpha_l = moe.alpha_l;
        self.params.global = moe.global;
        self
    }
}

impl Launch for GemvLaunch {
    fn enqueue(&self, gpu: &Gpu, stream: StreamHandle, chain: bool) -> Result<()> {
        let options = LaunchOptions { dependent: chain && pdl_ready(self.symbol), cluster_x: 0 };
        let shape = LaunchShape::linear(self.grid as u32, THREADS, self.smem_bytes as u32).with(options);
        gpu.launch(stream, &self.func, shape, &self.params)
    }
    fn first_symbol(&self) -> &'static str {
        self.symbol
    }
    fn keeps(&self) -> &[Keep] {
        &self.keep
    }
}
