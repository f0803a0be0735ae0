//! One operation, whatever holds its operands: [`Op`] is generic over the NVFP4 operands (host
//! tensors, device views, or only their [`Nvfp4Meta`]), the MoE offsets and the MoE per-expert
//! alphas (host values, a device view, or their count) and the outputs (device views, their
//! [`OutMeta`], or `()` where the backend makes them). Its rules (which shapes form the operation) are written once, in
//! [`Op::validate`], on the metadata; the host constructors (`Gemm::new`, ...), the CUDA
//! backend's bind step and the Python package all call it, and the router reads the same
//! metadata ([`OpMeta`]).

use super::act::{ActMeta, Activation};
use super::check_product;
use super::moe_alpha::{Alphas, MoeAlpha};
use super::scalars::check_globals;
use crate::format::tensor::check_dims;
use crate::format::{Nvfp4Meta, Nvfp4Tensor, OutputDtype};
use crate::{Error, Result};

/// One operation of SPEC §3 on NVFP4 weight operands `T`, MoE offsets `O`, MoE per-expert
/// alphas `X`, outputs `C` and the activation operand `A` (`T` itself in W4A4; an
/// [`Act`](super::Act) where either form may come, SPEC §8): the activation is `a`, except in the
/// GEMV, whose vector `b` is.
#[derive(Clone, Debug, PartialEq)]
pub enum Op<T, O, X, C, A = T> {
    /// Batched GEMV: B has one row per batch; output `[L, M, 1]`.
    Gemv { a: T, b: A, alpha: Option<f32>, c: C },
    /// GEMM: output `[L, M, N]`.
    Gemm { a: A, b: T, alpha: Option<f32>, c: C },
    /// Gated dual GEMM: `c = silu(A·B1ᵀ) * (A·B2ᵀ)`, alpha applied to each product.
    DualGemm { a: A, b1: T, b2: T, alpha: Option<f32>, c: C },
    /// Grouped GEMM: every group in one launch (L = 1 each), an output per group.
    GroupedGemm(Vec<Group<T, C, A>>),
    /// The grouped GEMM's MoE form: tokens `[1, T, K]` sorted by expert, the experts' weights
    /// `[E, N, K]`, E end rows, one alpha or E (one per expert), output `[1, T, N]`.
    MoeGemm { a: A, b: T, offsets: O, alpha: MoeAlpha<X>, c: C },
}

/// One group of a grouped GEMM: `c = A·Bᵀ` (times alpha), L = 1.
#[derive(Clone, Debug, PartialEq)]
pub struct Group<T, C, A = T> {
    /// `[1, M, K]`, the activation.
    pub a: A,
    /// `[1, N, K]`.
    pub b: T,
    /// The optional FP32 factor before the final rounding.
    pub alpha: Option<f32>,
    /// `[1, M, N]`.
    pub c: C,
}

/// An output's shape and element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutMeta {
    /// `[L, rows, cols]`.
    pub shape: [usize; 3],
    /// f16 or bf16.
    pub dtype: OutputDtype,
}

/// An operation as the rules and the router see it: operand metadata, the offsets' count, the
/// per-expert alphas' count, the outputs' metadata (`None` where the backend makes the outputs)
/// and the activation's form.
pub type OpMeta = Op<Nvfp4Meta, usize, usize, Option<OutMeta>, ActMeta>;

/// An NVFP4 operand whose shape is known.
pub trait Operand {
    /// Its shape, scale layout and global scale.
    fn meta(&self) -> Nvfp4Meta;
}

/// MoE offsets whose count is known.
pub trait Offsets {
    /// How many end rows (one per expert).
    fn count(&self) -> usize;
}

/// An output whose shape may be known.
pub trait Output {
    /// Its shape and type; `None` where the backend makes it.
    fn out_meta(&self) -> Option<OutMeta>;
}

impl Operand for Nvfp4Meta {
    fn meta(&self) -> Nvfp4Meta {
        *self
    }
}
impl Operand for Nvfp4Tensor {
    fn meta(&self) -> Nvfp4Meta {
        Nvfp4Tensor::meta(self)
    }
}
impl<T: Operand + ?Sized> Operand for &T {
    fn meta(&self) -> Nvfp4Meta {
        (**self).meta()
    }
}
impl Offsets for usize {
    fn count(&self) -> usize {
        *self
    }
}
impl Offsets for [i32] {
    fn count(&self) -> usize {
        self.len()
    }
}
impl Offsets for Vec<i32> {
    fn count(&self) -> usize {
        self.len()
    }
}
impl<O: Offsets + ?Sized> Offsets for &O {
    fn count(&self) -> usize {
        (**self).count()
    }
}
impl Output for () {
    fn out_meta(&self) -> Option<OutMeta> {
        None
    }
}
impl Output for OutMeta {
    fn out_meta(&self) -> Option<OutMeta> {
        Some(*self)
    }
}
impl Output for Option<OutMeta> {
    fn out_meta(&self) -> Option<OutMeta> {
        *self
    }
}
impl<C: Output + ?Sized> Output for &C {
    fn out_meta(&self) -> Option<OutMeta> {
        (**self).out_meta()
    }
}

impl<T: Operand, O: Offsets, X: Alphas, C: Output, A: Activation> Op<T, O, X, C, A> {
    /// Its metadata.
    pub fn meta(&self) -> OpMeta {
        self.map(Operand::meta, Activation::act_meta, Offsets::count, Alphas::count, Output::out_meta)
    }

    /// Checks that the operands form the operation and the outputs have its shapes: the rules
    /// every caller shares (typed errors naming the operand and the rule).
    pub fn validate(&self) -> Result<()> {
        self.meta().check()
    }
}

impl<T, O, X, C, A> Op<T, O, X, C, A> {
    /// The same operation over other holders: `f` maps each weight operand (in the order b; b1,
    /// b2; each group's b; the GEMV's matrix a), `fa` each activation (a; each group's a; the
    /// GEMV's b), `g` the offsets, `gx` the per-expert alphas (when the MoE form has them), `h`
    /// each output (one, or each group's in order); the first error stops it.
    #[allow(clippy::type_complexity)]
    pub fn try_map<'s, T2, A2, O2, X2, C2, E>(
        &'s self,
        mut f: impl FnMut(&'s T) -> Result<T2, E>,
        mut fa: impl FnMut(&'s A) -> Result<A2, E>,
        g: impl FnOnce(&'s O) -> Result<O2, E>,
        gx: impl FnOnce(&'s X) -> Result<X2, E>,
        mut h: impl FnMut(&'s C) -> Result<C2, E>,
    ) -> Result<Op<T2, O2, X2, C2, A2>, E> {
        Ok(match self {
            Op::Gemv { a, b, alpha, c } => Op::Gemv { a: f(a)?, b: fa(b)?, alpha: *alpha, c: h(c)? },
            Op::Gemm { a, b, alpha, c } => Op::Gemm { a: fa(a)?, b: f(b)?, alpha: *alpha, c: h(c)? },
            Op::DualGemm { a, b1, b2, alpha, c } => {
                Op::DualGemm { a: fa(a)?, b1: f(b1)?, b2: f(b2)?, alpha: *alpha, c: h(c)? }
            }
            Op::GroupedGemm(groups) => {
                let mut out = Vec::with_capacity(groups.len());
                for x in groups {
                    out.push(Group { a: fa(&x.a)?, b: f(&x.b)?, alpha: x.alpha, c: h(&x.c)? });
                }
                Op::GroupedGemm(out)
            }
            Op::MoeGemm { a, b, offsets, alpha, c } => {
                Op::MoeGemm { a: fa(a)?, b: f(b)?, offsets: g(offsets)?, alpha: alpha.as_ref().try_map(gx)?, c: h(c)? }
            }
        })
    }

    /// [`Op::try_map`] with maps that cannot fail.
    pub fn map<'s, T2, A2, O2, X2, C2>(
        &'s self,
        mut f: impl FnMut(&'s T) -> T2,
        mut fa: impl FnMut(&'s A) -> A2,
        g: impl FnOnce(&'s O) -> O2,
        gx: impl FnOnce(&'s X) -> X2,
        mut h: impl FnMut(&'s C) -> C2,
    ) -> Op<T2, O2, X2, C2, A2> {
        let r: std::result::Result<_, std::convert::Infallible> =
            self.try_map(|t| Ok(f(t)), |x| Ok(fa(x)), |o| Ok(g(o)), |x| Ok(gx(x)), |c| Ok(h(c)));
        match r {
            Ok(op) => op,
            Err(never) => match never {},
        }
    }

    /// Sets the alpha (of every group of a grouped GEMM; one for every expert of the MoE form).
    pub fn set_alpha(&mut self, alpha: Option<f32>) {
        match self {
            Op::Gemv { alpha: a, .. } | Op::Gemm { alpha: a, .. } | Op::DualGemm { alpha: a, .. } => *a = alpha,
            Op::MoeGemm { alpha: a, .. } => *a = MoeAlpha::One(alpha),
            Op::GroupedGemm(groups) => groups.iter_mut().for_each(|g| g.alpha = alpha),
        }
    }

    /// The operation's name in messages.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Gemv { .. } => "gemv",
            Op::Gemm { .. } => "gemm",
            Op::DualGemm { .. } => "dual gemm",
            Op::GroupedGemm(_) => "grouped gemm",
            Op::MoeGemm { .. } => "moe gemm",
        }
    }
}

fn shape_err(s: String) -> Error {
    Error::Shape(s)
}

/// The shape of either kind of operand, as the rules read it.
trait Dims {
    fn lrk(&self) -> (usize, usize, usize);
}
impl Dims for Nvfp4Meta {
    fn lrk(&self) -> (usize, usize, usize) {
        (self.l, self.rows, self.k)
    }
}
impl Dims for ActMeta {
    fn lrk(&self) -> (usize, usize, usize) {
        (self.l(), self.rows(), self.k())
    }
}

fn dims(t: &impl Dims) -> Result<()> {
    let (l, rows, k) = t.lrk();
    check_dims(l, rows, k)
}

fn same_l(what: &str, x: &impl Dims, y: &impl Dims) -> Result<()> {
    let (xl, yl) = (x.lrk().0, y.lrk().0);
    if xl != yl {
        return Err(shape_err(format!("{what}: batch counts differ (L = {xl} vs {yl})")));
    }
    Ok(())
}

fn same_k(what: &str, x: &impl Dims, y: &impl Dims) -> Result<()> {
    let (xk, yk) = (x.lrk().2, y.lrk().2);
    if xk != yk {
        return Err(shape_err(format!("{what}: reduction lengths differ (K = {xk} vs {yk})")));
    }
    Ok(())
}

fn out_is(what: &str, c: Option<OutMeta>, want: [usize; 3]) -> Result<()> {
    match c {
        Some(c) if c.shape != want => {
            Err(shape_err(format!("{what}: the output is {:?}, the operation makes {want:?}", c.shape)))
        }
        _ => Ok(()),
    }
}

impl OpMeta {
    /// The outputs' shapes, one per group for a grouped GEMM.
    pub fn output_shapes(&self) -> Vec<[usize; 3]> {
        match self {
            Op::Gemv { a, .. } => vec![[a.l, a.rows, 1]],
            Op::Gemm { a, b, .. } | Op::DualGemm { a, b1: b, .. } => vec![[a.l(), a.rows(), b.rows]],
            Op::GroupedGemm(groups) => groups.iter().map(|g| [1, g.a.rows(), g.b.rows]).collect(),
            Op::MoeGemm { a, b, .. } => vec![[1, a.rows(), b.rows]],
        }
    }

    /// The activation's form: every group of a grouped GEMM has the same (W4A4 or W4A16 of one
    /// type; [`OpMeta::check`] refuses a mix).
    pub fn activation(&self) -> Option<ActMeta> {
        match self {
            Op::Gemv { b, .. } => Some(*b),
            Op::Gemm { a, .. } | Op::DualGemm { a, .. } | Op::MoeGemm { a, .. } => Some(*a),
            Op::GroupedGemm(groups) => groups.first().map(|g| g.a),
        }
    }

    /// The dense activation type when the operation is W4A16, `None` for W4A4.
    pub fn dense_dtype(&self) -> Option<crate::format::OutputDtype> {
        self.activation().and_then(|a| a.dense_dtype())
    }

    pub(crate) fn check(&self) -> Result<()> {
        let what = self.name();
        match self {
            Op::Gemv { a, b, alpha, c } => {
                dims(a)?;
                dims(b)?;
                same_l(what, a, b)?;
                same_k(what, a, b)?;
                if b.rows() != 1 {
                    return Err(shape_err(format!("gemv: b must have one row per batch, has {}", b.rows())));
                }
                check_product(what, *alpha, a, b, "b")?;
                out_is(what, *c, [a.l, a.rows, 1])
            }
            Op::Gemm { a, b, alpha, c } => {
                dims(a)?;
                dims(b)?;
                same_l(what, a, b)?;
                same_k(what, a, b)?;
                check_product(what, *alpha, a, b, "b")?;
                out_is(what, *c, [a.l(), a.rows(), b.rows])
            }
            Op::DualGemm { a, b1, b2, alpha, c } => {
                dims(a)?;
                for t in [b1, b2] {
                    dims(t)?;
                }
                same_l("dual gemm (a, b1)", a, b1)?;
                same_l("dual gemm (a, b2)", a, b2)?;
                same_k("dual gemm (a, b1)", a, b1)?;
                same_k("dual gemm (a, b2)", a, b2)?;
                if b1.rows != b2.rows {
                    return Err(shape_err(format!("dual gemm: b1 has N = {}, b2 has N = {}", b1.rows, b2.rows)));
                }
                check_product(what, *alpha, a, b1, "b1")?;
                check_product(what, *alpha, a, b2, "b2")?;
                out_is(what, *c, [a.l(), a.rows(), b1.rows])
            }
            Op::GroupedGemm(groups) => {
                if groups.is_empty() {
                    return Err(shape_err("grouped gemm: no groups".into()));
                }
                let mode = groups[0].a.mode();
                for (i, g) in groups.iter().enumerate() {
                    let what = format!("grouped gemm, group {i}");
                    dims(&g.a)?;
                    dims(&g.b)?;
                    same_l(&what, &g.a, &g.b)?;
                    if g.a.l() != 1 {
                        return Err(shape_err(format!(
                            "grouped gemm: group {i} has L = {}, groups must have L = 1",
                            g.a.l()
                        )));
                    }
                    if g.a.mode() != mode {
                        return Err(shape_err(format!(
                            "grouped gemm: group {i}'s activation is {}, group 0's is {mode}: one launch runs one mode",
                            g.a.mode()
                        )));
                    }
                    same_k(&what, &g.a, &g.b)?;
                    check_product(&format!("grouped gemm: group {i}"), g.alpha, &g.a, &g.b, "b")?;
                    out_is(&what, g.c, [1, g.a.rows(), g.b.rows])?;
                }
                Ok(())
            }
            Op::MoeGemm { a, b, offsets, alpha, c } => {
                dims(a)?;
                dims(b)?;
                if a.l() != 1 {
                    return Err(shape_err(format!(
                        "moe gemm: a must be [1, T, K] (the tokens of every expert in one batch), has L = {}",
                        a.l()
                    )));
                }
                same_k(what, a, b)?;
                if *offsets != b.l {
                    return Err(shape_err(format!(
                        "moe gemm: {offsets} offsets for E = {} experts (b is [E, N, K]); one offset per expert",
                        b.l
                    )));
                }
                match alpha {
                    MoeAlpha::One(alpha) => check_product(what, *alpha, a, b, "b")?,
                    // The values are checked where they are known (on the host: MoeGemm::new);
                    // the global scales hold whatever the values.
                    MoeAlpha::PerExpert(count) => {
                        if *count != b.l {
                            return Err(shape_err(format!(
                                "moe gemm: {count} alphas for E = {} experts (b is [E, N, K]); one alpha per \
                                 expert, or one for all",
                                b.l
                            )));
                        }
                        check_globals(what, a, b, "b")?;
                    }
                }
                out_is(what, *c, [1, a.rows(), b.rows])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::ActMeta;
    use crate::ScaleLayout;

    fn t(l: usize, rows: usize, k: usize) -> Nvfp4Meta {
        Nvfp4Meta { l, rows, k, layout: ScaleLayout::Plain, global_scale: 1.0 }
    }

    fn out(shape: [usize; 3]) -> Option<OutMeta> {
        Some(OutMeta { shape, dtype: OutputDtype::F16 })
    }

    /// A W4A4 operation's metadata (every activation NVFP4).
    type W4a4 = Op<Nvfp4Meta, usize, usize, Option<OutMeta>>;

    fn err(op: W4a4) -> String {
        op.validate().expect_err("refused").to_string()
    }

    fn dense(l: usize, rows: usize, k: usize) -> ActMeta {
        crate::ops::Act::Dense(OutMeta { shape: [l, rows, k], dtype: OutputDtype::Bf16 })
    }

    #[test]
    fn operations_that_form_pass() {
        let ok: [W4a4; 5] = [
            Op::Gemv { a: t(2, 7, 48), b: t(2, 1, 48), alpha: Some(0.5), c: out([2, 7, 1]) },
            Op::Gemm { a: t(1, 7, 48), b: t(1, 9, 48), alpha: None, c: None },
            Op::DualGemm { a: t(1, 7, 64), b1: t(1, 9, 64), b2: t(1, 9, 64), alpha: None, c: out([1, 7, 9]) },
            Op::GroupedGemm(vec![
                Group { a: t(1, 3, 16), b: t(1, 4, 16), alpha: None, c: out([1, 3, 4]) },
                Group { a: t(1, 5, 32), b: t(1, 6, 32), alpha: Some(2.0), c: None },
            ]),
            Op::MoeGemm {
                a: t(1, 40, 256),
                b: t(3, 64, 256),
                offsets: 3,
                alpha: MoeAlpha::One(None),
                c: out([1, 40, 64]),
            },
        ];
        for op in ok {
            assert!(op.validate().is_ok(), "{op:?}");
            assert_eq!(op.meta().output_shapes().len(), if let Op::GroupedGemm(g) = &op { g.len() } else { 1 });
            assert_eq!(op.meta().dense_dtype(), None);
        }
    }

    /// W4A16: the dense activation is the GEMM's a and the GEMV's vector b; it follows the
    /// same shape rules, carries no global scale, and one grouped launch has one mode.
    #[test]
    fn dense_activations_follow_the_same_rules() {
        let ok: [OpMeta; 4] = [
            Op::Gemv { a: t(2, 7, 48), b: dense(2, 1, 48), alpha: Some(0.5), c: out([2, 7, 1]) },
            Op::Gemm { a: dense(1, 7, 48), b: t(1, 9, 48), alpha: None, c: None },
            Op::DualGemm { a: dense(1, 7, 64), b1: t(1, 9, 64), b2: t(1, 9, 64), alpha: None, c: None },
            Op::MoeGemm {
                a: dense(1, 40, 256),
                b: t(3, 64, 256),
                offsets: 3,
                alpha: MoeAlpha::One(None),
                c: out([1, 40, 64]),
            },
        ];
        for op in ok {
            assert!(op.check().is_ok(), "{op:?}");
            assert_eq!(op.dense_dtype(), Some(OutputDtype::Bf16));
            assert_eq!(op.meta().output_shapes(), op.output_shapes());
        }
        let gemm = |a, b| Op::Gemm { a, b, alpha: None, c: None };
        let e = |op: OpMeta| op.check().expect_err("refused").to_string();
        assert!(e(gemm(dense(1, 7, 48), t(1, 9, 64))).contains("reduction lengths differ (K = 48 vs 64)"));
        assert!(e(gemm(dense(2, 7, 48), t(1, 9, 48))).contains("batch counts differ (L = 2 vs 1)"));
        assert!(e(gemm(dense(1, 7, 40), t(1, 9, 40))).contains("40"));
        let gemv = Op::Gemv { a: t(1, 7, 48), b: dense(1, 3, 48), alpha: None, c: None };
        assert!(e(gemv).contains("one row per batch, has 3"));
        let mixed = Op::GroupedGemm(vec![
            Group { a: dense(1, 3, 16), b: t(1, 4, 16), alpha: None, c: None },
            Group { a: crate::ops::Act::Nvfp4(t(1, 3, 16)), b: t(1, 4, 16), alpha: None, c: None },
        ]);
        assert!(e(mixed).contains("group 1's activation is W4A4, group 0's is W4A16 (bfloat16)"));
        // The weight's global scale still follows its rule; the dense activation has none.
        let mut w = t(1, 9, 48);
        w.global_scale = 0.0;
        assert!(e(gemm(dense(1, 7, 48), w)).contains("global scale of b"));
    }

    #[test]
    fn each_rule_names_what_breaks_it() {
        let gemm = |a, b, c| Op::Gemm { a, b, alpha: None, c };
        assert!(err(gemm(t(1, 7, 48), t(2, 9, 48), None)).contains("batch counts differ (L = 1 vs 2)"));
        assert!(err(gemm(t(1, 7, 48), t(1, 9, 64), None)).contains("reduction lengths differ (K = 48 vs 64)"));
        assert!(err(gemm(t(1, 7, 48), t(1, 9, 48), out([1, 9, 7]))).contains("output is [1, 9, 7]"));
        assert!(err(gemm(t(1, 7, 40), t(1, 9, 40), None)).contains("40"));
        let gemv = Op::Gemv { a: t(1, 7, 48), b: t(1, 2, 48), alpha: None, c: None };
        assert!(err(gemv).contains("one row per batch, has 2"));
        let nan = Op::Gemm { a: t(1, 7, 48), b: t(1, 9, 48), alpha: Some(f32::NAN), c: None };
        assert!(err(nan).contains("alpha"));
        let dual = Op::DualGemm { a: t(1, 7, 64), b1: t(1, 9, 64), b2: t(1, 8, 64), alpha: None, c: None };
        assert!(err(dual).contains("b1 has N = 9, b2 has N = 8"));
        assert!(err(Op::GroupedGemm(vec![])).contains("no groups"));
        let g = Group { a: t(2, 3, 16), b: t(2, 4, 16), alpha: None, c: None };
        assert!(err(Op::GroupedGemm(vec![g])).contains("group 0 has L = 2"));
        let moe = |a, b, offsets| Op::MoeGemm { a, b, offsets, alpha: MoeAlpha::One(None), c: None };
        assert!(err(moe(t(2, 40, 256), t(3, 64, 256), 3)).contains("has L = 2"));
        assert!(err(moe(t(1, 40, 256), t(3, 64, 256), 4)).contains("4 offsets for E = 3 experts"));
        assert!(err(moe(t(1, 40, 256), t(3, 64, 128), 3)).contains("reduction lengths"));
        // Per-expert alphas: one per expert; their values are the holder's to check, the global
        // scales the rules'.
        let per = |b, n| Op::MoeGemm { a: t(1, 40, 256), b, offsets: 3, alpha: MoeAlpha::PerExpert(n), c: None };
        assert!(per(t(3, 64, 256), 3).validate().is_ok());
        assert!(err(per(t(3, 64, 256), 2)).contains("2 alphas for E = 3 experts"));
        assert!(err(per(t(3, 64, 256), 4)).contains("4 alphas for E = 3 experts"));
        let mut bad = t(3, 64, 256);
        bad.global_scale = f32::INFINITY;
        assert!(err(per(bad, 3)).contains("global scale of b"));
        // Setting one alpha replaces the per-expert ones.
        let mut op = per(t(3, 64, 256), 2);
        op.set_alpha(Some(0.5));
        assert!(matches!(op, Op::MoeGemm { alpha: MoeAlpha::One(Some(a)), .. } if a == 0.5));
        assert!(op.validate().is_ok());
    }
}
