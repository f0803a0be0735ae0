//! The `mma.sync` fallback for GEMM, gated dual GEMM and grouped GEMM (kernels/gemm_fallback.cu):
//! problem descriptors, the flattened tile grid, bind and launch. Correct for any shape (any
//! M, N >= 1, K % 16 == 0, either scale layout per operand); the skeleton replaces it wherever
//! its alignment rules hold.

use std::fmt;

use cudarc::driver::CudaFunction;

use super::device::{product_alpha, to_i32, DeviceOp, F16View, Keep, Nvfp4View, Owned, Workspace, WorkspaceNeeds};
use super::family::{nvfp4_act, w4a4_only, DeviceFacts, Kernels, Launch, Plan, Verdict};
use super::kernels::fallback::{MmaParams, MmaProblem, FALLBACK};
use super::kernels::pdl_ready;
use super::overrides::Overrides;
use super::runtime::{Gpu, LaunchOptions, LaunchShape, StreamHandle};
use crate::ops::{ActMeta, Op, OpMeta};
use crate::{Error, Result};

pub use super::kernels::fallback::{DUAL_SYMBOL, GEMM_SYMBOL, PREFETCH, THREADS, TILE_K, TILE_M, TILE_N};

/// Launch configuration: which kernel, how many problems and tiles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MmaConfig {
    /// Kernel symbol.
    pub symbol: &'static str,
    /// (M, N, K, L) of each problem.
    pub problems: Vec<(usize, usize, usize, usize)>,
    /// CTAs launched (all problems' tiles, flattened).
    pub grid: usize,
}

impl fmt::Display for MmaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shapes: Vec<String> = self
            .problems
            .iter()
            .map(|&(m, n, k, l)| if l == 1 { format!("{m}x{n}x{k}") } else { format!("{m}x{n}x{k}x{l}") })
            .collect();
        write!(
            f,
            "{} [{}]: {TILE_M}x{TILE_N}x{TILE_K} tiles, {PREFETCH} ahead, mma.sync m16n8k16 f16->f32, grid {} x {THREADS}",
            self.symbol,
            shapes.join(", "),
            self.grid
        )
    }
}

impl MmaConfig {
    /// The launch of `symbol` over problems of these (M, N, K, L): every problem's tiles,
    /// flattened into one grid.
    pub fn new(symbol: &'static str, problems: Vec<(usize, usize, usize, usize)>) -> Self {
        let grid = problems.iter().map(|&(m, n, _, l)| m.div_ceil(TILE_M) * n.div_ceil(TILE_N) * l).sum();
        Self { symbol, problems, grid }
    }
}

/// The fallback family's verdict: any GEMM, dual GEMM or list of groups (it is correct for every
/// shape, so it comes last). Not the MoE form: its offsets live on the device, and splitting the
/// tokens into groups would need them on the host.
pub(crate) fn route(op: &OpMeta, _: &dyn DeviceFacts, _: &Overrides) -> Result<Verdict> {
    if let Some(v) = w4a4_only(op) {
        return Ok(v);
    }
    let gemm = |a: &ActMeta, b: &crate::format::Nvfp4Meta| (a.rows(), b.rows, a.k(), a.l());
    let config = match op {
        Op::Gemm { a, b, .. } => MmaConfig::new(GEMM_SYMBOL, vec![gemm(a, b)]),
        Op::DualGemm { a, b1, .. } => MmaConfig::new(DUAL_SYMBOL, vec![gemm(a, b1)]),
        Op::GroupedGemm(groups) => MmaConfig::new(GEMM_SYMBOL, groups.iter().map(|g| gemm(&g.a, &g.b)).collect()),
        Op::MoeGemm { .. } => {
            return Ok(Verdict::Declines(
                "the experts' offsets are on the device, where only one grouped launch reads them".into(),
            ))
        }
        Op::Gemv { .. } => return Ok(Verdict::NotItsOp),
    };
    Ok(Verdict::Takes(Box::new(config)))
}

impl Plan for MmaConfig {
    fn family(&self) -> &'static str {
        "fallback"
    }
    fn needs(&self) -> WorkspaceNeeds {
        WorkspaceNeeds::default()
    }
    fn bind(&self, k: &dyn Kernels, op: &DeviceOp<'_>, _: &Workspace) -> Result<Box<dyn Launch>> {
        let ops: Vec<MmaOperands<'_>> = match op {
            Op::Gemm { a, b, alpha, c } => {
                vec![MmaOperands { a: nvfp4_act(a, "fallback")?, b, b2: None, alpha: *alpha, c }]
            }
            Op::DualGemm { a, b1, b2, alpha, c } => {
                vec![MmaOperands { a: nvfp4_act(a, "fallback")?, b: b1, b2: Some(b2), alpha: *alpha, c }]
            }
            Op::GroupedGemm(groups) => groups
                .iter()
                .map(|g| Ok(MmaOperands { a: nvfp4_act(&g.a, "fallback")?, b: g.b, b2: None, alpha: g.alpha, c: g.c }))
                .collect::<Result<_>>()?,
            Op::Gemv { .. } | Op::MoeGemm { .. } => {
                return Err(Error::Invalid(format!("a fallback plan bound to a {}", op.name())))
            }
        };
        let func = k.function(&FALLBACK, self.symbol)?;
        let launch = MmaLaunch::bind(k.gpu(), self.symbol, func, &ops)?;
        if launch.config != *self {
            return Err(Error::Shape("fallback: the operands do not have the plan's shapes".into()));
        }
        Ok(Box::new(launch))
    }
}

/// One GEMM-like problem of a fallback launch: A, B (and B2 for the dual GEMM), alpha, output.
pub struct MmaOperands<'a> {
    /// `[L, M, K]`.
    pub a: &'a Nvfp4View,
    /// `[L, N, K]`.
    pub b: &'a Nvfp4View,
    /// `[L, N, K]`, the dual GEMM's second weight.
    pub b2: Option<&'a Nvfp4View>,
    /// The optional FP32 factor before the final rounding.
    pub alpha: Option<f32>,
    /// `[L, M, N]` f16.
    pub c: &'a F16View,
}

/// GEMM, dual GEMM or grouped GEMM bound to device operands.
pub(crate) struct MmaLaunch {
    pub config: MmaConfig,
    func: CudaFunction,
    params: MmaParams,
    /// What its launches read: operands, outputs and, for several problems, the descriptor
    /// table the params point into (one problem travels by value).
    keep: Vec<Keep>,
}

impl MmaLaunch {
    /// Binds `ops` (one problem for GEMM and dual GEMM, one per group for grouped GEMM) to
    /// `func` (`GEMM_SYMBOL`, or `DUAL_SYMBOL` when the problems have a B2).
    pub fn bind(gpu: &Gpu, symbol: &'static str, func: CudaFunction, ops: &[MmaOperands<'_>]) -> Result<Self> {
        let mut descs = Vec::with_capacity(ops.len());
        let mut shapes = Vec::with_capacity(ops.len());
        let mut keep = Vec::new();
        let mut tile_start = 0usize;
        for op in ops {
            let (m, n, k, l) = (op.a.meta.rows, op.b.meta.rows, op.a.meta.k, op.a.meta.l);
            let b2 = op.b2.unwrap_or(op.b);
            for t in [op.b, b2] {
                if (t.meta.l, t.meta.rows, t.meta.k) != (l, n, k) {
                    return Err(Error::Shape(format!("fallback: B {:?} does not match A {:?}", t.meta, op.a.meta)));
                }
            }
            if op.c.shape != [l, m, n] {
                return Err(Error::Shape(format!("fallback: output {:?}, wants [{l}, {m}, {n}]", op.c.shape)));
            }
            let (tiles_m, tiles_n) = (m.div_ceil(TILE_M), n.div_ceil(TILE_N));
            let alpha = |b: &Nvfp4View| product_alpha(op.alpha, op.a, b);
            descs.push(MmaProblem {
                a: op.a.values,
                sfa: op.a.scales,
                b: op.b.values,
                sfb: op.b.scales,
                b2: op.b2.map_or(0, |t| t.values),
                sfb2: op.b2.map_or(0, |t| t.scales),
                c: op.c.addr,
                alpha: alpha(op.b),
                alpha2: op.b2.map_or(0.0, alpha),
                m: to_i32(m, "M")?,
                n: to_i32(n, "N")?,
                k: to_i32(k, "K")?,
                l: to_i32(l, "L")?,
                layouts: op.a.blocked_flag() | op.b.blocked_flag() << 1 | b2.blocked_flag() << 2,
                tiles_m: to_i32(tiles_m, "M tiles")?,
                tiles_n: to_i32(tiles_n, "N tiles")?,
                tile_start: to_i32(tile_start, "tiles")?,
                out_bf16: op.c.bf16_flag(),
            });
            to_i32(l * m * n, "L * M * N")?;
            shapes.push((m, n, k, l));
            keep.extend([op.a.keep(), op.b.keep(), op.b2.and_then(Nvfp4View::keep), op.c.keep()].into_iter().flatten());
            tile_start += tiles_m * tiles_n * l;
        }
        let grid = tile_start;
        to_i32(grid, "CTAs")?;
        let count = to_i32(ops.len(), "groups")?;
        let params = match descs.as_slice() {
            [one] => MmaParams { problems: 0, count, reserved: 0, one: *one },
            _ => {
                let table = gpu.upload(&descs, "the fallback's problem table")?;
                let problems = gpu.addr(&table);
                keep.push(Owned::new(gpu, table));
                MmaParams { problems, count, reserved: 0, one: MmaProblem::default() }
            }
        };
        Ok(Self { config: MmaConfig { symbol, problems: shapes, grid }, func, params, keep })
    }
}

impl Launch for MmaLaunch {
    fn enqueue(&self, gpu: &Gpu, stream: StreamHandle, chain: bool) -> Result<()> {
        let options = LaunchOptions { dependent: chain && pdl_ready(self.config.symbol), cluster_x: 0 };
        let shape = LaunchShape::linear(self.config.grid as u32, THREADS, 0).with(options);
        gpu.launch(stream, &self.func, shape, &self.params)
    }
    fn first_symbol(&self) -> &'static str {
        self.config.symbol
    }
    fn keeps(&self) -> &[Keep] {
        &self.keep
    }
}
