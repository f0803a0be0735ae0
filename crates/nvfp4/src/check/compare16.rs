//! Comparing 16-bit outputs of either type (the W4A16 check's, SPEC §8): bit for bit (any NaN
//! matching any NaN), or SPEC §4's rule with NaN/+inf/-inf parity, whose relative term is the
//! output type's: [`RTOL`] for f16, whose unit in the last place is below it, and
//! [`BF16_RTOL`] for bf16, one unit in its last place at most (docs/FORMAT.md §3), so that an
//! FP32 sum in another order that lands on the other side of a bf16 rounding boundary passes.

use super::{Mismatch, Mode, Report, ATOL, MAX_REPORTED, RTOL};
use crate::format::{OutTensor, OutputDtype};

/// The relative tolerance of bf16 outputs: 2^-7, one bf16 unit in the last place at most.
pub const BF16_RTOL: f64 = 1.0 / 128.0;

/// The relative tolerance of `dtype` outputs.
pub fn rtol(dtype: OutputDtype) -> f64 {
    match dtype {
        OutputDtype::F16 => RTOL,
        OutputDtype::Bf16 => BF16_RTOL,
    }
}

/// NaN, +inf, -inf or finite: the status two elements must share.
fn class(x: f32) -> u8 {
    match x {
        x if x.is_nan() => 0,
        f32::INFINITY => 1,
        f32::NEG_INFINITY => 2,
        _ => 3,
    }
}

/// Whether an element of `dtype` whose bits are `got` passes against `expected` under `mode`.
pub fn element16_passes(got: u16, expected: u16, dtype: OutputDtype, mode: Mode) -> bool {
    let (g, e) = (dtype.to_f32(got), dtype.to_f32(expected));
    match mode {
        Mode::BitExact => got == expected || (g.is_nan() && e.is_nan()),
        Mode::Tolerance => element16_within(got, expected, dtype, 0.0),
    }
}

/// Whether an element passes SPEC §4's rule widened by `slack` (the dual GEMM random tier's,
/// `gate_slack`): the same NaN/+inf/-inf status, and for finite values
/// `|got - ref| <= ATOL + rtol · (|ref| + slack) + slack`, so that a result `slack` away from the
/// reference keeps the output type's rounding allowance too. A slack of 0 is SPEC §4's rule.
pub fn element16_within(got: u16, expected: u16, dtype: OutputDtype, slack: f64) -> bool {
    let (g, e) = (dtype.to_f32(got), dtype.to_f32(expected));
    if class(g) != class(e) {
        return false;
    }
    let (g, e) = (g as f64, e as f64);
    class(e as f32) != 3 || (g - e).abs() <= ATOL + rtol(dtype) * (e.abs() + slack) + slack
}

/// Compares the outputs `got` with `expected`, tensor by tensor: their counts, types and shapes
/// must agree (else the report's `structure` says how they differ), then every element under
/// `mode`. Values are reported as f32 (exact for both types).
pub fn compare16(got: &[OutTensor], expected: &[OutTensor], mode: Mode) -> Report<f32> {
    compare16_by(got, expected, |_, gb, eb, dtype| element16_passes(gb, eb, dtype, mode))
}

/// [`compare16`] under SPEC §4's rule widened per element by `slack`, one value for each element
/// of the outputs in order ([`element16_within`]); a `slack` of another length is a structural
/// failure.
pub fn compare16_within(got: &[OutTensor], expected: &[OutTensor], slack: &[f64]) -> Report<f32> {
    let elements: usize = expected.iter().map(|t| t.bits().len()).sum();
    if slack.len() != elements {
        let structure = Some(format!("{} slack values for {elements} elements", slack.len()));
        return Report { structure, ..Report::default() };
    }
    compare16_by(got, expected, |i, gb, eb, dtype| element16_within(gb, eb, dtype, slack[i]))
}

/// The comparison of both: `passes(i, got, expected, dtype)` judges element i (counted across
/// the tensors).
fn compare16_by(
    got: &[OutTensor],
    expected: &[OutTensor],
    passes: impl Fn(usize, u16, u16, OutputDtype) -> bool,
) -> Report<f32> {
    let mut r = Report::default();
    if got.len() != expected.len() {
        r.structure = Some(format!("{} output tensors, expected {}", got.len(), expected.len()));
        return r;
    }
    for (t, (g, e)) in got.iter().zip(expected).enumerate() {
        if (g.dtype(), g.shape()) != (e.dtype(), e.shape()) {
            r.structure =
                Some(format!("output {t}: {} {:?}, expected {} {:?}", g.dtype(), g.shape(), e.dtype(), e.shape()));
            return r;
        }
        let [_, rows, cols] = e.shape();
        let dtype = e.dtype();
        for (i, (&gb, &eb)) in g.bits().iter().zip(e.bits()).enumerate() {
            let at = r.elements;
            r.elements += 1;
            let (gv, ev) = (dtype.to_f32(gb), dtype.to_f32(eb));
            if gv.is_finite() && ev.is_finite() {
                r.max_abs_err = r.max_abs_err.max((gv as f64 - ev as f64).abs());
            }
            if !passes(at, gb, eb, dtype) {
                r.failures += 1;
                if r.mismatches.len() < MAX_REPORTED {
                    let index = [i / (rows * cols), (i / cols) % rows, i % cols];
                    r.mismatches.push(Mismatch { tensor: t, index, got: gv, expected: ev });
                }
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dtype: OutputDtype, vals: &[f32]) -> OutTensor {
        OutTensor::new(dtype, [1, 1, vals.len()], vals.iter().map(|&v| dtype.round_f32(v)).collect()).unwrap()
    }

    #[test]
    fn bits_or_the_types_tolerance() {
        let (h, b) = (OutputDtype::F16, OutputDtype::Bf16);
        let one = |d: OutputDtype| d.round_f32(1.0);
        // One bf16 ulp at 1 (2^-7) passes the bf16 rule and would fail f16's.
        let next = b.round_f32(1.0 + 1.0 / 128.0);
        assert!(element16_passes(next, one(b), b, Mode::Tolerance));
        assert!(!element16_passes(next, one(b), b, Mode::BitExact));
        assert!(!element16_passes(b.round_f32(1.02), one(b), b, Mode::Tolerance));
        // f16: 1e-3 + 1e-3 at 1 allows 2 ulps (2^-10 each), not 3.
        assert!(element16_passes(h.round_f32(1.0 + 2.0 / 1024.0), one(h), h, Mode::Tolerance));
        assert!(!element16_passes(h.round_f32(1.0 + 3.0 / 1024.0), one(h), h, Mode::Tolerance));
        // NaN parity, any NaN equal in the exact mode, infinities by sign.
        let (nan_a, nan_b) = (0x7E00, 0xFE01);
        assert!(element16_passes(nan_a, nan_b, h, Mode::BitExact));
        assert!(element16_passes(nan_a, nan_b, h, Mode::Tolerance));
        assert!(!element16_passes(nan_a, one(h), h, Mode::Tolerance));
        assert!(!element16_passes(h.round_f32(f32::INFINITY), h.round_f32(f32::NEG_INFINITY), h, Mode::Tolerance));
        assert!(!element16_passes(h.round_f32(65504.0), h.round_f32(f32::INFINITY), h, Mode::Tolerance));
    }

    #[test]
    fn a_slack_widens_the_tolerance_of_its_element_only() {
        let h = OutputDtype::F16;
        let want = [t(h, &[0.5, 0.5, f32::NAN])];
        let got = [t(h, &[0.75, 0.75, 1.0])];
        // 0.25 off: within a slack of 0.25 (plus the tolerance), not of 0.2; NaN parity stays.
        let r = compare16_within(&got, &want, &[0.25, 0.2, 1e9]);
        assert_eq!((r.failures, r.mismatches[0].index, r.mismatches[1].index), (2, [0, 0, 1], [0, 0, 2]));
        // The relative term is taken of |ref| + slack: 0.2495 + 1e-3 + 1e-3 × 0.7495 > 0.25.
        assert!(element16_within(h.round_f32(0.75), h.round_f32(0.5), h, 0.2495));
        assert!(!element16_within(h.round_f32(0.75), h.round_f32(0.5), h, 0.2475));
        // A slack of 0 is the plain rule; a slack of the wrong length a structural failure.
        for (g, e) in [(1.0, 1.0), (1.0 + 2.0 / 1024.0, 1.0), (1.0 + 3.0 / 1024.0, 1.0)] {
            let (g, e) = (h.round_f32(g), h.round_f32(e));
            assert_eq!(element16_within(g, e, h, 0.0), element16_passes(g, e, h, Mode::Tolerance));
        }
        assert!(compare16_within(&got, &want, &[0.0; 2]).structure.is_some());
    }

    #[test]
    fn reports_the_first_failures_and_the_structure() {
        let b = OutputDtype::Bf16;
        let want = [t(b, &[1.0, 2.0, 3.0, 4.0])];
        let got = [t(b, &[1.0, 2.5, 3.0, -4.0])];
        let r = compare16(&got, &want, Mode::Tolerance);
        assert!(!r.passed());
        assert_eq!((r.elements, r.failures), (4, 2));
        assert_eq!(r.mismatches[0].index, [0, 0, 1]);
        assert_eq!((r.mismatches[1].got, r.mismatches[1].expected), (-4.0, 4.0));
        assert!(compare16(&want, &want, Mode::BitExact).passed());
        // Another type, another shape or another count is a structural failure.
        let f16 = [t(OutputDtype::F16, &[1.0, 2.0, 3.0, 4.0])];
        assert!(compare16(&f16, &want, Mode::Tolerance).structure.is_some());
        assert!(compare16(&[t(b, &[1.0, 2.0, 3.0])], &want, Mode::Tolerance).structure.is_some());
        assert!(compare16(&[], &want, Mode::Tolerance).structure.is_some());
    }
}
