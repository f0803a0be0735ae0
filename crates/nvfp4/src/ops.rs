//! The backend-neutral operation API: one operand struct per operation (validated on
//! construction), the grouped GEMM's MoE form ([`MoeGemm`], in `ops/moe.rs`, with its one or
//! per-expert alpha, [`MoeAlpha`] in `ops/moe_alpha.rs`) and the [`Backend`] trait that every
//! backend implements.

mod act;
mod moe;
mod moe_alpha;
mod op;
mod scalars;

pub use act::{Act, ActMeta, Activation, HostActivation};
pub use moe::MoeGemm;
pub use moe_alpha::{Alphas, MoeAlpha};
pub use op::{Group, Offsets, Op, OpMeta, Operand, OutMeta, Output};
pub(crate) use scalars::check_product;
pub use scalars::{alpha_from_f64, check_global_scale, effective_alpha, parse_alpha};
pub(crate) use scalars::{alpha_rule, global_scale_rule};

use crate::format::{F16Tensor, Nvfp4Tensor, OutTensor, OutputDtype};
use crate::Result;

/// Batched GEMV: `c[l, m] = Σ_k A[l,m,k] · B[l,k]`, output f16 `[L, M, 1]`. The vector B is the
/// activation: NVFP4 (`Gemv`, W4A4) or a 16-bit [`OutTensor`] (`Gemv<OutTensor>`, W4A16).
#[derive(Clone, Debug, PartialEq)]
pub struct Gemv<A = Nvfp4Tensor> {
    /// `[L, M, K]`.
    pub a: Nvfp4Tensor,
    /// `[L, 1, K]`.
    pub b: A,
    /// Optional FP32 factor applied before the final rounding.
    pub alpha: Option<f32>,
}

/// GEMM: `c[l, m, n] = Σ_k A[l,m,k] · B[l,n,k]`, output f16 `[L, M, N]`. A is the activation:
/// NVFP4 (`Gemm`, W4A4) or a 16-bit [`OutTensor`] (`Gemm<OutTensor>`, W4A16, SPEC §8).
#[derive(Clone, Debug, PartialEq)]
pub struct Gemm<A = Nvfp4Tensor> {
    /// `[L, M, K]`.
    pub a: A,
    /// `[L, N, K]`.
    pub b: Nvfp4Tensor,
    /// Optional FP32 factor applied before the final rounding.
    pub alpha: Option<f32>,
}

/// Gated dual GEMM (SwiGLU): `c = f16(silu(A·B1ᵀ) * (A·B2ᵀ))`, both products in FP32.
#[derive(Clone, Debug, PartialEq)]
pub struct DualGemm<A = Nvfp4Tensor> {
    /// `[L, M, K]`, the activation (NVFP4 or 16-bit).
    pub a: A,
    /// `[L, N, K]`, the gate weight.
    pub b1: Nvfp4Tensor,
    /// `[L, N, K]`, the up weight.
    pub b2: Nvfp4Tensor,
    /// Optional FP32 factor applied to each product (x1 and x2) before the gate.
    pub alpha: Option<f32>,
}

/// Grouped GEMM (MoE): G independent GEMMs with L = 1, computed in one launch.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupedGemm<A = Nvfp4Tensor> {
    /// The groups, each a GEMM with its own (M, N, K); one activation form for all.
    pub groups: Vec<Gemm<A>>,
}

/// A host operation as the generic [`Op`] (borrowed operands, offsets and per-expert alphas,
/// outputs made by the backend; the activation an NVFP4 tensor, or `&OutTensor` for W4A16).
pub type HostOp<'a, A = &'a Nvfp4Tensor> = Op<&'a Nvfp4Tensor, &'a [i32], &'a [f32], (), A>;

impl<A: HostActivation> Gemv<A> {
    /// Checks that A is `[L, M, K]` and B is `[L, 1, K]` ([`Op::validate`]).
    pub fn new(a: Nvfp4Tensor, b: A, alpha: Option<f32>) -> Result<Self> {
        let p = Self { a, b, alpha };
        p.op().validate()?;
        Ok(p)
    }
    /// As the generic operation.
    pub fn op(&self) -> HostOp<'_, &A> {
        Op::Gemv { a: &self.a, b: &self.b, alpha: self.alpha, c: () }
    }
    /// (M, K, L).
    pub fn mkl(&self) -> (usize, usize, usize) {
        (self.a.rows(), self.a.k(), self.a.l())
    }
}

impl<A: HostActivation> Gemm<A> {
    /// Checks that A is `[L, M, K]` and B is `[L, N, K]` ([`Op::validate`]).
    pub fn new(a: A, b: Nvfp4Tensor, alpha: Option<f32>) -> Result<Self> {
        let p = Self { a, b, alpha };
        p.op().validate()?;
        Ok(p)
    }
    /// As the generic operation.
    pub fn op(&self) -> HostOp<'_, &A> {
        Op::Gemm { a: &self.a, b: &self.b, alpha: self.alpha, c: () }
    }
    /// (M, N, K, L).
    pub fn mnkl(&self) -> (usize, usize, usize, usize) {
        let a = self.a.act_meta();
        (a.rows(), self.b.rows(), a.k(), a.l())
    }
}

impl<A: HostActivation> DualGemm<A> {
    /// Checks that A is `[L, M, K]` and B1, B2 are both `[L, N, K]` ([`Op::validate`]).
    pub fn new(a: A, b1: Nvfp4Tensor, b2: Nvfp4Tensor, alpha: Option<f32>) -> Result<Self> {
        let p = Self { a, b1, b2, alpha };
        p.op().validate()?;
        Ok(p)
    }
    /// As the generic operation.
    pub fn op(&self) -> HostOp<'_, &A> {
        Op::DualGemm { a: &self.a, b1: &self.b1, b2: &self.b2, alpha: self.alpha, c: () }
    }
    /// (M, N, K, L).
    pub fn mnkl(&self) -> (usize, usize, usize, usize) {
        let a = self.a.act_meta();
        (a.rows(), self.b1.rows(), a.k(), a.l())
    }
}

impl<A: HostActivation> GroupedGemm<A> {
    /// Checks that there is at least one group, every group has L = 1 and follows the scalar
    /// rules ([`Op::validate`]; a [`Gemm`]'s fields are public, so a group may have changed since
    /// [`Gemm::new`]).
    pub fn new(groups: Vec<Gemm<A>>) -> Result<Self> {
        let p = Self { groups };
        p.op().validate()?;
        Ok(p)
    }
    /// As the generic operation.
    pub fn op(&self) -> HostOp<'_, &A> {
        Op::GroupedGemm(self.groups.iter().map(|g| Group { a: &g.a, b: &g.b, alpha: g.alpha, c: () }).collect())
    }
}

/// A place that can run the four operations. The CPU backend is also the reference.
///
/// Every operation rounds its result once to an [`OutputDtype`]: the `*_as` methods take it (a
/// backend implements those); the plain ones are their f16 form (SPEC §3).
pub trait Backend: Send + Sync {
    /// Short name (`cpu`, `cuda`).
    fn name(&self) -> &'static str;
    /// Batched GEMV, output in `dtype`.
    fn gemv_as(&self, p: &Gemv, dtype: OutputDtype) -> Result<OutTensor>;
    /// GEMM, output in `dtype`.
    fn gemm_as(&self, p: &Gemm, dtype: OutputDtype) -> Result<OutTensor>;
    /// Gated dual GEMM, output in `dtype`.
    fn dual_gemm_as(&self, p: &DualGemm, dtype: OutputDtype) -> Result<OutTensor>;
    /// Grouped GEMM, all groups in one launch, outputs in `dtype`.
    fn grouped_gemm_as(&self, p: &GroupedGemm, dtype: OutputDtype) -> Result<Vec<OutTensor>>;
    /// Grouped GEMM in the MoE form: one `[1, T, N]` output in `dtype`, rows past the last offset
    /// unwritten (zero in the fresh output returned here).
    fn moe_gemm_as(&self, p: &MoeGemm, dtype: OutputDtype) -> Result<OutTensor>;

    /// Batched GEMV, f16 output.
    fn gemv(&self, p: &Gemv) -> Result<F16Tensor> {
        self.gemv_as(p, OutputDtype::F16)?.into_f16()
    }
    /// GEMM, f16 output.
    fn gemm(&self, p: &Gemm) -> Result<F16Tensor> {
        self.gemm_as(p, OutputDtype::F16)?.into_f16()
    }
    /// Gated dual GEMM, f16 output.
    fn dual_gemm(&self, p: &DualGemm) -> Result<F16Tensor> {
        self.dual_gemm_as(p, OutputDtype::F16)?.into_f16()
    }
    /// Grouped GEMM, f16 outputs.
    fn grouped_gemm(&self, p: &GroupedGemm) -> Result<Vec<F16Tensor>> {
        self.grouped_gemm_as(p, OutputDtype::F16)?.into_iter().map(OutTensor::into_f16).collect()
    }
    /// Grouped GEMM in the MoE form, f16 output.
    fn moe_gemm(&self, p: &MoeGemm) -> Result<F16Tensor> {
        self.moe_gemm_as(p, OutputDtype::F16)?.into_f16()
    }

    /// W4A16 (SPEC §8) batched GEMV: the vector is a 16-bit tensor; output in `dtype`.
    fn gemv16_as(&self, p: &Gemv<OutTensor>, dtype: OutputDtype) -> Result<OutTensor>;
    /// W4A16 GEMM: 16-bit activations times NVFP4 weights, output in `dtype`.
    fn gemm16_as(&self, p: &Gemm<OutTensor>, dtype: OutputDtype) -> Result<OutTensor>;
    /// W4A16 gated dual GEMM, output in `dtype`.
    fn dual_gemm16_as(&self, p: &DualGemm<OutTensor>, dtype: OutputDtype) -> Result<OutTensor>;
    /// W4A16 grouped GEMM, all groups in one launch, outputs in `dtype`.
    fn grouped_gemm16_as(&self, p: &GroupedGemm<OutTensor>, dtype: OutputDtype) -> Result<Vec<OutTensor>>;
    /// W4A16 grouped GEMM in the MoE form (16-bit tokens), output in `dtype`.
    fn moe_gemm16_as(&self, p: &MoeGemm<OutTensor>, dtype: OutputDtype) -> Result<OutTensor>;
}
