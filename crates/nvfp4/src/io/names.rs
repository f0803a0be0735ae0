//! The tensor names of case and output files, and the rule that keeps a file unambiguous: every
//! name that looks like one of ours must be one the reader uses.
//!
//! A name "looks like ours" when it is one of the names below, or one of them followed by a group
//! suffix `_g{i}`. A reader refuses, naming the tensor: a name of another kind of problem (`b1`
//! in a gemm case), a group suffix where there are no groups or none where there must be one,
//! a group that has tensors but no `a_g{i}` (`sfa_g7` without `a_g7`), a gap in the group numbers
//! (`a_g0`, `a_g2` without `a_g1`), and a group number written other than as `0`, `1`, `2`, ..
//! Names that are not ours are ignored, so a file may carry notes or an expected output beside
//! the operands.

use std::collections::BTreeSet;

use super::archive::{tensor_err, Archive};
use crate::problem::ProblemKind;
use crate::Result;

/// Tensor names of one operand: `a` with scales `sfa` is `Operand { values: "a", scales: "sfa" }`.
#[derive(Clone, Copy)]
pub(crate) struct Operand {
    pub(crate) values: &'static str,
    pub(crate) scales: &'static str,
}

pub(crate) const A: Operand = Operand { values: "a", scales: "sfa" };
pub(crate) const B: Operand = Operand { values: "b", scales: "sfb" };
pub(crate) const B1: Operand = Operand { values: "b1", scales: "sfb1" };
pub(crate) const B2: Operand = Operand { values: "b2", scales: "sfb2" };

/// The alpha scalar's name.
pub(crate) const ALPHA: &str = "alpha";
/// The output's name.
pub(crate) const C: &str = "c";

impl Operand {
    pub(crate) fn values_name(self, suffix: &str) -> String {
        format!("{}{suffix}", self.values)
    }
    pub(crate) fn plain_name(self, suffix: &str) -> String {
        format!("{}{suffix}", self.scales)
    }
    pub(crate) fn blocked_name(self, suffix: &str) -> String {
        format!("{}_blocked{suffix}", self.scales)
    }
    pub(crate) fn global_name(self, suffix: &str) -> String {
        format!("{}_global_scale{suffix}", self.values)
    }

    /// The four names of this operand, without a group suffix.
    fn names(self) -> [String; 4] {
        [self.values_name(""), self.plain_name(""), self.blocked_name(""), self.global_name("")]
    }
}

/// The group suffix of group `i`.
pub(crate) fn group_suffix(i: usize) -> String {
    format!("_g{i}")
}

/// The operands of a `kind` case (one group's, for the grouped GEMM).
fn operands(kind: ProblemKind) -> &'static [Operand] {
    match kind {
        ProblemKind::Gemv | ProblemKind::Gemm | ProblemKind::GroupedGemm => &[A, B],
        ProblemKind::DualGemm => &[A, B1, B2],
    }
}

/// Every base name a `kind` case uses (without group suffix).
fn case_bases(kind: ProblemKind) -> Vec<String> {
    let mut v: Vec<String> = operands(kind).iter().flat_map(|o| o.names()).collect();
    v.push(ALPHA.to_string());
    v
}

/// Every base name of any case.
fn all_case_bases() -> BTreeSet<String> {
    ProblemKind::ALL.into_iter().flat_map(case_bases).collect()
}

/// `name` split into one of `bases` and its group number, if it looks like ours: `None` when it
/// does not, an error when its group suffix is not a plain group number.
fn split<'b>(name: &str, bases: &'b BTreeSet<String>) -> Option<Result<(&'b str, Option<usize>)>> {
    if let Some(base) = bases.get(name) {
        return Some(Ok((base, None)));
    }
    let (base, digits) = name.rsplit_once("_g")?;
    let base = bases.get(base)?;
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    match digits.parse::<usize>() {
        Ok(i) if i.to_string() == digits => Some(Ok((base, Some(i)))),
        _ => Some(Err(tensor_err(name, format!("group number `{digits}` is not written as 0, 1, 2, ..")))),
    }
}

/// Checks the names of a `kind` case file (see the module docs) and returns the group count of a
/// grouped case (1 otherwise).
pub(crate) fn check_case_names(ar: &Archive, kind: ProblemKind) -> Result<usize> {
    let all = all_case_bases();
    let mine: BTreeSet<String> = case_bases(kind).into_iter().collect();
    let grouped = kind == ProblemKind::GroupedGemm;
    let mut found = Vec::new();
    for name in ar.names() {
        let Some(split) = split(&name, &all) else { continue };
        let (base, group) = split?;
        if !mine.contains(base) {
            let owners: Vec<&str> = ProblemKind::ALL
                .into_iter()
                .filter(|&k| case_bases(k).iter().any(|b| b == base))
                .map(|k| k.name())
                .collect();
            return Err(tensor_err(
                &name,
                format!("is not part of a {kind} case (`{base}` belongs to {}); refusing to guess", owners.join(", ")),
            ));
        }
        match (grouped, group) {
            (false, Some(_)) => {
                return Err(tensor_err(&name, format!("has a group suffix, but a {kind} case has no groups")))
            }
            (true, None) => {
                return Err(tensor_err(
                    &name,
                    "has no group suffix `_g{i}`, which every tensor of a grouped case carries",
                ))
            }
            (true, Some(i)) => found.push((name, base, i)),
            (false, None) => {}
        }
    }
    if grouped {
        check_groups(&found, A.values)
    } else {
        Ok(1)
    }
}

/// Checks the names of a `kind` output file: `c`, or `c_g0`, `c_g1`, .. without gaps. Returns
/// the tensor count.
pub(crate) fn check_output_names(ar: &Archive, kind: ProblemKind) -> Result<usize> {
    let bases = BTreeSet::from([C.to_string()]);
    let grouped = kind == ProblemKind::GroupedGemm;
    let mut found = Vec::new();
    for name in ar.names() {
        let Some(split) = split(&name, &bases) else { continue };
        match (grouped, split?) {
            (false, (_, Some(_))) => {
                return Err(tensor_err(&name, format!("has a group suffix, but a {kind} output has no groups")))
            }
            (true, (_, None)) => {
                return Err(tensor_err(&name, "has no group suffix: a grouped output is `c_g0`, `c_g1`, .."))
            }
            (true, (base, Some(i))) => found.push((name, base, i)),
            (false, (_, None)) => {}
        }
    }
    if grouped {
        check_groups(&found, C)
    } else {
        Ok(1)
    }
}

/// The groups are the numbers of the `{anchor}_g{i}` tensors; they must run 0, 1, .. without a
/// gap, and every other grouped tensor must belong to one of them. Returns the group count.
fn check_groups(found: &[(String, &str, usize)], anchor: &str) -> Result<usize> {
    let groups: BTreeSet<usize> = found.iter().filter(|(_, base, _)| *base == anchor).map(|&(_, _, i)| i).collect();
    let first = format!("{anchor}{}", group_suffix(0));
    let Some(&last) = groups.last() else {
        return Err(tensor_err(&first, format!("missing from the file (groups are {anchor}_g0, {anchor}_g1, ..)")));
    };
    if let Some(gap) = (0..=last).find(|i| !groups.contains(i)) {
        return Err(tensor_err(
            &format!("{anchor}{}", group_suffix(gap)),
            format!(
                "missing: the file has `{anchor}{}`, so groups must run 0..={last} without a gap",
                group_suffix(last)
            ),
        ));
    }
    if let Some((name, _, i)) = found.iter().find(|(_, _, i)| !groups.contains(i)) {
        return Err(tensor_err(
            name,
            format!("belongs to group {i}, but the file has no `{anchor}{}` (groups 0..={last})", group_suffix(*i)),
        ));
    }
    Ok(groups.len())
}
