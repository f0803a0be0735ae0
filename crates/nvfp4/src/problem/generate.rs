//! Seeded generators with the SPEC §5 value distributions.

use super::Problem;
use super::{Rng, Shape};
use crate::format::{f32_to_e4m3, Nvfp4Tensor, ScaleLayout};
use crate::memory::ensure_host;
use crate::ops::{DualGemm, Gemm, Gemv, GroupedGemm, MoeGemm};
use crate::problem::ProblemKind;
use crate::{Error, Result};

/// How one operand's bytes and scales are drawn.
#[derive(Clone, Copy)]
pub(super) enum Dist {
    /// Byte uniform in 0..=3; scale value uniform in {0, 1, 2}.
    Gemv,
    /// Byte uniform in 0..=255; scale value uniform in {0, 1, 2, 3}.
    Gemm,
    /// Byte uniform in 0..=254 then `& 0xBB`; scale uniform [0, 1) rounded to E4M3.
    Dual,
    /// Byte as `Dual`; scale value uniform in {1, 2}.
    Grouped,
}

impl Dist {
    pub(super) fn of(kind: ProblemKind) -> Self {
        match kind {
            ProblemKind::Gemv => Dist::Gemv,
            ProblemKind::Gemm => Dist::Gemm,
            ProblemKind::DualGemm => Dist::Dual,
            ProblemKind::GroupedGemm => Dist::Grouped,
        }
    }

    fn byte(self, rng: &mut Rng) -> u8 {
        match self {
            Dist::Gemv => rng.below(4) as u8,
            Dist::Gemm => rng.below(256) as u8,
            Dist::Dual | Dist::Grouped => rng.below(255) as u8 & 0xBB,
        }
    }

    fn scale(self, rng: &mut Rng) -> u8 {
        match self {
            Dist::Gemv => f32_to_e4m3(rng.below(3) as f32),
            Dist::Gemm => f32_to_e4m3(rng.below(4) as f32),
            Dist::Dual => f32_to_e4m3(rng.unit_f32()),
            Dist::Grouped => f32_to_e4m3(1.0 + rng.below(2) as f32),
        }
    }

    pub(super) fn tensor(self, rng: &mut Rng, l: usize, rows: usize, k: usize) -> Result<Nvfp4Tensor> {
        let values = (0..l * rows * k / 2).map(|_| self.byte(rng)).collect();
        let scales = (0..l * rows * k / 16).map(|_| self.scale(rng)).collect();
        Nvfp4Tensor::new(l, rows, k, values, scales, ScaleLayout::Plain)
    }
}

/// Draws a problem of `shape` from `seed` with the SPEC distributions (the MoE form with the
/// grouped GEMM's); scales in the plain layout.
/// The operands' bytes are checked against the host's memory first ([`crate::memory`]).
pub fn generate(shape: &Shape, seed: u64) -> Result<Problem> {
    shape.validate()?;
    let what = format!("generating {} {shape}", shape.kind());
    ensure_host(&what, shape.input_bytes(ScaleLayout::Plain))?;
    let mut rng = Rng::new(seed);
    let d = Dist::of(shape.kind());
    Ok(match *shape {
        Shape::Gemv { m, k, l } => {
            let a = d.tensor(&mut rng, l, m, k)?;
            let b = d.tensor(&mut rng, l, 1, k)?;
            Problem::Gemv(Gemv::new(a, b, None)?)
        }
        Shape::Gemm { m, n, k, l } => {
            let a = d.tensor(&mut rng, l, m, k)?;
            let b = d.tensor(&mut rng, l, n, k)?;
            Problem::Gemm(Gemm::new(a, b, None)?)
        }
        Shape::DualGemm { m, n, k, l } => {
            let a = d.tensor(&mut rng, l, m, k)?;
            let b1 = d.tensor(&mut rng, l, n, k)?;
            let b2 = d.tensor(&mut rng, l, n, k)?;
            Problem::DualGemm(DualGemm::new(a, b1, b2, None)?)
        }
        Shape::GroupedGemm { ref groups } => {
            let gs = groups
                .iter()
                .map(|&(m, n, k)| {
                    let a = d.tensor(&mut rng, 1, m, k)?;
                    let b = d.tensor(&mut rng, 1, n, k)?;
                    Gemm::new(a, b, None)
                })
                .collect::<Result<_>>()?;
            Problem::GroupedGemm(GroupedGemm::new(gs)?)
        }
        Shape::Moe { n, k, ref counts } => {
            let t = counts.iter().sum();
            let a = d.tensor(&mut rng, 1, t, k)?;
            let b = d.tensor(&mut rng, counts.len(), n, k)?;
            Problem::Moe(MoeGemm::new(a, b, moe_offsets(counts)?, None)?)
        }
    })
}

/// The MoE offsets of `counts` tokens per expert: the running sums (end rows). A shape's
/// `validate()` bounds T by `i32::MAX`, so every sum converts for a valid shape.
pub(super) fn moe_offsets(counts: &[usize]) -> Result<Vec<i32>> {
    counts
        .iter()
        .scan(0usize, |end, &c| {
            *end = end.saturating_add(c);
            Some(i32::try_from(*end).map_err(|_| Error::Shape(format!("moe gemm: T above {}", i32::MAX))))
        })
        .collect()
}
