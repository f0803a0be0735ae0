//! The fallback bound to device operands: each problem's descriptor (`MmaProblem`, shared with
//! the kernels through generated.cuh), the tile grid, and the launch.

use cudarc::driver::CudaFunction;

use super::{MmaConfig, THREADS, TILE_M, TILE_N};
use crate::backend::cuda::device::{to_i32, ActView, F16View, F32View, I32View, Keep, Nvfp4View, Owned};
use crate::backend::cuda::family::Launch;
use crate::backend::cuda::kernels::fallback::{MmaParams, MmaProblem};
use crate::backend::cuda::kernels::pdl_ready;
use crate::backend::cuda::runtime::{Gpu, LaunchOptions, LaunchShape, StreamHandle};
use crate::ops::{effective_alpha, Act, Activation};
use crate::{Error, Result};

/// One GEMM-like problem of a fallback launch: A, B (and B2 for the dual GEMM), alpha, output.
pub struct MmaOperands<'a> {
    /// `[L, M, K]`: NVFP4 (W4A4) or bf16 / f16 (W4A16).
    pub a: ActView<'a>,
    /// `[L, N, K]` (the MoE form: `[E, N, K]`).
    pub b: &'a Nvfp4View,
    /// `[L, N, K]`, the dual GEMM's second weight.
    pub b2: Option<&'a Nvfp4View>,
    /// The optional FP32 factor before the final rounding.
    pub alpha: Option<f32>,
    /// `[L, M, N]` f16 or bf16.
    pub c: &'a F16View,
}

/// GEMM, dual GEMM or grouped GEMM (either form) bound to device operands.
pub(crate) struct MmaLaunch {
    pub config: MmaConfig,
    func: CudaFunction,
    params: MmaParams,
    /// What its launches read: operands, outputs and, for several problems, the descriptor
    /// table the params point into (one problem travels by value).
    keep: Vec<Keep>,
}

impl MmaOperands<'_> {
    /// The descriptor of this problem with `tiles_m` row tiles starting at CTA `tile_start`,
    /// and what its launches read. MoE fields zero.
    fn problem(&self, tiles_m: usize, tile_start: usize) -> Result<(MmaProblem, Vec<Keep>)> {
        let meta = self.a.act_meta();
        let (m, n, k, l) = (meta.rows(), self.b.meta.rows, meta.k(), meta.l());
        let b2 = self.b2.unwrap_or(self.b);
        for t in [self.b, b2] {
            if (t.meta.rows, t.meta.k) != (n, k) {
                return Err(Error::Shape(format!("fallback: B {:?} does not match A {meta:?}", t.meta)));
            }
        }
        // A, its scales and their layout flag (bit 0), or the dense tensor.
        let (a, sfa, a_blocked, a_keep) = match self.a {
            Act::Nvfp4(v) => (v.values, v.scales, v.blocked_flag(), v.keep()),
            Act::Dense(d) => (d.addr, 0, 0, d.keep()),
        };
        let alpha = |b: &Nvfp4View| f64::from(effective_alpha(self.alpha, &self.a, b));
        let problem = MmaProblem {
            a,
            sfa,
            b: self.b.values,
            sfb: self.b.scales,
            b2: self.b2.map_or(0, |t| t.values),
            sfb2: self.b2.map_or(0, |t| t.scales),
            c: self.c.addr,
            alpha: alpha(self.b),
            alpha2: self.b2.map_or(0.0, alpha),
            m: to_i32(m, "M")?,
            n: to_i32(n, "N")?,
            k: to_i32(k, "K")?,
            l: to_i32(l, "L")?,
            layouts: a_blocked | self.b.blocked_flag() << 1 | b2.blocked_flag() << 2,
            tiles_m: to_i32(tiles_m, "M tiles")?,
            tiles_n: to_i32(n.div_ceil(TILE_N), "N tiles")?,
            tile_start: to_i32(tile_start, "tiles")?,
            out_bf16: self.c.bf16_flag(),
            experts: 0,
            offsets: 0,
            alphas: 0,
            global: [0.0; 2],
        };
        to_i32(l * m * n, "L * M * N")?;
        let keep = [a_keep, self.b.keep(), self.b2.and_then(Nvfp4View::keep), self.c.keep()];
        Ok((problem, keep.into_iter().flatten().collect()))
    }
}

impl MmaLaunch {
    /// Binds `ops` (one problem for GEMM and dual GEMM, one per group for grouped GEMM) to
    /// `func`, the kernel of `plan`, whose shapes they must have.
    pub fn bind(gpu: &Gpu, plan: &MmaConfig, func: CudaFunction, ops: &[MmaOperands<'_>]) -> Result<Self> {
        let mut descs = Vec::with_capacity(ops.len());
        let mut shapes = Vec::with_capacity(ops.len());
        let mut keep = Vec::new();
        let mut tile_start = 0usize;
        for op in ops {
            let meta = op.a.act_meta();
            let (m, n, k, l) = (meta.rows(), op.b.meta.rows, meta.k(), meta.l());
            for t in [Some(op.b), op.b2].into_iter().flatten() {
                if t.meta.l != l {
                    return Err(Error::Shape(format!("fallback: B {:?} does not match A {meta:?}", t.meta)));
                }
            }
            if op.c.shape != [l, m, n] {
                return Err(Error::Shape(format!("fallback: output {:?}, wants [{l}, {m}, {n}]", op.c.shape)));
            }
            let tiles_m = m.div_ceil(TILE_M);
            let (desc, kept) = op.problem(tiles_m, tile_start)?;
            descs.push(desc);
            keep.extend(kept);
            shapes.push((m, n, k, l));
            tile_start += tiles_m * n.div_ceil(TILE_N) * l;
        }
        let act = ops.first().and_then(|op| op.a.act_meta().dense_dtype());
        let config = MmaConfig { symbol: plan.symbol, act, problems: shapes, experts: None, grid: tile_start };
        if config != *plan {
            return Err(Error::Shape(format!(
                "fallback: the operands ({config}) do not have the plan's shapes ({plan})"
            )));
        }
        to_i32(config.grid, "CTAs")?;
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
        Ok(Self { config, func, params, keep })
    }

    /// Binds the MoE form (`op.a` the tokens `[1, T, K]`, `op.b` the experts `[E, N, K]`, `op.c`
    /// `[1, T, N]`, E end rows in `offsets`; E per-expert alphas in `alphas`, or `op.alpha` for
    /// every expert) to `func`, the kernel of `plan`.
    pub fn bind_moe(
        plan: &MmaConfig,
        func: CudaFunction,
        op: MmaOperands<'_>,
        offsets: &I32View,
        alphas: Option<&F32View>,
    ) -> Result<Self> {
        let meta = op.a.act_meta();
        let (t, n, k, e) = (meta.rows(), op.b.meta.rows, meta.k(), op.b.meta.l);
        let Some(act) = meta.dense_dtype() else {
            return Err(Error::Invalid("the fallback's MoE form takes 16-bit activations (W4A16)".into()));
        };
        let alphas_len = alphas.map_or(e, |x| x.len);
        if meta.l() != 1 || op.c.shape != [1, t, n] || offsets.len != e || alphas_len != e {
            return Err(Error::Shape(format!(
                "fallback: MoE tokens {meta:?}, experts {:?}, {} offsets, {alphas_len} alphas, output {:?}",
                op.b.meta, offsets.len, op.c.shape
            )));
        }
        let config = MmaConfig::moe(plan.symbol, act, (t, n, k), e);
        if config != *plan {
            return Err(Error::Shape(format!(
                "fallback: the operands ({config}) do not have the plan's shapes ({plan})"
            )));
        }
        to_i32(config.grid, "CTAs")?;
        let (mut one, mut keep) = op.problem(config.grid / n.div_ceil(TILE_N), 0)?;
        one.experts = to_i32(e, "experts")?;
        one.offsets = offsets.addr;
        keep.extend(offsets.keep());
        if let Some(alphas) = alphas {
            one.alphas = alphas.addr;
            one.global = [meta.global_scale(), op.b.meta.global_scale];
            keep.extend(alphas.keep());
        }
        let params = MmaParams { problems: 0, count: 1, reserved: 0, one };
        Ok(Self { config, func, params, keep })
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
