//! One problem instance: an operation with its operands, as a case file or a generator produces
//! it, and what running it returns.

use crate::format::{F16Tensor, ScaleLayout};
use crate::ops::{Backend, DualGemm, Gemm, Gemv, GroupedGemm, MoeAlpha, MoeGemm};
use crate::problem::ProblemKind;
use crate::{Error, Result};

/// One operation with its operands: what a case file or a generator produces.
#[derive(Clone, Debug, PartialEq)]
pub enum Problem {
    /// Batched GEMV.
    Gemv(Gemv),
    /// GEMM.
    Gemm(Gemm),
    /// Gated dual GEMM.
    DualGemm(DualGemm),
    /// Grouped GEMM.
    GroupedGemm(GroupedGemm),
    /// Grouped GEMM in the MoE form (kind [`ProblemKind::GroupedGemm`], one output tensor; no
    /// case-file form).
    Moe(MoeGemm),
}

/// What an operation returns: one tensor, or one per group.
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    /// GEMV, GEMM, dual GEMM, and the grouped GEMM's MoE form (`[1, T, N]`).
    Single(F16Tensor),
    /// Grouped GEMM, in group order.
    Grouped(Vec<F16Tensor>),
}

impl Output {
    /// The output tensors in order (one for the non-grouped operations).
    pub fn tensors(&self) -> &[F16Tensor] {
        match self {
            Output::Single(t) => std::slice::from_ref(t),
            Output::Grouped(v) => v,
        }
    }
}

impl Problem {
    /// The operation, as the generic [`Op`](crate::ops::Op) over its host tensors.
    pub fn op(&self) -> crate::ops::HostOp<'_> {
        match self {
            Problem::Gemv(p) => p.op(),
            Problem::Gemm(p) => p.op(),
            Problem::DualGemm(p) => p.op(),
            Problem::GroupedGemm(p) => p.op(),
            Problem::Moe(p) => p.op(),
        }
    }

    /// Which operation this is.
    pub fn kind(&self) -> ProblemKind {
        use ProblemKind as K;
        match self {
            Problem::Gemv(_) => K::Gemv,
            Problem::Gemm(_) => K::Gemm,
            Problem::DualGemm(_) => K::DualGemm,
            Problem::GroupedGemm(_) | Problem::Moe(_) => K::GroupedGemm,
        }
    }

    /// Runs the operation on `backend`, after checking that the host can hold what the run
    /// allocates ([`Problem::run_host_bytes`]).
    pub fn run(&self, backend: &dyn Backend) -> Result<Output> {
        self.ensure_runnable(backend)?;
        Ok(match self {
            Problem::Gemv(p) => Output::Single(backend.gemv(p)?),
            Problem::Gemm(p) => Output::Single(backend.gemm(p)?),
            Problem::DualGemm(p) => Output::Single(backend.dual_gemm(p)?),
            Problem::GroupedGemm(p) => Output::Grouped(backend.grouped_gemm(p)?),
            Problem::Moe(p) => Output::Single(backend.moe_gemm(p)?),
        })
    }

    /// Sets the alpha of the operation (of every group for the grouped GEMM), refused as the
    /// operations' constructors refuse it: not finite, or making a factor alpha × global(A) ×
    /// global(B) overflow or round to 0 (`ops/scalars.rs`). On a refusal nothing changes.
    pub fn set_alpha(&mut self, alpha: Option<f32>) -> Result<()> {
        let mut changed = self.op().meta();
        changed.set_alpha(alpha);
        changed.validate()?;
        match self {
            Problem::Gemv(x) => x.alpha = alpha,
            Problem::Gemm(x) => x.alpha = alpha,
            Problem::DualGemm(x) => x.alpha = alpha,
            Problem::GroupedGemm(x) => x.groups.iter_mut().for_each(|g| g.alpha = alpha),
            Problem::Moe(x) => x.alpha = MoeAlpha::One(alpha),
        }
        Ok(())
    }

    /// Sets the MoE form's alpha, one for every expert or one per expert, refused as
    /// [`MoeGemm::new`] refuses it (a wrong count, a value the scalar rules refuse); the other
    /// operations have no experts (an error). On a refusal nothing changes.
    pub fn set_moe_alpha(&mut self, alpha: MoeAlpha) -> Result<()> {
        let Problem::Moe(x) = self else {
            return Err(Error::Invalid(format!("a {} has no experts to give alphas", self.kind().name())));
        };
        let before = std::mem::replace(&mut x.alpha, alpha);
        x.validate().inspect_err(|_| x.alpha = before)
    }

    /// The same problem with every scale tensor converted to `layout`.
    pub fn with_layout(&self, layout: ScaleLayout) -> Problem {
        self.clone().into_layout(layout)
    }

    /// [`Self::with_layout`] without a copy of the packed values: each operand's scales are
    /// converted in turn, so the extra memory is one operand's scales at a time.
    pub fn into_layout(self, layout: ScaleLayout) -> Problem {
        let g = |p: Gemm| Gemm { a: p.a.into_layout(layout), b: p.b.into_layout(layout), alpha: p.alpha };
        match self {
            Problem::Gemv(p) => {
                Problem::Gemv(Gemv { a: p.a.into_layout(layout), b: p.b.into_layout(layout), alpha: p.alpha })
            }
            Problem::Gemm(p) => Problem::Gemm(g(p)),
            Problem::DualGemm(p) => Problem::DualGemm(DualGemm {
                a: p.a.into_layout(layout),
                b1: p.b1.into_layout(layout),
                b2: p.b2.into_layout(layout),
                alpha: p.alpha,
            }),
            Problem::GroupedGemm(p) => {
                Problem::GroupedGemm(GroupedGemm { groups: p.groups.into_iter().map(g).collect() })
            }
            Problem::Moe(p) => Problem::Moe(MoeGemm {
                a: p.a.into_layout(layout),
                b: p.b.into_layout(layout),
                offsets: p.offsets,
                alpha: p.alpha,
            }),
        }
    }

    /// Bytes every input read once plus the f16 output written once (SPEC §7); for the MoE
    /// form, both operands whole and the whole `[1, T, N]` output.
    pub fn bytes(&self) -> u64 {
        let out = |l: usize, m: usize, n: usize| (l * m * n * 2) as u64;
        let gemm = |p: &Gemm| {
            let (m, n, _, l) = p.mnkl();
            (p.a.nbytes() + p.b.nbytes()) as u64 + out(l, m, n)
        };
        match self {
            Problem::Gemv(p) => (p.a.nbytes() + p.b.nbytes()) as u64 + out(p.a.l(), p.a.rows(), 1),
            Problem::Gemm(p) => gemm(p),
            Problem::DualGemm(p) => {
                let (m, n, _, l) = p.mnkl();
                (p.a.nbytes() + p.b1.nbytes() + p.b2.nbytes()) as u64 + out(l, m, n)
            }
            Problem::GroupedGemm(p) => p.groups.iter().map(gemm).sum(),
            Problem::Moe(p) => (p.a.nbytes() + p.b.nbytes()) as u64 + out(1, p.tokens(), p.b.rows()),
        }
    }

    /// Floating-point operations (2 per multiply-add; the MoE form's routed rows only).
    pub fn flops(&self) -> f64 {
        let gemm = |p: &Gemm| {
            let (m, n, k, l) = p.mnkl();
            2.0 * (m * n * k * l) as f64
        };
        match self {
            Problem::Gemv(p) => {
                let (m, k, l) = p.mkl();
                2.0 * (m * k * l) as f64
            }
            Problem::Gemm(p) => gemm(p),
            Problem::DualGemm(p) => {
                let (m, n, k, l) = p.mnkl();
                4.0 * (m * n * k * l) as f64
            }
            Problem::GroupedGemm(p) => p.groups.iter().map(gemm).sum(),
            Problem::Moe(p) => {
                let (_, _, n, k) = p.etnk();
                2.0 * (p.routed_tokens() * n * k) as f64
            }
        }
    }
}
