//! The SPEC §4 checker: elementwise `|got - ref| <= 1e-3 + 1e-3 * |ref|` with NaN/+inf/-inf parity,
//! or bit-identical comparison for data whose FP32 sums are exact. The W4A16 cases (SPEC §8) are
//! in [`w4a16`], with their own reference ([`reference16`]) and comparison of outputs of either
//! 16-bit type ([`compare16`]).

pub mod compare16;
pub mod gate_slack;
pub mod reference16;
pub mod w4a16;

use std::fmt;

use half::f16;

use crate::backend::CpuBackend;
use crate::format::{F16Tensor, ScaleLayout};
use crate::ops::Backend;
use crate::problem::{self, ProblemKind, Shape};
use crate::problem::{Output, Problem};

/// Absolute tolerance of SPEC §4.
pub const ATOL: f64 = 1e-3;
/// Relative tolerance of SPEC §4.
pub const RTOL: f64 = 1e-3;
/// How many mismatches a report keeps.
pub const MAX_REPORTED: usize = 8;

/// How strictly outputs are compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every element's bits equal (any NaN equals any NaN).
    BitExact,
    /// SPEC §4 tolerance with NaN/inf parity.
    Tolerance,
}

/// One failing element, its values as `V` (f16 outputs; f32 for the W4A16 check's outputs of
/// either 16-bit type, exact in f32).
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch<V = f16> {
    /// Output tensor (group) index.
    pub tensor: usize,
    /// `[l, m, n]` index inside it.
    pub index: [usize; 3],
    /// What the backend produced.
    pub got: V,
    /// What the reference produced.
    pub expected: V,
}

/// Outcome of comparing two outputs (values as `V`, as in [`Mismatch`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report<V = f16> {
    /// Elements compared.
    pub elements: usize,
    /// Elements that failed.
    pub failures: usize,
    /// The first failures, at most [`MAX_REPORTED`].
    pub mismatches: Vec<Mismatch<V>>,
    /// A structural problem (different tensor count or shapes); fails the whole comparison.
    pub structure: Option<String>,
    /// Largest |got - ref| over finite pairs.
    pub max_abs_err: f64,
}

impl<V> Report<V> {
    /// True when nothing failed.
    pub fn passed(&self) -> bool {
        self.failures == 0 && self.structure.is_none()
    }
}

#[derive(PartialEq)]
enum Class {
    Nan,
    PosInf,
    NegInf,
    Finite,
}

fn class(x: f16) -> Class {
    if x.is_nan() {
        Class::Nan
    } else if x.is_infinite() {
        if x.is_sign_negative() {
            Class::NegInf
        } else {
            Class::PosInf
        }
    } else {
        Class::Finite
    }
}

/// Whether one element passes under `mode`.
pub fn element_passes(got: f16, expected: f16, mode: Mode) -> bool {
    match mode {
        Mode::BitExact => got.to_bits() == expected.to_bits() || (got.is_nan() && expected.is_nan()),
        Mode::Tolerance => {
            let (cg, ce) = (class(got), class(expected));
            if cg != ce {
                return false;
            }
            if ce != Class::Finite {
                return true;
            }
            let (g, e) = (got.to_f64(), expected.to_f64());
            (g - e).abs() <= ATOL + RTOL * e.abs()
        }
    }
}

/// Compares one pair of tensors, adding to `report`.
fn compare_into(report: &mut Report, tensor: usize, got: &F16Tensor, expected: &F16Tensor, mode: Mode) {
    if got.shape() != expected.shape() {
        report.structure = Some(format!("output {tensor}: shape {:?}, expected {:?}", got.shape(), expected.shape()));
        return;
    }
    let [_, rows, cols] = expected.shape();
    for (i, (&g, &e)) in got.data().iter().zip(expected.data()).enumerate() {
        report.elements += 1;
        if g.is_finite() && e.is_finite() {
            report.max_abs_err = report.max_abs_err.max((g.to_f64() - e.to_f64()).abs());
        }
        if !element_passes(g, e, mode) {
            report.failures += 1;
            if report.mismatches.len() < MAX_REPORTED {
                let index = [i / (rows * cols), (i / cols) % rows, i % cols];
                report.mismatches.push(Mismatch { tensor, index, got: g, expected: e });
            }
        }
    }
}

/// Compares two tensors.
pub fn compare(got: &F16Tensor, expected: &F16Tensor, mode: Mode) -> Report {
    let mut r = Report::default();
    compare_into(&mut r, 0, got, expected, mode);
    r
}

/// Compares two operation outputs (one tensor, or one per group).
pub fn compare_outputs(got: &Output, expected: &Output, mode: Mode) -> Report {
    let mut r = Report::default();
    let (g, e) = (got.tensors(), expected.tensors());
    if g.len() != e.len() {
        r.structure = Some(format!("{} output tensors, expected {}", g.len(), e.len()));
        return r;
    }
    for (i, (gt, et)) in g.iter().zip(e).enumerate() {
        compare_into(&mut r, i, gt, et, mode);
    }
    r
}

impl<V: fmt::Display> fmt::Display for Report<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(s) = &self.structure {
            return write!(f, "FAIL: {s}");
        }
        if self.passed() {
            return write!(f, "pass ({} elements, max abs err {:.3e})", self.elements, self.max_abs_err);
        }
        write!(f, "FAIL: {} of {} elements", self.failures, self.elements)?;
        for m in &self.mismatches {
            let [l, i, j] = m.index;
            write!(f, "\n  out{}[{l}, {i}, {j}]: got {}, expected {}", m.tensor, m.got, m.expected)?;
        }
        Ok(())
    }
}

/// One case of `nvfp4 check`: a shape, a seed, the scale layout the backend is given and an
/// optional alpha. The reference always sees the plain layout, so a layout bug cannot hide.
#[derive(Clone, Debug, PartialEq)]
pub struct CaseSpec {
    /// `test:N` for SPEC shapes, `extra:N` for the random edge shapes.
    pub label: String,
    /// The dimensions.
    pub shape: Shape,
    /// Generator seed.
    pub seed: u64,
    /// Scale layout handed to the backend under test.
    pub layout: ScaleLayout,
    /// Alpha applied by both sides (a power of two on exact data, so results stay exact).
    pub alpha: Option<f32>,
}

/// The checker's cases for `kind`: every SPEC test shape, then the extra edge shapes. Layouts
/// alternate plain/blocked; every third extra case carries an alpha (per expert in half the MoE
/// cases: [`expert_alphas`]).
pub fn cases(kind: ProblemKind, seed: u64) -> Vec<CaseSpec> {
    let tests = problem::test_shapes(kind).into_iter().enumerate().map(|(i, s)| (format!("test:{i}"), s, None));
    let alpha = if kind.exact_data() { 0.5 } else { 0.75 };
    let extras = problem::extra_shapes(kind)
        .into_iter()
        .enumerate()
        .map(|(i, s)| (format!("extra:{i}"), s, (i % 3 == 2).then_some(alpha)));
    tests
        .chain(extras)
        .enumerate()
        .map(|(n, (label, shape, alpha))| CaseSpec {
            label,
            shape,
            seed: seed.wrapping_add(n as u64),
            layout: if n % 2 == 0 { ScaleLayout::Plain } else { ScaleLayout::Blocked },
            alpha,
        })
        .collect()
}

/// The per-expert alphas a case of `shape` carrying `alpha` gives the MoE form when its expert
/// count E is even: expert e's is alpha × 2^((e mod 3) − 1) (half the alpha, the alpha, twice it,
/// again), distinct factors that keep exact data exact. A MoE case with an odd E keeps the one
/// alpha, so that the check runs both epilogues. `None` for those, for the other operations and
/// for a case without an alpha.
pub fn expert_alphas(shape: &Shape, alpha: Option<f32>) -> Option<Vec<f32>> {
    match (shape, alpha) {
        (Shape::Moe { counts, .. }, Some(a)) if counts.len() % 2 == 0 => {
            Some((0..counts.len()).map(|e| a * [0.5, 1.0, 2.0][e % 3]).collect())
        }
        _ => None,
    }
}

/// Builds the problem a case describes (plain scales, alpha set: per expert in the MoE form with
/// an even expert count, [`expert_alphas`]).
pub fn case_problem(spec: &CaseSpec) -> crate::Result<Problem> {
    let mut p = problem::generate(&spec.shape, spec.seed)?;
    p.set_alpha(spec.alpha)?;
    if let Some(alphas) = expert_alphas(&spec.shape, spec.alpha) {
        p.set_moe_alpha(alphas.into())?;
    }
    Ok(p)
}

/// The comparison mode SPEC §4 demands for `kind`'s generated data.
pub fn mode_for(kind: ProblemKind) -> Mode {
    if kind.exact_data() {
        Mode::BitExact
    } else {
        Mode::Tolerance
    }
}

/// Runs one case on `backend` and compares with the CPU reference.
pub fn run_case(backend: &dyn Backend, spec: &CaseSpec) -> crate::Result<Report> {
    let p = case_problem(spec)?;
    let expected = p.run(&CpuBackend)?;
    let got = p.with_layout(spec.layout).run(backend)?;
    Ok(compare_outputs(&got, &expected, mode_for(spec.shape.kind())))
}

/// What a passing `check` run establishes on the backend named `backend`, and what it does not.
pub fn what_check_proves(backend: &str) -> &'static str {
    match backend {
        "cpu" => {
            "The CPU backend is the reference itself, so this run tests no GPU kernel. It shows that \
             every case generates and runs, that each case given blocked scales gives the same bits as \
             its plain-scale twin (the layout conversion and the blocked reads agree), and that the \
             reference repeats itself exactly; the plain-scale cases compare the reference with itself. \
             It does not show that the reference is right: `cargo test` does (tests/reference.rs checks \
             it against sums written independently of the library). To test the kernels, run \
             `nvfp4 check --backend cuda` on a machine with an NVIDIA Hopper GPU."
        }
        "cuda" => {
            "Every case ran on the GPU kernels and was compared with the CPU reference: bit-identical for \
             gemv, gemm and grouped-gemm (their generated data makes every FP32 sum exact), within \
             1e-3 + 1e-3*|ref| for dual-gemm; half the cases give the kernels blocked scales. It covers \
             these shapes and seeds only."
        }
        _ => "Every case ran on this backend and was compared with the CPU reference.",
    }
}
