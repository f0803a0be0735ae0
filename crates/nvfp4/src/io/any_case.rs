//! Reading a case file of either mode: the activation tensor's dtype says which (U8: W4A4,
//! `case.rs`; BF16 or F16: W4A16, `case16.rs`).

use std::path::Path;

use super::archive::{Archive, IN_MEMORY};
use super::case::{check_stored_kind, read_problem};
use super::case16::{activation_dtype, read_problem16};
use crate::memory::ensure_host;
use crate::problem::{Problem, Problem16, ProblemKind};
use crate::Result;

/// Either mode's problem, as a case file holds it.
#[derive(Clone, Debug, PartialEq)]
pub enum CaseProblem {
    /// NVFP4 activations.
    W4a4(Problem),
    /// 16-bit activations.
    W4a16(Problem16),
}

/// Reads a `kind` case file of either mode (told by the activation tensor's dtype),
/// after checking that the host can hold the file's tensors.
pub fn load_case(path: &Path, kind: ProblemKind) -> Result<CaseProblem> {
    let ar = Archive::open(path)?;
    ensure_host(&format!("reading the {kind} case {}", path.display()), Some(ar.data_len()))?;
    read_case(&ar, kind)
}

/// [`load_case`] from bytes.
pub fn case_from_bytes(bytes: &[u8], kind: ProblemKind) -> Result<CaseProblem> {
    read_case(&Archive::from_bytes(bytes, Path::new(IN_MEMORY))?, kind)
}

fn read_case(ar: &Archive, kind: ProblemKind) -> Result<CaseProblem> {
    check_stored_kind(ar, kind)?;
    match activation_dtype(ar, kind)? {
        None => read_problem(ar, kind).map(CaseProblem::W4a4),
        Some(_) => read_problem16(ar, kind).map(CaseProblem::W4a16),
    }
}
