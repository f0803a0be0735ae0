//! Problem descriptions: the four operation kinds, their shapes, the SPEC catalogue of test and
//! benchmark shapes, and the seeded generators with the SPEC value distributions; W4A16 problems
//! (SPEC §8: 16-bit activations, NVFP4 weights) and their two generator tiers.

mod catalogue;
mod extra;
mod footprint;
mod generate;
mod generate16;
mod instance;
mod nan_mark;
mod rng;
mod w4a16;

pub use catalogue::{bench_shapes, large_shapes, test_shapes, Case};
pub use extra::extra_shapes;
pub use footprint::cpu_working_bytes;
pub use generate::generate;
pub use generate16::{check_exact_tier, generate16, generate16_bytes, Tier, EXACT_MAX_K};
pub use instance::{Output, Problem};
pub use rng::Rng;
pub use w4a16::Problem16;

use std::fmt;
use std::str::FromStr;

use crate::format::{Nvfp4Meta, OutputDtype, ScaleLayout};
use crate::ops::{Act, Group, MoeAlpha, Op, OpMeta, OutMeta};
use crate::{Error, Result};

/// The four operations, named as on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProblemKind {
    /// Batched GEMV.
    Gemv,
    /// GEMM.
    Gemm,
    /// Gated dual GEMM (SwiGLU).
    DualGemm,
    /// Grouped GEMM (MoE).
    GroupedGemm,
}

impl ProblemKind {
    /// All four, in SPEC order.
    pub const ALL: [ProblemKind; 4] =
        [ProblemKind::Gemv, ProblemKind::Gemm, ProblemKind::DualGemm, ProblemKind::GroupedGemm];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            ProblemKind::Gemv => "gemv",
            ProblemKind::Gemm => "gemm",
            ProblemKind::DualGemm => "dual-gemm",
            ProblemKind::GroupedGemm => "grouped-gemm",
        }
    }

    /// Whether the SPEC generator's data makes every FP32 sum exact, so a correct kernel must be
    /// bit-identical to the reference (SPEC §4).
    pub fn exact_data(self) -> bool {
        self != ProblemKind::DualGemm
    }

    /// The command-line forms of this kind's shapes, as [`Shape::parse`] reads them.
    pub fn shape_forms(self) -> &'static str {
        match self {
            ProblemKind::Gemv => "MxKxL or MxK (L = 1)",
            ProblemKind::Gemm | ProblemKind::DualGemm => "MxNxK or MxNxKxL",
            ProblemKind::GroupedGemm => {
                "m1,m2,../n1,../k1,.. (one N or K for every group) or moe:c1,c2,../N/K (tokens per expert)"
            }
        }
    }
}

impl fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ProblemKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        ProblemKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| Error::Invalid(format!("unknown problem `{s}` (gemv, gemm, dual-gemm, grouped-gemm)")))
    }
}

/// What starts the command-line and display form of a [`Shape::Moe`].
pub const MOE_PREFIX: &str = "moe:";

/// The dimensions of one problem instance.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    /// M x K x L.
    Gemv { m: usize, k: usize, l: usize },
    /// M x N x K x L.
    Gemm { m: usize, n: usize, k: usize, l: usize },
    /// M x N x K x L.
    DualGemm { m: usize, n: usize, k: usize, l: usize },
    /// (M, N, K) per group, L = 1.
    GroupedGemm { groups: Vec<(usize, usize, usize)> },
    /// The grouped GEMM's MoE form ([`crate::MoeGemm`]): E = `counts.len()` experts sharing N
    /// and K, `counts[e]` tokens routed to expert e, T = the sum (every token routed; a problem
    /// with rows past its last offset has the shape of its routed rows).
    Moe { n: usize, k: usize, counts: Vec<usize> },
}

impl Shape {
    /// Which operation the shape belongs to.
    pub fn kind(&self) -> ProblemKind {
        match self {
            Shape::Gemv { .. } => ProblemKind::Gemv,
            Shape::Gemm { .. } => ProblemKind::Gemm,
            Shape::DualGemm { .. } => ProblemKind::DualGemm,
            Shape::GroupedGemm { .. } | Shape::Moe { .. } => ProblemKind::GroupedGemm,
        }
    }

    /// Parses the command-line form for `kind`: `MxKxL` (gemv), `MxNxK[xL]` (gemm, dual-gemm),
    /// `m1,m2,../n1,../k1,..` (grouped-gemm; a single N or K applies to every group), or
    /// `moe:c1,c2,../N/K` (grouped-gemm in the MoE form: tokens per expert, one N and K).
    pub fn parse(kind: ProblemKind, s: &str) -> Result<Self> {
        let bad = || Error::Invalid(format!("bad {kind} shape `{s}`: expected {}", kind.shape_forms()));
        let dims = |t: &str, sep: char| -> Result<Vec<usize>> {
            t.split(sep).map(|d| d.trim().parse::<usize>().map_err(|_| bad())).collect()
        };
        let shape = match kind {
            ProblemKind::Gemv => match dims(s, 'x')?[..] {
                [m, k, l] => Shape::Gemv { m, k, l },
                [m, k] => Shape::Gemv { m, k, l: 1 },
                _ => return Err(bad()),
            },
            ProblemKind::Gemm | ProblemKind::DualGemm => {
                let (m, n, k, l) = match dims(s, 'x')?[..] {
                    [m, n, k] => (m, n, k, 1),
                    [m, n, k, l] => (m, n, k, l),
                    _ => return Err(bad()),
                };
                if kind == ProblemKind::Gemm {
                    Shape::Gemm { m, n, k, l }
                } else {
                    Shape::DualGemm { m, n, k, l }
                }
            }
            ProblemKind::GroupedGemm if s.starts_with(MOE_PREFIX) => {
                let parts: Vec<Vec<usize>> =
                    s[MOE_PREFIX.len()..].split('/').map(|p| dims(p, ',')).collect::<Result<_>>()?;
                let [counts, n, k] = &parts[..] else { return Err(bad()) };
                let ([n], [k]) = (&n[..], &k[..]) else { return Err(bad()) };
                Shape::Moe { n: *n, k: *k, counts: counts.clone() }
            }
            ProblemKind::GroupedGemm => {
                let parts: Vec<Vec<usize>> = s.split('/').map(|p| dims(p, ',')).collect::<Result<_>>()?;
                let [ms, ns, ks] = &parts[..] else { return Err(bad()) };
                let g = ms.len();
                let pick =
                    |v: &Vec<usize>, i: usize| if v.len() == 1 { Ok(v[0]) } else { v.get(i).copied().ok_or_else(bad) };
                if (ns.len() != 1 && ns.len() != g) || (ks.len() != 1 && ks.len() != g) {
                    return Err(bad());
                }
                Shape::GroupedGemm {
                    groups: (0..g).map(|i| Ok((ms[i], pick(ns, i)?, pick(ks, i)?))).collect::<Result<_>>()?,
                }
            }
        };
        shape.validate()?;
        Ok(shape)
    }

    /// Rejects zero dimensions and K not a multiple of 16.
    pub fn validate(&self) -> Result<()> {
        let check = |l: usize, m: usize, n: usize, k: usize| crate::format::tensor::check_dims(l, m.min(n), k);
        match *self {
            Shape::Gemv { m, k, l } => check(l, m, 1, k),
            Shape::Gemm { m, n, k, l } | Shape::DualGemm { m, n, k, l } => check(l, m, n, k),
            Shape::GroupedGemm { ref groups } => {
                if groups.is_empty() {
                    return Err(Error::Shape("grouped gemm: no groups".into()));
                }
                groups.iter().try_for_each(|&(m, n, k)| check(1, m, n, k))
            }
            Shape::Moe { n, k, ref counts } => {
                if counts.is_empty() {
                    return Err(Error::Shape("moe gemm: no experts".into()));
                }
                let t = counts.iter().try_fold(0usize, |t, &c| t.checked_add(c));
                match t {
                    Some(0) => {
                        Err(Error::Shape("moe gemm: no tokens (every expert's count is 0), T must be >= 1".into()))
                    }
                    Some(t) if i32::try_from(t).is_ok() => check(counts.len(), t, n, k),
                    _ => Err(Error::Shape(format!("moe gemm: T above {} (offsets are i32)", i32::MAX))),
                }
            }
        }
    }
}

impl Shape {
    /// The operation of this shape as the rules and the router see it (operands in `layout`,
    /// global scales 1, no alpha, outputs made by the backend): no data needed.
    pub fn op_meta(&self, layout: ScaleLayout) -> OpMeta {
        self.op_meta_in(layout, None)
    }

    /// [`Shape::op_meta`] in either mode: W4A4, or W4A16 with `dense` activations (the GEMV's
    /// vector, every other operation's A).
    pub fn op_meta_in(&self, layout: ScaleLayout, dense: Option<OutputDtype>) -> OpMeta {
        let t = |l, rows, k| Nvfp4Meta { l, rows, k, layout, global_scale: 1.0 };
        let x = |l, rows, k| match dense {
            None => Act::Nvfp4(t(l, rows, k)),
            Some(dtype) => Act::Dense(OutMeta { shape: [l, rows, k], dtype }),
        };
        match *self {
            Shape::Gemv { m, k, l } => Op::Gemv { a: t(l, m, k), b: x(l, 1, k), alpha: None, c: None },
            Shape::Gemm { m, n, k, l } => Op::Gemm { a: x(l, m, k), b: t(l, n, k), alpha: None, c: None },
            Shape::DualGemm { m, n, k, l } => {
                Op::DualGemm { a: x(l, m, k), b1: t(l, n, k), b2: t(l, n, k), alpha: None, c: None }
            }
            Shape::GroupedGemm { ref groups } => Op::GroupedGemm(
                groups.iter().map(|&(m, n, k)| Group { a: x(1, m, k), b: t(1, n, k), alpha: None, c: None }).collect(),
            ),
            Shape::Moe { n, k, ref counts } => Op::MoeGemm {
                a: x(1, counts.iter().sum(), k),
                b: t(counts.len(), n, k),
                offsets: counts.len(),
                alpha: MoeAlpha::One(None),
                c: None,
            },
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |v: Vec<usize>| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
        match self {
            Shape::Gemv { m, k, l } => write!(f, "{m}x{k}x{l}"),
            Shape::Gemm { m, n, k, l } | Shape::DualGemm { m, n, k, l } => {
                write!(f, "{m}x{n}x{k}")?;
                if *l != 1 {
                    write!(f, "x{l}")?;
                }
                Ok(())
            }
            Shape::GroupedGemm { groups } => {
                let ms = join(groups.iter().map(|g| g.0).collect());
                let ns = join(groups.iter().map(|g| g.1).collect());
                let ks = join(groups.iter().map(|g| g.2).collect());
                write!(f, "{ms}/{ns}/{ks}")
            }
            Shape::Moe { n, k, counts } => write!(f, "{MOE_PREFIX}{}/{n}/{k}", join(counts.clone())),
        }
    }
}
