//! One W4A16 problem instance (SPEC §8): an operation whose activation is a dense 16-bit tensor
//! ([`OutTensor`], bf16 or f16) and whose weights stay NVFP4, as a case file or a generator
//! produces it. The activation is A of the GEMM, dual GEMM, each group and the MoE form, and the
//! vector B of the GEMV (whose matrix A is the weight).

use crate::format::{OutTensor, OutputDtype, ScaleLayout};
use crate::memory::ensure_host;
use crate::ops::{Backend, DualGemm, Gemm, Gemv, GroupedGemm, HostOp, MoeAlpha, MoeGemm};
use crate::problem::{ProblemKind, Shape};
use crate::{Error, Result};

/// One W4A16 operation with its operands: the W4A16 twin of [`Problem`](super::Problem).
#[derive(Clone, Debug, PartialEq)]
pub enum Problem16 {
    /// Batched GEMV: NVFP4 matrix `[L, M, K]` times a 16-bit vector `[L, 1, K]`.
    Gemv(Gemv<OutTensor>),
    /// GEMM: 16-bit A `[L, M, K]`, NVFP4 B `[L, N, K]`.
    Gemm(Gemm<OutTensor>),
    /// Gated dual GEMM: 16-bit A, NVFP4 B1 and B2.
    DualGemm(DualGemm<OutTensor>),
    /// Grouped GEMM: every group's A 16-bit (one type for all groups).
    GroupedGemm(GroupedGemm<OutTensor>),
    /// The MoE form: 16-bit tokens `[1, T, K]`, NVFP4 experts `[E, N, K]` (no case-file form).
    Moe(MoeGemm<OutTensor>),
}

impl Problem16 {
    /// The operation, as the generic [`Op`](crate::ops::Op) over its host tensors.
    pub fn op(&self) -> HostOp<'_, &OutTensor> {
        match self {
            Problem16::Gemv(p) => p.op(),
            Problem16::Gemm(p) => p.op(),
            Problem16::DualGemm(p) => p.op(),
            Problem16::GroupedGemm(p) => p.op(),
            Problem16::Moe(p) => p.op(),
        }
    }

    /// Which operation this is.
    pub fn kind(&self) -> ProblemKind {
        match self {
            Problem16::Gemv(_) => ProblemKind::Gemv,
            Problem16::Gemm(_) => ProblemKind::Gemm,
            Problem16::DualGemm(_) => ProblemKind::DualGemm,
            Problem16::GroupedGemm(_) | Problem16::Moe(_) => ProblemKind::GroupedGemm,
        }
    }

    /// The activation's element type (every group's, for the grouped GEMM: the rules refuse a
    /// mix).
    pub fn act_dtype(&self) -> OutputDtype {
        match self {
            Problem16::Gemv(p) => p.b.dtype(),
            Problem16::Gemm(p) => p.a.dtype(),
            Problem16::DualGemm(p) => p.a.dtype(),
            Problem16::GroupedGemm(p) => p.groups.first().map_or(OutputDtype::F16, |g| g.a.dtype()),
            Problem16::Moe(p) => p.a.dtype(),
        }
    }

    /// The dimensions (the MoE form's routed rows, as [`Problem::shape`](super::Problem::shape)).
    pub fn shape(&self) -> Shape {
        match self {
            Problem16::Gemv(p) => {
                let (m, k, l) = p.mkl();
                Shape::Gemv { m, k, l }
            }
            Problem16::Gemm(p) => {
                let (m, n, k, l) = p.mnkl();
                Shape::Gemm { m, n, k, l }
            }
            Problem16::DualGemm(p) => {
                let (m, n, k, l) = p.mnkl();
                Shape::DualGemm { m, n, k, l }
            }
            Problem16::GroupedGemm(p) => Shape::GroupedGemm {
                groups: p
                    .groups
                    .iter()
                    .map(|g| {
                        let (m, n, k, _) = g.mnkl();
                        (m, n, k)
                    })
                    .collect(),
            },
            Problem16::Moe(p) => {
                let (_, _, n, k) = p.etnk();
                let rows = p.expert_rows().unwrap_or_default();
                Shape::Moe { n, k, counts: rows.iter().map(|r| r.len()).collect() }
            }
        }
    }

    /// Runs the operation on `backend` with outputs in `out`: one tensor, or one per group of a
    /// grouped GEMM. The host must hold what the run allocates ([`Problem16::run_host_bytes`]).
    pub fn run_as(&self, backend: &dyn Backend, out: OutputDtype) -> Result<Vec<OutTensor>> {
        let what = format!("running W4A16 {} {} on the {} backend", self.kind(), self.shape(), backend.name());
        ensure_host(&what, self.run_host_bytes(backend))?;
        Ok(match self {
            Problem16::Gemv(p) => vec![backend.gemv16_as(p, out)?],
            Problem16::Gemm(p) => vec![backend.gemm16_as(p, out)?],
            Problem16::DualGemm(p) => vec![backend.dual_gemm16_as(p, out)?],
            Problem16::GroupedGemm(p) => backend.grouped_gemm16_as(p, out)?,
            Problem16::Moe(p) => vec![backend.moe_gemm16_as(p, out)?],
        })
    }

    /// Sets the user alpha (of every group), refused as the constructors refuse it; on a refusal
    /// nothing changes. The weights' global scales multiply it (SPEC §8).
    pub fn set_alpha(&mut self, alpha: Option<f32>) -> Result<()> {
        let mut changed = self.op().meta();
        changed.set_alpha(alpha);
        changed.validate()?;
        match self {
            Problem16::Gemv(x) => x.alpha = alpha,
            Problem16::Gemm(x) => x.alpha = alpha,
            Problem16::DualGemm(x) => x.alpha = alpha,
            Problem16::GroupedGemm(x) => x.groups.iter_mut().for_each(|g| g.alpha = alpha),
            Problem16::Moe(x) => x.alpha = MoeAlpha::One(alpha),
        }
        Ok(())
    }

    /// Sets the MoE form's alpha, one for every expert or one per expert, refused as
    /// [`MoeGemm::new`] refuses it; the other operations have no experts (an error). On a
    /// refusal nothing changes.
    pub fn set_moe_alpha(&mut self, alpha: MoeAlpha) -> Result<()> {
        let Problem16::Moe(x) = self else {
            return Err(Error::Invalid(format!("a {} has no experts to give alphas", self.kind().name())));
        };
        let before = std::mem::replace(&mut x.alpha, alpha);
        x.validate().inspect_err(|_| x.alpha = before)
    }

    /// The same problem with every weight's scales converted to `layout` (the activation has
    /// none).
    pub fn into_layout(self, layout: ScaleLayout) -> Problem16 {
        let g = |p: Gemm<OutTensor>| Gemm { a: p.a, b: p.b.into_layout(layout), alpha: p.alpha };
        match self {
            Problem16::Gemv(p) => Problem16::Gemv(Gemv { a: p.a.into_layout(layout), b: p.b, alpha: p.alpha }),
            Problem16::Gemm(p) => Problem16::Gemm(g(p)),
            Problem16::DualGemm(p) => Problem16::DualGemm(DualGemm {
                a: p.a,
                b1: p.b1.into_layout(layout),
                b2: p.b2.into_layout(layout),
                alpha: p.alpha,
            }),
            Problem16::GroupedGemm(p) => {
                Problem16::GroupedGemm(GroupedGemm { groups: p.groups.into_iter().map(g).collect() })
            }
            Problem16::Moe(p) => {
                Problem16::Moe(MoeGemm { a: p.a, b: p.b.into_layout(layout), offsets: p.offsets, alpha: p.alpha })
            }
        }
    }

    /// [`Self::into_layout`] on a copy.
    pub fn with_layout(&self, layout: ScaleLayout) -> Problem16 {
        self.clone().into_layout(layout)
    }

    /// Whether the problem is well formed: its operation's rules ([`Op::validate`](crate::ops::Op)).
    pub fn validate(&self) -> Result<()> {
        self.op().validate()?;
        if let Problem16::Moe(p) = self {
            p.validate()?;
        }
        Ok(())
    }

    /// The activation tensors in order (one; one per group).
    pub fn activations(&self) -> Vec<&OutTensor> {
        match self {
            Problem16::Gemv(p) => vec![&p.b],
            Problem16::Gemm(p) => vec![&p.a],
            Problem16::DualGemm(p) => vec![&p.a],
            Problem16::GroupedGemm(p) => p.groups.iter().map(|g| &g.a).collect(),
            Problem16::Moe(p) => vec![&p.a],
        }
    }
}
