//! The `mma.sync` fallback for GEMM, gated dual GEMM and grouped GEMM (kernels/gemm_fallback.cu,
//! and gemm_fallback_w4a16.cu for 16-bit activations): its verdict, its printable launch
//! configuration and its plan; `bind.rs` binds device operands and launches. Correct for any
//! shape (any M, N >= 1, K % 16 == 0, either scale layout per operand, W4A4 or W4A16 of either
//! activation type); the skeleton replaces it wherever its alignment rules hold.

mod bind;

use std::fmt;

use super::device::{DeviceOp, Workspace, WorkspaceNeeds};
use super::family::{DeviceFacts, Kernels, Launch, Plan, Verdict};
use super::kernels::fallback::{Symbols16, FALLBACK, FALLBACK16, FALLBACK16_BF16, FALLBACK16_F16};
use super::kernels::KernelModule;
use super::overrides::Overrides;
use crate::format::{Nvfp4Meta, OutputDtype};
use crate::ops::{ActMeta, MoeAlpha, Op, OpMeta};
use crate::{Error, Result};

pub use super::kernels::fallback::{DUAL_SYMBOL, GEMM_SYMBOL, PREFETCH, PREFETCH16, THREADS, TILE_K, TILE_M, TILE_N};
pub(crate) use bind::MmaLaunch;
pub use bind::MmaOperands;

/// The module of the kernels for activations `act` (`None`: NVFP4, W4A4).
pub fn module(act: Option<OutputDtype>) -> &'static KernelModule {
    if act.is_some() {
        &FALLBACK16
    } else {
        &FALLBACK
    }
}

/// The kernel of a list of GEMMs (a GEMM, the grouped GEMM's list) or, `dual`, of the gated dual
/// GEMM, for activations `act` (`None`: NVFP4, W4A4).
pub fn list_symbol(dual: bool, act: Option<OutputDtype>) -> &'static str {
    match (act, dual) {
        (None, false) => GEMM_SYMBOL,
        (None, true) => DUAL_SYMBOL,
        (Some(t), false) => symbols16(t).gemm,
        (Some(t), true) => symbols16(t).dual,
    }
}

/// The W4A16 kernels of activation type `t`.
fn symbols16(t: OutputDtype) -> Symbols16 {
    match t {
        OutputDtype::Bf16 => FALLBACK16_BF16,
        OutputDtype::F16 => FALLBACK16_F16,
    }
}

/// Launch configuration: which kernel, how many problems and tiles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MmaConfig {
    /// Kernel symbol.
    pub symbol: &'static str,
    /// The activations' 16-bit type (W4A16: the MMA's input type), `None` for NVFP4 (f16 MMA).
    pub act: Option<OutputDtype>,
    /// (M, N, K, L) of each problem (the MoE form: (T, N, K, 1)).
    pub problems: Vec<(usize, usize, usize, usize)>,
    /// The MoE form's expert count E, `None` for a list of problems.
    pub experts: Option<usize>,
    /// CTAs launched (all problems' tiles, flattened; the MoE form: a bound on its tiles).
    pub grid: usize,
}

impl fmt::Display for MmaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shapes: Vec<String> = self
            .problems
            .iter()
            .map(|&(m, n, k, l)| if l == 1 { format!("{m}x{n}x{k}") } else { format!("{m}x{n}x{k}x{l}") })
            .collect();
        let experts = self.experts.map_or(String::new(), |e| format!(", {e} experts, offsets read on the device"));
        let (ty, ahead) = match self.act {
            None => ("f16", PREFETCH),
            Some(t) => (if t == OutputDtype::Bf16 { "bf16" } else { "f16" }, PREFETCH16),
        };
        write!(
            f,
            "{} [{}{experts}]: {TILE_M}x{TILE_N}x{TILE_K} tiles, {ahead} ahead, mma.sync m16n8k16 {ty}->f32, grid {} x \
             {THREADS}",
            self.symbol,
            shapes.join(", "),
            self.grid
        )
    }
}

impl MmaConfig {
    /// The launch of `symbol` over problems of these (M, N, K, L) with activations `act`: every
    /// problem's tiles, flattened into one grid.
    pub fn new(symbol: &'static str, act: Option<OutputDtype>, problems: Vec<(usize, usize, usize, usize)>) -> Self {
        let grid = problems.iter().map(|&(m, n, _, l)| m.div_ceil(TILE_M) * n.div_ceil(TILE_N) * l).sum();
        Self { symbol, act, problems, experts: None, grid }
    }

    /// The MoE form's launch of `symbol`: T tokens, N, K, E experts. Expert e's c_e tokens take
    /// ceil(c_e / TILE_M) row tiles; over the at most min(E, T) experts with tokens that is at
    /// most (T + (TILE_M - 1) * min(E, T)) / TILE_M, the row tiles launched (a CTA past the
    /// experts' tiles exits).
    pub fn moe(symbol: &'static str, act: OutputDtype, (t, n, k): (usize, usize, usize), e: usize) -> Self {
        let tiles_m = (t + (TILE_M - 1) * e.min(t)) / TILE_M;
        Self {
            symbol,
            act: Some(act),
            problems: vec![(t, n, k, 1)],
            experts: Some(e),
            grid: tiles_m * n.div_ceil(TILE_N),
        }
    }
}

/// The fallback family's verdict: any GEMM, dual GEMM or list of groups, W4A4 or W4A16 (it is
/// correct for every shape, so it comes last), and the W4A16 MoE form. Not the W4A4 MoE form:
/// its offsets live on the device, and only the W4A16 kernels read them there.
pub(crate) fn route(op: &OpMeta, _: &dyn DeviceFacts, _: &Overrides) -> Result<Verdict> {
    let act = op.dense_dtype();
    let gemm = |a: &ActMeta, b: &Nvfp4Meta| (a.rows(), b.rows, a.k(), a.l());
    let config = match op {
        Op::Gemm { a, b, .. } => MmaConfig::new(list_symbol(false, act), act, vec![gemm(a, b)]),
        Op::DualGemm { a, b1, .. } => MmaConfig::new(list_symbol(true, act), act, vec![gemm(a, b1)]),
        Op::GroupedGemm(groups) => {
            MmaConfig::new(list_symbol(false, act), act, groups.iter().map(|g| gemm(&g.a, &g.b)).collect())
        }
        Op::MoeGemm { a, b, .. } => match act {
            Some(t) => MmaConfig::moe(symbols16(t).moe, t, (a.rows(), b.rows, a.k()), b.l),
            None => {
                return Ok(Verdict::Declines(
                    "the experts' offsets are on the device, where only one grouped launch reads them (W4A4)".into(),
                ))
            }
        },
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
        let func = k.function(module(self.act), self.symbol)?;
        let launch = match op {
            Op::Gemm { a, b, alpha, c } => {
                MmaLaunch::bind(k.gpu(), self, func, &[MmaOperands { a: *a, b, b2: None, alpha: *alpha, c }])
            }
            Op::DualGemm { a, b1, b2, alpha, c } => {
                MmaLaunch::bind(k.gpu(), self, func, &[MmaOperands { a: *a, b: b1, b2: Some(b2), alpha: *alpha, c }])
            }
            Op::GroupedGemm(groups) => {
                let ops: Vec<MmaOperands<'_>> =
                    groups.iter().map(|g| MmaOperands { a: g.a, b: g.b, b2: None, alpha: g.alpha, c: g.c }).collect();
                MmaLaunch::bind(k.gpu(), self, func, &ops)
            }
            Op::MoeGemm { a, b, offsets, alpha, c } => {
                let (one, alphas) = match *alpha {
                    MoeAlpha::One(x) => (x, None),
                    MoeAlpha::PerExpert(x) => (None, Some(x)),
                };
                MmaLaunch::bind_moe(self, func, MmaOperands { a: *a, b, b2: None, alpha: one, c }, offsets, alphas)
            }
            Op::Gemv { .. } => Err(Error::Invalid(format!("a fallback plan bound to a {}", op.name()))),
        }?;
        Ok(Box::new(launch))
    }
}

#[cfg(test)]
mod tests;
