//! Seeded W4A16 generators (SPEC §8), in two tiers:
//!
//! - [`Tier::Exact`]: activations drawn from {0, ±0.5, ±1, ±1.5, ±2} times one power of two per
//!   tensor (2^-2 ..= 2^2), weights from the operation's SPEC §5 distribution (the dual GEMM's
//!   with the grouped GEMM's integer scales {1, 2}, so that its sums are exact too), each weight
//!   with a power-of-two global scale (2^-2 ..= 2^1). Every product is then a multiple of
//!   0.25 × 2^e (e the activation's exponent) of magnitude at most 144 such units (weights are
//!   multiples of 0.5 up to 18 = 6 × 3: 36 halves; activations multiples of 0.5 × 2^e up to
//!   2 × 2^e: 4 such halves), so every partial sum of K products is an integer number of units
//!   below 2^24 while K ≤ [`EXACT_MAX_K`]: exact in FP32 in any order, and a correct kernel is
//!   bit-identical to the reference (given a power-of-two alpha).
//! - [`Tier::Random`]: activations from a bell-shaped distribution (the sum of four uniforms,
//!   centred and scaled to variance 1) rounded to the activation type, and weights quantized
//!   from the same distribution in the ModelOpt convention (a global scale of amax / 2688, not a
//!   power of two). Sums are inexact: SPEC §4's tolerance.
//!
//! Scales are in the plain layout; [`Problem16::into_layout`] converts them. `nan_mark.rs` sets
//! one weight block scale to NaN.

use std::fmt;
use std::str::FromStr;

use super::generate::Dist;
use super::{Problem16, ProblemKind, Rng, Shape};
use crate::format::{quantize, GlobalScale, Nvfp4Tensor, OutTensor, OutputDtype, ScaleLayout};
use crate::memory::{checked_product, checked_sum, ensure_host};
use crate::ops::{DualGemm, Gemm, Gemv, GroupedGemm, MoeGemm};
use crate::{Error, Result};

/// The largest K of the exact tier: 144 K units must stay at most 2^24 (see the module docs).
pub const EXACT_MAX_K: usize = (1 << 24) / 144 / 16 * 16;

/// Which data a W4A16 generator draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    /// FP32 sums exact in any order: bit-identical results.
    Exact,
    /// Bell-shaped activations and quantized weights: SPEC §4's tolerance.
    Random,
}

impl Tier {
    /// Both, exact first.
    pub const ALL: [Tier; 2] = [Tier::Exact, Tier::Random];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Exact => "exact",
            Tier::Random => "random",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Tier {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Tier::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| Error::Invalid(format!("unknown tier `{s}` (exact, random)")))
    }
}

/// Host bytes the generator holds at most: every operand at the larger of its two encodings
/// (NVFP4 with plain scales, or 2 bytes an element) and, in the random tier, the largest operand
/// as f32 while it is drawn and quantized. `None` on overflow.
pub fn generate16_bytes(shape: &Shape, tier: Tier) -> Option<u64> {
    let ops = shape.operands();
    let each = ops.iter().map(|&[l, rows, k]| {
        let nvfp4 = Nvfp4Tensor::bytes_for(l, rows, k, ScaleLayout::Plain)?;
        Some(nvfp4.max(checked_product(&[l, rows, k, 2])?))
    });
    let scratch = match tier {
        Tier::Exact => Some(0),
        Tier::Random => {
            ops.iter().map(|&[l, rows, k]| checked_product(&[l, rows, k, 4])).try_fold(0u64, |m, b| Some(m.max(b?)))
        }
    };
    checked_sum(each.chain([scratch]))
}

/// One value of the exact tier's activation set, in halves: 0, ±1, ±2, ±3, ±4.
const EXACT_HALVES: [i8; 9] = [0, 1, -1, 2, -2, 3, -3, 4, -4];

/// The random tier's bell-shaped draw: four uniforms summed, centred, scaled to variance 1.
fn bell(rng: &mut Rng) -> f32 {
    let s: f32 = (0..4).map(|_| rng.unit_f32()).sum();
    (s - 2.0) * 3f32.sqrt()
}

/// `2^e` for a small `e`.
fn pow2(e: i32) -> f32 {
    2f32.powi(e)
}

/// The draws of one problem.
struct Draw {
    rng: Rng,
    tier: Tier,
    act: OutputDtype,
    /// The exact tier's weight distribution.
    dist: Dist,
}

impl Draw {
    /// A dense activation `[l, rows, k]`.
    fn activation(&mut self, l: usize, rows: usize, k: usize) -> Result<OutTensor> {
        let n = l * rows * k;
        let bits = match self.tier {
            Tier::Exact => {
                let scale = pow2(self.rng.below(5) as i32 - 2) * 0.5;
                let act = self.act;
                let rng = &mut self.rng;
                (0..n).map(|_| act.round_f32(EXACT_HALVES[rng.below(9) as usize] as f32 * scale)).collect()
            }
            Tier::Random => {
                let act = self.act;
                let rng = &mut self.rng;
                (0..n).map(|_| act.round_f32(bell(rng))).collect()
            }
        };
        OutTensor::new(self.act, [l, rows, k], bits)
    }

    /// An NVFP4 weight `[l, rows, k]` with its global scale.
    fn weight(&mut self, l: usize, rows: usize, k: usize) -> Result<Nvfp4Tensor> {
        match self.tier {
            Tier::Exact => {
                let t = self.dist.tensor(&mut self.rng, l, rows, k)?;
                Ok(t.with_global_scale(pow2(self.rng.below(4) as i32 - 2)))
            }
            Tier::Random => {
                let rng = &mut self.rng;
                let data: Vec<f32> = (0..l * rows * k).map(|_| bell(rng)).collect();
                quantize(&data, l, rows, k, GlobalScale::Auto)
            }
        }
    }
}

/// Refuses a shape whose K the exact tier cannot make exact (above [`EXACT_MAX_K`]).
pub fn check_exact_tier(shape: &Shape) -> Result<()> {
    let k_max = shape.operands().iter().map(|d| d[2]).max().unwrap_or(0);
    if k_max > EXACT_MAX_K {
        return Err(Error::Invalid(format!(
            "the exact W4A16 tier makes FP32 sums exact for K <= {EXACT_MAX_K}, this shape has K = {k_max}; \
             use the random tier"
        )));
    }
    Ok(())
}

/// Draws a W4A16 problem of `shape` with `act` activations from `seed` in `tier` (see the module
/// docs); plain scales, no alpha. The exact tier refuses K above [`EXACT_MAX_K`] (its sums would
/// not be exact); the host's memory is checked first.
pub fn generate16(shape: &Shape, act: OutputDtype, tier: Tier, seed: u64) -> Result<Problem16> {
    shape.validate()?;
    if tier == Tier::Exact {
        check_exact_tier(shape)?;
    }
    ensure_host(&format!("generating W4A16 {} {shape}", shape.kind()), generate16_bytes(shape, tier))?;
    let dist = match shape.kind() {
        ProblemKind::DualGemm => Dist::of(ProblemKind::GroupedGemm),
        kind => Dist::of(kind),
    };
    let mut d = Draw { rng: Rng::new(seed), tier, act, dist };
    Ok(match *shape {
        Shape::Gemv { m, k, l } => {
            let a = d.weight(l, m, k)?;
            let b = d.activation(l, 1, k)?;
            Problem16::Gemv(Gemv::new(a, b, None)?)
        }
        Shape::Gemm { m, n, k, l } => {
            let a = d.activation(l, m, k)?;
            let b = d.weight(l, n, k)?;
            Problem16::Gemm(Gemm::new(a, b, None)?)
        }
        Shape::DualGemm { m, n, k, l } => {
            let a = d.activation(l, m, k)?;
            let b1 = d.weight(l, n, k)?;
            let b2 = d.weight(l, n, k)?;
            Problem16::DualGemm(DualGemm::new(a, b1, b2, None)?)
        }
        Shape::GroupedGemm { ref groups } => {
            let gs = groups
                .iter()
                .map(|&(m, n, k)| {
                    let a = d.activation(1, m, k)?;
                    let b = d.weight(1, n, k)?;
                    Gemm::new(a, b, None)
                })
                .collect::<Result<_>>()?;
            Problem16::GroupedGemm(GroupedGemm::new(gs)?)
        }
        Shape::Moe { n, k, ref counts } => {
            let a = d.activation(1, counts.iter().sum(), k)?;
            let b = d.weight(counts.len(), n, k)?;
            let offsets = super::generate::moe_offsets(counts)?;
            Problem16::Moe(MoeGemm::new(a, b, offsets, None)?)
        }
    })
}
