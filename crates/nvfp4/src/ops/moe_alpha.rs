//! The MoE form's alpha ([`MoeAlpha`]): one factor for every expert, as every other operation
//! takes it, or one factor per expert, as a ModelOpt MoE export carries them (each expert's
//! `weight_scale_2`, which differ between experts). The per-expert factors are host values, a
//! device view (read only by the kernels, so a captured CUDA graph may change them between
//! replays) or, in an operation's metadata ([`OpMeta`](super::OpMeta)), their count.
//!
//! Expert e's rows are computed exactly as the scalar alpha computes them with alpha = the
//! expert's factor: `round(alpha_e × global(A) × global(B) × Σ_k ..)`, the factor in f32 in that
//! order (`ops/scalars.rs`).

use super::act::Activation;
use super::scalars::{alpha_rule, check_product};
use crate::{Error, Result};

/// The alpha of a MoE GEMM ([`MoeGemm`](super::MoeGemm)): one optional factor for every expert
/// (absent: 1), or one factor per expert, expert e's at index e, held by `X`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MoeAlpha<X = Vec<f32>> {
    /// One optional FP32 factor applied to every expert (the other operations' alpha).
    One(Option<f32>),
    /// E FP32 factors, one per expert: host values (`Vec<f32>`, `&[f32]`), a device view, or
    /// their count in an operation's metadata.
    PerExpert(X),
}

impl<X> Default for MoeAlpha<X> {
    /// No alpha (a factor of 1 for every expert).
    fn default() -> Self {
        MoeAlpha::One(None)
    }
}

impl<X> From<Option<f32>> for MoeAlpha<X> {
    fn from(alpha: Option<f32>) -> Self {
        MoeAlpha::One(alpha)
    }
}

impl<X> From<f32> for MoeAlpha<X> {
    fn from(alpha: f32) -> Self {
        MoeAlpha::One(Some(alpha))
    }
}

impl From<Vec<f32>> for MoeAlpha {
    fn from(alphas: Vec<f32>) -> Self {
        MoeAlpha::PerExpert(alphas)
    }
}

impl<X> MoeAlpha<X> {
    /// The same alpha with the per-expert factors borrowed.
    pub fn as_ref(&self) -> MoeAlpha<&X> {
        match self {
            MoeAlpha::One(a) => MoeAlpha::One(*a),
            MoeAlpha::PerExpert(x) => MoeAlpha::PerExpert(x),
        }
    }

    /// The same alpha with the per-expert factors held by `f(x)`; the first error stops it.
    pub fn try_map<Y, E>(self, f: impl FnOnce(X) -> std::result::Result<Y, E>) -> std::result::Result<MoeAlpha<Y>, E> {
        Ok(match self {
            MoeAlpha::One(a) => MoeAlpha::One(a),
            MoeAlpha::PerExpert(x) => MoeAlpha::PerExpert(f(x)?),
        })
    }

    /// The same alpha with the per-expert factors held by `f(x)`.
    pub fn map<Y>(self, f: impl FnOnce(X) -> Y) -> MoeAlpha<Y> {
        match self {
            MoeAlpha::One(a) => MoeAlpha::One(a),
            MoeAlpha::PerExpert(x) => MoeAlpha::PerExpert(f(x)),
        }
    }
}

impl<X: AsRef<[f32]>> MoeAlpha<X> {
    /// The per-expert factors as a slice, borrowed.
    pub fn as_slice(&self) -> MoeAlpha<&[f32]> {
        self.as_ref().map(|x| x.as_ref())
    }

    /// Expert `e`'s alpha as the other operations take it: the one alpha, or the expert's own
    /// factor. A shape error when the factors hold no entry `e`.
    pub fn of_expert(&self, e: usize) -> Result<Option<f32>> {
        match self {
            MoeAlpha::One(a) => Ok(*a),
            MoeAlpha::PerExpert(x) => x.as_ref().get(e).map(|&a| Some(a)).ok_or_else(|| {
                Error::Shape(format!("moe gemm: no alpha for expert {e} ({} per-expert alphas)", x.as_ref().len()))
            }),
        }
    }

    /// The scalar rules (`ops/scalars.rs`) for each expert's product of `a` and `b`: the one
    /// alpha, or every per-expert factor (finite, and with the global scales a factor that is
    /// finite and, unless the alpha is 0, not 0), each error naming its expert. The count is
    /// [`Op::validate`](super::Op::validate)'s rule.
    pub fn check_values(&self, a: &impl Activation, b: &impl Activation) -> Result<()> {
        let values = match self {
            MoeAlpha::One(alpha) => return check_product("moe gemm", *alpha, a, b, "b"),
            MoeAlpha::PerExpert(x) => x.as_ref(),
        };
        for (e, &alpha) in values.iter().enumerate() {
            alpha_rule(alpha).map_err(|why| Error::Invalid(format!("moe gemm: expert {e}'s {why}")))?;
            check_product(&format!("moe gemm, expert {e}"), Some(alpha), a, b, "b")?;
        }
        Ok(())
    }
}

/// Per-expert alphas whose count is known: host values, a device view, or the count itself.
pub trait Alphas {
    /// How many factors (one per expert).
    fn count(&self) -> usize;
}

impl Alphas for usize {
    fn count(&self) -> usize {
        *self
    }
}
impl Alphas for [f32] {
    fn count(&self) -> usize {
        self.len()
    }
}
impl Alphas for Vec<f32> {
    fn count(&self) -> usize {
        self.len()
    }
}
impl<X: Alphas + ?Sized> Alphas for &X {
    fn count(&self) -> usize {
        (**self).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_expert_reads_its_own_factor() {
        let per: MoeAlpha = vec![0.5, -2.0, 0.0].into();
        assert_eq!(per.of_expert(1).unwrap(), Some(-2.0));
        assert_eq!(per.of_expert(2).unwrap(), Some(0.0));
        assert!(matches!(per.of_expert(3), Err(Error::Shape(m)) if m.contains("no alpha for expert 3 (3 per-expert")));
        let one: MoeAlpha = Some(0.25).into();
        assert_eq!((one.of_expert(0).unwrap(), one.of_expert(99).unwrap()), (Some(0.25), Some(0.25)));
        assert_eq!(MoeAlpha::<Vec<f32>>::default().of_expert(7).unwrap(), None);
        assert_eq!(per.as_slice().map(<[f32]>::count), MoeAlpha::PerExpert(3));
    }
}
