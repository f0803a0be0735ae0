//! The W4A16 cases of `nvfp4 check` (SPEC §8) and the entry point that runs them on any backend.
//!
//! Each operation's cases are its SPEC §6 test shapes, a few decode shapes (GEMM at M = 1 and 16,
//! SPEC §9), then `check`'s edge shapes ([`extra_shapes`]: M and N of 1, 7, 40, 130, ..; K of
//! one, three or 257 blocks, so K % 32 == 16; L = 3; random group lists; the MoE form's
//! routings). Case n takes the n-th of a cycle through all sixteen combinations of tier (exact or
//! random), activation type, output type (the activation's or the other) and the scale layout
//! the backend is given, so consecutive cases alternate tiers; every third case carries an alpha
//! (0.5 on exact data, a power of two, so results stay exact; 0.75 on random data; one per
//! expert in the MoE form with an even expert count, [`expert_alphas`](super::expert_alphas)),
//! and every seventh one weight block scale of NaN.
//!
//! The expected output is [`reference16`], computed in the check
//! independently of the CPU backend, so a CPU run tests that backend. The exact tier is compared
//! bit for bit, except the dual GEMM's (its SiLU is approximate on the GPU: SPEC §4 keeps it to
//! the tolerance); the random tier within the tolerance ([`compare16`]), the dual GEMM's widened
//! per element by the slack of [`gate_slack`](super::gate_slack): the worst-case error of an FP32
//! sum in any order, carried through silu(x1) · x2, which amplifies it where x2 nearly cancels.
//! A backend with no kernel for a case fails it with the error that says why (on the CUDA backend,
//! the route's rule of every family).

use super::compare16::{compare16, compare16_within};
use super::gate_slack::dual_slack;
use super::reference16::{dual_abs_products, dual_products, gate, reference16};
use super::{Mode, Report};
use crate::format::{OutputDtype, ScaleLayout};
use crate::ops::Backend;
use crate::problem::{extra_shapes, generate16, test_shapes, Problem16, ProblemKind, Shape, Tier};
use crate::Result;

/// One W4A16 case: a shape, its data and how the backend gets it.
#[derive(Clone, Debug, PartialEq)]
pub struct Case16 {
    /// `test:N` (SPEC shapes), `decode:N` (GEMM at small M) or `extra:N` (edge shapes).
    pub label: String,
    /// The dimensions.
    pub shape: Shape,
    /// Generator seed.
    pub seed: u64,
    /// Which data ([`Tier`]).
    pub tier: Tier,
    /// The activation's type.
    pub act: OutputDtype,
    /// The output's type.
    pub out: OutputDtype,
    /// The weights' scale layout handed to the backend (the reference reads them plain).
    pub layout: ScaleLayout,
    /// The user alpha (the weights' global scales multiply it).
    pub alpha: Option<f32>,
    /// Whether one weight block scale is NaN.
    pub nan_scale: bool,
}

impl Case16 {
    /// Whether its tolerance is widened by the gate's slack ([`gate_slack`](super::gate_slack)):
    /// the dual GEMM's random tier, whose FP32 sums' order the gate amplifies.
    pub fn gate_slack(&self) -> bool {
        self.tier == Tier::Random && self.shape.kind() == ProblemKind::DualGemm
    }

    /// How its output is compared: bit for bit on exact data, except the dual GEMM's; the dual
    /// GEMM's random tier within the tolerance plus [`Case16::gate_slack`]'s slack.
    pub fn mode(&self) -> Mode {
        if self.tier == Tier::Exact && self.shape.kind() != ProblemKind::DualGemm {
            Mode::BitExact
        } else {
            Mode::Tolerance
        }
    }
}

/// `bf16` or `f16`.
pub fn short(d: OutputDtype) -> &'static str {
    match d {
        OutputDtype::F16 => "f16",
        OutputDtype::Bf16 => "bf16",
    }
}

/// GEMM at decode sizes: the contest GEMM benchmark shapes at M = 1, and one at M = 16.
fn decode_shapes(kind: ProblemKind) -> Vec<Shape> {
    match kind {
        ProblemKind::Gemm => [(1, 7168, 16384), (1, 4096, 7168), (1, 7168, 2048), (16, 4096, 7168)]
            .into_iter()
            .map(|(m, n, k)| Shape::Gemm { m, n, k, l: 1 })
            .collect(),
        ProblemKind::Gemv | ProblemKind::DualGemm | ProblemKind::GroupedGemm => Vec::new(),
    }
}

/// The combination of case `n`: bit 0 the tier, bit 1 the activation type, bit 2 whether the
/// output type differs, bit 3 the layout; stepping by 5 (odd) visits all sixteen in any sixteen
/// consecutive cases and alternates the tier.
fn combination(n: usize) -> (Tier, OutputDtype, OutputDtype, ScaleLayout) {
    let c = (n * 5) % 16;
    let tier = if c & 1 == 0 { Tier::Exact } else { Tier::Random };
    let act = if c & 2 == 0 { OutputDtype::Bf16 } else { OutputDtype::F16 };
    let other = if act == OutputDtype::Bf16 { OutputDtype::F16 } else { OutputDtype::Bf16 };
    let out = if c & 4 == 0 { act } else { other };
    let layout = if c & 8 == 0 { ScaleLayout::Plain } else { ScaleLayout::Blocked };
    (tier, act, out, layout)
}

/// The W4A16 cases of `kind` (see the module docs), case n seeded `seed + n`.
pub fn cases16(kind: ProblemKind, seed: u64) -> Vec<Case16> {
    let labelled = |set: &str, shapes: Vec<Shape>| {
        let set = set.to_string();
        shapes.into_iter().enumerate().map(move |(i, s)| (format!("{set}:{i}"), s))
    };
    labelled("test", test_shapes(kind))
        .chain(labelled("decode", decode_shapes(kind)))
        .chain(labelled("extra", extra_shapes(kind)))
        .enumerate()
        .map(|(n, (label, shape))| {
            let (tier, act, out, layout) = combination(n);
            let alpha = (n % 3 == 2).then_some(if tier == Tier::Exact { 0.5 } else { 0.75 });
            Case16 {
                label,
                shape,
                seed: seed.wrapping_add(n as u64),
                tier,
                act,
                out,
                layout,
                alpha,
                nan_scale: n % 7 == 3,
            }
        })
        .collect()
}

/// The problem a case describes: plain scales, alpha set (per expert in the MoE form with an even
/// expert count: [`expert_alphas`](super::expert_alphas)), the NaN scale marked.
pub fn case16_problem(spec: &Case16) -> Result<Problem16> {
    let mut p = generate16(&spec.shape, spec.act, spec.tier, spec.seed)?;
    p.set_alpha(spec.alpha)?;
    if let Some(alphas) = super::expert_alphas(&spec.shape, spec.alpha) {
        p.set_moe_alpha(alphas.into())?;
    }
    if spec.nan_scale {
        p.mark_nan_scale(spec.seed)?;
    }
    Ok(p)
}

/// Runs one case on `backend` (weights in the case's layout) and compares the outputs with the
/// check's reference. An error is the backend's or the generator's refusal.
pub fn run_case16(backend: &dyn Backend, spec: &Case16) -> Result<Report<f32>> {
    let p = case16_problem(spec)?;
    let (expected, slack) = match (&p, spec.gate_slack()) {
        (Problem16::DualGemm(d), true) => {
            // The reference's products, once, for both the expected output and the slack.
            let (x1, x2) = dual_products(d);
            let (s1, s2) = dual_abs_products(d)?;
            (vec![gate(d, &x1, &x2, spec.out)?], Some(dual_slack(d.mnkl().2, (&x1, &x2), (&s1, &s2))))
        }
        _ => (reference16(&p, spec.out)?, None),
    };
    let got = p.into_layout(spec.layout).run_as(backend, spec.out)?;
    Ok(match slack {
        Some(s) => compare16_within(&got, &expected, &s),
        None => compare16(&got, &expected, spec.mode()),
    })
}

/// Every W4A16 case of each of `kinds` (all four when empty) on `backend`, seeded from `seed`,
/// with its verdict: the entry point for a backend's own tests
/// (`check_w4a16(&cuda, &[], 1).iter().all(|(_, r)| matches!(r, Ok(r) if r.passed()))`).
pub fn check_w4a16(
    backend: &dyn Backend,
    kinds: &[ProblemKind],
    seed: u64,
) -> Vec<(ProblemKind, Case16, Result<Report<f32>>)> {
    let kinds = if kinds.is_empty() { &ProblemKind::ALL[..] } else { kinds };
    kinds
        .iter()
        .flat_map(|&kind| cases16(kind, seed).into_iter().map(move |c| (kind, c)))
        .map(|(kind, c)| {
            let verdict = run_case16(backend, &c);
            (kind, c, verdict)
        })
        .collect()
}

/// What a passing W4A16 check establishes on the backend named `backend`, and what it does not.
pub fn what_w4a16_check_proves(backend: &str) -> &'static str {
    match backend {
        "cpu" => {
            "The W4A16 cases compare the CPU backend's W4A16 path with a reference computed inside the check \
             (its own FP4/FP8 decoding, plain-scale addressing, MoE routing, f64 sums and single rounding), \
             bit for bit on the exact tier except the dual GEMM, within the tolerance on the random tier (the \
             dual GEMM's widened by the gate's slack for FP32 sums in another order, which the CPU backend's f64 \
             sums do not need); blocked-scale cases give the backend blocked weights. It tests no GPU kernel: run \
             `nvfp4 check --backend cuda` on a Hopper GPU for that."
        }
        "cuda" => {
            "Every W4A16 case ran on the GPU and was compared with the check's own reference: bit-identical on \
             the exact tier (activations from {0, ±0.5, ±1, ±1.5, ±2} times a power of two, integer weight \
             scales: exact FP32 sums) except the dual GEMM, whose approximate SiLU keeps it to the tolerance; \
             within 1e-3 + 1e-3*|ref| (f16 out) or 1e-3 + 2^-7*|ref| (bf16 out) on the random tier. The dual \
             GEMM's random tier adds a per-element slack: silu(x1)*x2 amplifies the FP32 sums' order-dependent \
             error where x2 nearly cancels, so each x may be off by its worst case over every summation order \
             ((1+2^-23)^(2K+3)-1 times the sum of |products|), carried through the gate. That slack is wide at \
             large K (about 7% of the outputs' rms at K = 7168): there the random tier catches gross faults (x1 \
             and x2 swapped, alpha ignored, a K tile skipped), not one wrong weight block scale, which the exact \
             tier's cases, compared without slack, do catch. A case no kernel takes fails with every family's \
             rule. It covers these shapes and seeds only."
        }
        _ => "Every W4A16 case ran on this backend and was compared with the check's own reference.",
    }
}
