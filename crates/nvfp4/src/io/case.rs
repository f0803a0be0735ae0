//! Case files: one problem's operands in the physical layouts of SPEC §2.
//!
//! | tensor | dtype | shape |
//! |---|---|---|
//! | `a`, `b` (gemv, gemm); `a`, `b1`, `b2` (dual gemm) | U8 | `[L, rows, K/2]` (gemv b: rows = 1) |
//! | `sfa`, `sfb`, `sfb1`, `sfb2` (plain scales) | F8_E4M3 | `[L, rows, K/16]` |
//! | or `sfa_blocked`, ... (blocked scales; never both for one operand) | F8_E4M3 | `[L, R, C, 512]` |
//! | `alpha` (optional) | F32 | `[]` or `[1]` |
//! | `a_global_scale`, ... (optional, written when not 1.0) | F32 | `[]` or `[1]` |
//!
//! Grouped GEMM suffixes every name with `_g{i}` (`a_g0`, `sfa_blocked_g0`, `alpha_g0`), each
//! group with L = 1, groups numbered 0, 1, .. without a gap; its MoE form has no file form
//! (writing one is an error, [`check_file_form`]). `names.rs` says which other names a reader
//! refuses.

use std::path::Path;

use safetensors::Dtype;

use super::archive::{file_err, tensor_err, Archive, Dim, Entry, Writer, IN_MEMORY};
use super::case16::refuse_dense_activation;
use super::names::{check_case_names, group_suffix, Operand, A, ALPHA, B, B1, B2};
use crate::format::{blocked_dims, Nvfp4Tensor, ScaleLayout};
use crate::memory::ensure_host;
use crate::ops::{alpha_rule, global_scale_rule, DualGemm, Gemm, Gemv, GroupedGemm};
use crate::problem::{Problem, ProblemKind, Shape};
use crate::{Error, Result};

/// The header metadata key naming the problem kind of a case file.
pub const PROBLEM_KEY: &str = "nvfp4_problem";

impl Operand {
    pub(super) fn write<'a>(self, w: &mut Writer<'a>, suffix: &str, t: &'a Nvfp4Tensor) -> Result<()> {
        let (l, rows, sf_cols) = (t.l(), t.rows(), t.sf_cols());
        w.push(self.values_name(suffix), Entry::new(Dtype::U8, vec![l, rows, t.k() / 2], t.values()))?;
        let (name, shape) = match t.layout() {
            ScaleLayout::Plain => (self.plain_name(suffix), vec![l, rows, sf_cols]),
            ScaleLayout::Blocked => {
                let (r, c) = blocked_dims(rows, sf_cols);
                (self.blocked_name(suffix), vec![l, r, c, 512])
            }
        };
        w.push(name, Entry::new(Dtype::F8_E4M3, shape, t.scales()))?;
        if t.global_scale() != 1.0 {
            w.push(self.global_name(suffix), Entry::scalar_f32(t.global_scale()))?;
        }
        Ok(())
    }

    /// Reads the operand, its values tensor checked against `[l, rows, k2]` (`note` says where
    /// fixed sizes come from), its scales in whichever layout the file has (only one may be present).
    pub(super) fn read(self, ar: &Archive, suffix: &str, dims: [Dim; 3], note: &str) -> Result<Nvfp4Tensor> {
        let vname = self.values_name(suffix);
        let shape = ar.expect(&vname, Dtype::U8, &dims, note)?;
        let (l, rows, k2) = (shape[0], shape[1], shape[2]);
        let k = 2 * k2;
        if !k.is_multiple_of(16) {
            return Err(tensor_err(
                &vname,
                format!("last dimension {k2} means K = {k}, not a multiple of 16 (one E4M3 scale per 16 values)"),
            ));
        }
        let (plain, blocked) = (self.plain_name(suffix), self.blocked_name(suffix));
        if ar.has(&plain) && ar.has(&blocked) {
            return Err(tensor_err(
                &blocked,
                format!("`{plain}` holds the scales of `{vname}` too; a file gives each operand one scale layout"),
            ));
        }
        let (r, c) = blocked_dims(rows, k / 16);
        let why = format!("[L, rows, K/16] from `{vname}`");
        let layout = if ar.has(&plain) {
            ar.expect(&plain, Dtype::F8_E4M3, &[Dim::Is(l), Dim::Is(rows), Dim::Is(k / 16)], &why)?;
            ScaleLayout::Plain
        } else if ar.has(&blocked) {
            let why = format!("[L, ceil(rows/128), ceil(K/64), 512] from `{vname}`");
            ar.expect(&blocked, Dtype::F8_E4M3, &[Dim::Is(l), Dim::Is(r), Dim::Is(c), Dim::Is(512)], &why)?;
            ScaleLayout::Blocked
        } else {
            return Err(tensor_err(
                &plain,
                format!(
                    "missing from the file (expected `{plain}` F8_E4M3 [{l}, {rows}, {}] or `{blocked}` \
                     F8_E4M3 [{l}, {r}, {c}, 512])",
                    k / 16
                ),
            ));
        };
        let sname = if layout == ScaleLayout::Plain { plain } else { blocked };
        let values = ar.bytes(&vname)?.into_owned();
        let scales = ar.bytes(&sname)?.into_owned();
        let t = Nvfp4Tensor::new(l, rows, k, values, scales, layout).map_err(|e| tensor_err(&vname, e.to_string()))?;
        let gname = self.global_name(suffix);
        match ar.scalar_f32(&gname)? {
            None => Ok(t),
            Some(g) => global_scale_rule(g)
                .map(|g| t.with_global_scale(g))
                .map_err(|e| tensor_err(&gname, format!("a global scale {e}"))),
        }
    }
}

pub(super) fn write_alpha(w: &mut Writer, suffix: &str, alpha: Option<f32>) -> Result<()> {
    match alpha {
        Some(a) => w.push(format!("{ALPHA}{suffix}"), Entry::scalar_f32(a)),
        None => Ok(()),
    }
}

pub(super) fn read_alpha(ar: &Archive, suffix: &str) -> Result<Option<f32>> {
    let name = format!("{ALPHA}{suffix}");
    match ar.scalar_f32(&name)? {
        Some(a) => alpha_rule(a).map(Some).map_err(|e| tensor_err(&name, e)),
        None => Ok(None),
    }
}

/// An operation built from the file's tensors (`place` says which group, or is empty): a
/// refusal of its scalars together (a factor alpha × global(A) × global(B) that overflows or
/// rounds to 0) names the file.
pub(super) fn in_file<T>(ar: &Archive, place: &str, built: Result<T>) -> Result<T> {
    built.map_err(|e| match e {
        Error::Invalid(msg) => file_err(ar.origin(), format!("{place}{msg}")),
        other => other,
    })
}

/// Refuses a shape the case-file format cannot hold: the grouped GEMM's MoE form (SPEC §2 names
/// a grouped case's tensors per group, `_g{i}`; there is no name for an `[E, N, K/2]` weight
/// tensor or for offsets).
pub fn check_file_form(shape: &Shape) -> Result<()> {
    match shape {
        Shape::Moe { .. } => Err(no_moe_file_form()),
        _ => Ok(()),
    }
}

pub(super) fn no_moe_file_form() -> Error {
    Error::Invalid(
        "the case-file format has no MoE form (grouped GEMM files hold a list of groups, `a_g0`, `b_g0`, ..); \
         give the groups as m1,m2,../n/k instead"
            .into(),
    )
}

/// The tensors of `p`'s case file.
fn problem_writer(p: &Problem) -> Result<Writer<'_>> {
    let mut w = Writer::default();
    w.meta(PROBLEM_KEY, p.kind().name());
    match p {
        Problem::Gemv(Gemv { a, b, alpha }) | Problem::Gemm(Gemm { a, b, alpha }) => {
            A.write(&mut w, "", a)?;
            B.write(&mut w, "", b)?;
            write_alpha(&mut w, "", *alpha)?;
        }
        Problem::DualGemm(d) => {
            A.write(&mut w, "", &d.a)?;
            B1.write(&mut w, "", &d.b1)?;
            B2.write(&mut w, "", &d.b2)?;
            write_alpha(&mut w, "", d.alpha)?;
        }
        Problem::GroupedGemm(g) => {
            for (i, gemm) in g.groups.iter().enumerate() {
                let s = group_suffix(i);
                A.write(&mut w, &s, &gemm.a)?;
                B.write(&mut w, &s, &gemm.b)?;
                write_alpha(&mut w, &s, gemm.alpha)?;
            }
        }
        Problem::Moe(_) => return Err(no_moe_file_form()),
    }
    Ok(w)
}

/// The case file of `p` as bytes.
pub fn problem_to_bytes(p: &Problem) -> Result<Vec<u8>> {
    problem_writer(p)?.into_bytes()
}

/// Writes the case file of `p` to `path`, streaming it into a temporary file that replaces
/// `path` only once complete.
pub fn save_problem(path: &Path, p: &Problem) -> Result<()> {
    problem_writer(p)?.write(path)
}

/// Reads a `kind` problem from case-file bytes.
pub fn problem_from_bytes(bytes: &[u8], kind: ProblemKind) -> Result<Problem> {
    read_problem(&Archive::from_bytes(bytes, Path::new(IN_MEMORY))?, kind)
}

/// Reads a `kind` problem from the case file at `path`, tensor by tensor, after checking that
/// the host can hold the file's tensors.
pub fn load_problem(path: &Path, kind: ProblemKind) -> Result<Problem> {
    let ar = Archive::open(path)?;
    ensure_host(&format!("reading the {kind} case {}", path.display()), Some(ar.data_len()))?;
    read_problem(&ar, kind)
}

/// The problem kind a case file's header names (`None` for a file without the key). Reads the
/// header only.
pub fn stored_problem_kind(path: &Path) -> Result<Option<ProblemKind>> {
    let ar = Archive::open(path)?;
    match ar.metadata().and_then(|m| m.get(PROBLEM_KEY)) {
        None => Ok(None),
        Some(name) => name
            .parse()
            .map(Some)
            .map_err(|_| file_err(path, format!("metadata {PROBLEM_KEY} = `{name}` names no problem kind"))),
    }
}

/// Refuses a file whose metadata names another kind than `kind`.
pub(super) fn check_stored_kind(ar: &Archive, kind: ProblemKind) -> Result<()> {
    if let Some(stored) = ar.metadata().and_then(|m| m.get(PROBLEM_KEY)) {
        if stored != kind.name() {
            return Err(file_err(
                ar.origin(),
                format!("holds a `{stored}` case (metadata {PROBLEM_KEY}), asked to read it as `{kind}`"),
            ));
        }
    }
    Ok(())
}

pub(super) fn read_problem(ar: &Archive, kind: ProblemKind) -> Result<Problem> {
    check_stored_kind(ar, kind)?;
    refuse_dense_activation(ar, kind)?;
    use Dim::{Any, Is};
    Ok(match kind {
        ProblemKind::Gemv | ProblemKind::Gemm | ProblemKind::DualGemm => {
            check_case_names(ar, kind)?;
            let a = A.read(ar, "", [Any("L"), Any("M"), Any("K/2")], "")?;
            let (l, k2) = (a.l(), a.k() / 2);
            match kind {
                ProblemKind::Gemv => {
                    let b = B.read(ar, "", [Is(l), Is(1), Is(k2)], "gemv: L and K/2 from `a`, one row")?;
                    Problem::Gemv(in_file(ar, "", Gemv::new(a, b, read_alpha(ar, "")?))?)
                }
                ProblemKind::Gemm => {
                    let b = B.read(ar, "", [Is(l), Any("N"), Is(k2)], "L and K/2 from `a`")?;
                    Problem::Gemm(in_file(ar, "", Gemm::new(a, b, read_alpha(ar, "")?))?)
                }
                _ => {
                    let b1 = B1.read(ar, "", [Is(l), Any("N"), Is(k2)], "L and K/2 from `a`")?;
                    let n = b1.rows();
                    let b2 = B2.read(ar, "", [Is(l), Is(n), Is(k2)], "L and K/2 from `a`, N from `b1`")?;
                    Problem::DualGemm(in_file(ar, "", DualGemm::new(a, b1, b2, read_alpha(ar, "")?))?)
                }
            }
        }
        ProblemKind::GroupedGemm => {
            let g = check_case_names(ar, kind)?;
            let groups = (0..g)
                .map(|i| {
                    let s = group_suffix(i);
                    let a = A.read(ar, &s, [Is(1), Any("M"), Any("K/2")], "grouped: L = 1")?;
                    let b = B.read(ar, &s, [Is(1), Any("N"), Is(a.k() / 2)], "grouped: L = 1, K/2 from `a`")?;
                    in_file(ar, &format!("group {i}: "), Gemm::new(a, b, read_alpha(ar, &s)?))
                })
                .collect::<Result<_>>()?;
            Problem::GroupedGemm(GroupedGemm::new(groups)?)
        }
    })
}
