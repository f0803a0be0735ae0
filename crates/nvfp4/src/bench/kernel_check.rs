//! Checking a kernel's output against the reference before and after it is timed: the
//! comparison mode of each problem, poison-launch-compare, and a failed check's one-line reason.

use crate::backend::cuda::Prepared;
use crate::check::{compare_outputs, Mode, Report as CheckReport};
use crate::problem::{Output, ProblemKind};
use crate::Result;

/// The comparison mode of SPEC §4 for `kind`: bit-exact where the generator's sums are exact.
pub fn check_mode(kind: ProblemKind) -> Mode {
    if kind.exact_data() {
        Mode::BitExact
    } else {
        Mode::Tolerance
    }
}

/// A one-line reason for a failed check: the count and the first mismatch.
pub(super) fn check_failure(r: &CheckReport) -> String {
    if let Some(s) = &r.structure {
        return s.clone();
    }
    let mut s = format!("{} of {} elements differ", r.failures, r.elements);
    if let Some(m) = r.mismatches.first() {
        let [l, i, j] = m.index;
        s += &format!(" (first out{}[{l}, {i}, {j}]: got {}, expected {})", m.tensor, m.got, m.expected);
    }
    s
}

/// Poison, launch, download, compare: `Err` names the failure.
pub(super) fn check_kernel(prep: &mut Prepared, reference: &Output, mode: Mode) -> Result<(), String> {
    prep.poison().map_err(|e| e.to_string())?;
    prep.launch().map_err(|e| e.to_string())?;
    let out = prep.output().map_err(|e| e.to_string())?;
    let report = compare_outputs(&out, reference, mode);
    if report.passed() {
        Ok(())
    } else {
        Err(check_failure(&report))
    }
}
