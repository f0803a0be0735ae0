//! The MoE form of the grouped GEMM: every expert's weights in one `[E, N, K]` tensor, the tokens
//! sorted by expert in one `[1, T, K]` tensor, and per-expert end offsets as `torch._grouped_mm`
//! takes them. Also the backend-neutral plumbing between this form and the list of groups: each
//! expert's GEMM as a [`Gemm`] of slices, and the per-expert outputs assembled into `[1, T, N]`.

use std::ops::Range;

use super::act::HostActivation;
use super::{Gemm, HostOp, MoeAlpha, Op};
use crate::format::{Nvfp4Tensor, OutTensor, OutputDtype};
use crate::{Error, Result};

/// Grouped GEMM in the MoE form: row t of the output, for t in
/// `offsets[e-1]..offsets[e]` (`0..offsets[0]` for e = 0), is
/// `f16(alpha_e · global(A) · global(B) · Σ_k A[0,t,k] · B[e,n,k])` (or bf16), exactly the
/// [`Gemm`] of that slice of A against `B[e]` with alpha `alpha_e`: the one alpha of every expert,
/// or expert e's own ([`MoeAlpha`]). Output `[1, T, N]`. Rows at or past `offsets[E-1]` belong to no
/// expert: no backend writes them (the CPU reference returns zeros there). An expert with
/// `offsets[e] == offsets[e-1]` has no tokens and is allowed.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeGemm<A = Nvfp4Tensor> {
    /// `[1, T, K]`: the tokens, sorted by expert (NVFP4, or 16-bit for W4A16).
    pub a: A,
    /// `[E, N, K]`: all experts' weights, expert e in batch e.
    pub b: Nvfp4Tensor,
    /// E entries: `offsets[e]` is the end row (exclusive) of expert e's tokens in A.
    pub offsets: Vec<i32>,
    /// The FP32 factor applied before the final rounding: one (optional) for every expert, or
    /// E, one per expert.
    pub alpha: MoeAlpha,
}

impl<A: HostActivation> MoeGemm<A> {
    /// Checks that A is `[1, T, K]`, B is `[E, N, K]` with the same K, there is one offset per
    /// expert, the offsets do not decrease and lie in `0..=T`, and the alpha is one (an
    /// `Option<f32>`) or one per expert (a `Vec<f32>` of E), each following the scalar rules
    /// (`ops/scalars.rs`: finite, its factor with the global scales finite and not rounding to 0).
    pub fn new(a: A, b: Nvfp4Tensor, offsets: Vec<i32>, alpha: impl Into<MoeAlpha>) -> Result<Self> {
        let p = Self { a, b, offsets, alpha: alpha.into() };
        p.validate()?;
        Ok(p)
    }

    /// The rules of [`MoeGemm::new`], checked again: the fields are public, so every helper
    /// below re-checks before it slices.
    pub fn validate(&self) -> Result<()> {
        self.op().validate()?;
        self.alpha.check_values(&self.a, &self.b)?;
        let t = self.tokens();
        let mut prev = 0i64;
        for (i, &o) in self.offsets.iter().enumerate() {
            if o < 0 || o as i64 > t as i64 {
                return Err(Error::Shape(format!("moe gemm: offsets[{i}] = {o} is outside 0..={t} (T = rows of a)")));
            }
            if (o as i64) < prev {
                return Err(Error::Shape(format!(
                    "moe gemm: offsets must not decrease, offsets[{i}] = {o} < offsets[{}] = {prev}",
                    i - 1
                )));
            }
            prev = o as i64;
        }
        Ok(())
    }

    /// As the generic operation.
    pub fn op(&self) -> HostOp<'_, &A> {
        Op::MoeGemm { a: &self.a, b: &self.b, offsets: self.offsets.as_slice(), alpha: self.alpha.as_slice(), c: () }
    }

    /// Expert count E.
    pub fn experts(&self) -> usize {
        self.b.l()
    }
    /// Token count T (rows of A and of the output).
    pub fn tokens(&self) -> usize {
        self.a.act_meta().rows()
    }
    /// (E, T, N, K).
    pub fn etnk(&self) -> (usize, usize, usize, usize) {
        (self.experts(), self.tokens(), self.b.rows(), self.a.act_meta().k())
    }

    /// Rows of A (and of the output) of every expert, in expert order; empty for an expert
    /// without tokens. Rows from the last range's end to T belong to no expert.
    pub fn expert_rows(&self) -> Result<Vec<Range<usize>>> {
        self.validate()?;
        let ends = self.offsets.iter().map(|&o| o as usize);
        Ok(std::iter::once(0).chain(ends.clone()).zip(ends).map(|(s, e)| s..e).collect())
    }

    /// Rows owned by an expert: `offsets[E-1]`.
    pub fn routed_tokens(&self) -> usize {
        self.offsets.last().map_or(0, |&o| o.max(0) as usize)
    }

    /// The experts with at least one token, in order.
    pub fn routed_experts(&self) -> Result<Vec<usize>> {
        Ok(self.expert_rows()?.iter().enumerate().filter(|(_, r)| !r.is_empty()).map(|(e, _)| e).collect())
    }

    /// Expert `e`'s GEMM: its rows of A against `B[e]`, `[1, M_e, K]` x `[1, N, K]`, with the
    /// expert's alpha (the one alpha, or its own) and the same global scales, scales in the
    /// operands' layouts. An expert without tokens
    /// (or past E) is a shape error: a GEMM has M >= 1.
    pub fn expert_gemm(&self, e: usize) -> Result<Gemm<A>> {
        let rows = self
            .expert_rows()?
            .into_iter()
            .nth(e)
            .ok_or_else(|| Error::Shape(format!("moe gemm: expert {e} of {} does not exist", self.experts())))?;
        if rows.is_empty() {
            return Err(Error::Shape(format!("moe gemm: expert {e} has no tokens, so no GEMM")));
        }
        let a = self.a.slice_rows(0, rows)?;
        let b = self.b.slice_rows(e, 0..self.b.rows())?;
        Gemm::new(a, b, self.alpha.of_expert(e)?)
    }

    /// The output `[1, T, N]` in `dtype` from expert outputs `(e, [1, M_e, N])` of that type:
    /// each written to expert e's rows, every other row zero. An output of the wrong shape or type,
    /// or for an expert without tokens, is a shape error.
    pub fn assemble(
        &self,
        dtype: OutputDtype,
        parts: impl IntoIterator<Item = (usize, OutTensor)>,
    ) -> Result<OutTensor> {
        let ranges = self.expert_rows()?;
        let (_, t, n, _) = self.etnk();
        let mut bits = vec![0u16; t * n];
        for (e, out) in parts {
            let rows = ranges.get(e).filter(|r| !r.is_empty()).ok_or_else(|| {
                Error::Shape(format!("moe gemm: an output for expert {e}, which has no tokens or does not exist"))
            })?;
            if out.shape() != [1, rows.len(), n] || out.dtype() != dtype {
                return Err(Error::Shape(format!(
                    "moe gemm: expert {e}'s output is {} {:?}, expected {dtype} [1, {}, {n}]",
                    out.dtype(),
                    out.shape(),
                    rows.len()
                )));
            }
            bits[rows.start * n..rows.end * n].copy_from_slice(out.bits());
        }
        OutTensor::new(dtype, [1, t, n], bits)
    }
}
