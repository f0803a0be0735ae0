//! W4A16 case files (docs/FORMAT.md §10): the weights as in a W4A4 case file (`case.rs`), and the
//! activation as one dense tensor under the activation's name:
//!
//! | tensor | dtype | shape |
//! |---|---|---|
//! | `a` (gemm, dual gemm; `a_g{i}` per group); `b` (gemv: the vector, `a` is the weight) | BF16 or F16 | `[L, rows, K]` |
//!
//! K is not halved (one element per value) and must be a multiple of 16. A dense activation has
//! no scales and no global scale: its `sfa`, `sfa_blocked` and `a_global_scale` (the GEMV's
//! `sfb`, ..) are refused, and so is a grouped case whose groups' activations differ in type.
//! The activation's dtype tells the mode: U8 is W4A4, BF16 or F16 W4A16 (`activation_dtype`).

use std::path::Path;

use safetensors::Dtype;

use super::archive::{tensor_err, Archive, Dim, Entry, Writer, IN_MEMORY};
use super::case::{check_stored_kind, in_file, no_moe_file_form, read_alpha, write_alpha, PROBLEM_KEY};
use super::names::{check_case_names, group_suffix, Operand, A, B, B1, B2};
use crate::format::{OutTensor, OutputDtype};
use crate::memory::ensure_host;
use crate::ops::{DualGemm, Gemm, Gemv, GroupedGemm};
use crate::problem::{Problem16, ProblemKind};
use crate::Result;

/// The operand that is the activation in a `kind` case: the GEMV's vector B, every other A.
pub(super) fn activation_operand(kind: ProblemKind) -> Operand {
    match kind {
        ProblemKind::Gemv => B,
        ProblemKind::Gemm | ProblemKind::DualGemm | ProblemKind::GroupedGemm => A,
    }
}

/// The name of the activation tensor of a `kind` case (group 0's for the grouped GEMM).
pub(super) fn activation_name(kind: ProblemKind) -> String {
    let suffix = if kind == ProblemKind::GroupedGemm { group_suffix(0) } else { String::new() };
    activation_operand(kind).values_name(&suffix)
}

fn dense_dtype(dtype: Dtype) -> Option<OutputDtype> {
    match dtype {
        Dtype::BF16 => Some(OutputDtype::Bf16),
        Dtype::F16 => Some(OutputDtype::F16),
        _ => None,
    }
}

fn file_dtype(dtype: OutputDtype) -> Dtype {
    match dtype {
        OutputDtype::Bf16 => Dtype::BF16,
        OutputDtype::F16 => Dtype::F16,
    }
}

/// The mode of a `kind` case file from its activation tensor's dtype: `None` for U8 (W4A4),
/// the 16-bit type for BF16 or F16 (W4A16). A missing activation or another dtype is an error
/// naming the tensor and both forms.
pub(super) fn activation_dtype(ar: &Archive, kind: ProblemKind) -> Result<Option<OutputDtype>> {
    let name = activation_name(kind);
    let forms = "U8 [L, rows, K/2] (NVFP4 activations, W4A4) or BF16/F16 [L, rows, K] (16-bit, W4A16)";
    match ar.info(&name) {
        None => Err(tensor_err(&name, format!("missing from the file (expected {forms})"))),
        Some((Dtype::U8, _)) => Ok(None),
        Some((dtype, shape)) => dense_dtype(dtype)
            .map(Some)
            .ok_or_else(|| tensor_err(&name, format!("expected {forms}, found {dtype} {shape:?}"))),
    }
}

/// Refuses a W4A16 file read as W4A4, naming the reader that takes it.
pub(super) fn refuse_dense_activation(ar: &Archive, kind: ProblemKind) -> Result<()> {
    let name = activation_name(kind);
    match ar.info(&name) {
        Some((dtype, _)) if dense_dtype(dtype).is_some() => Err(tensor_err(
            &name,
            format!("is {dtype}: a W4A16 case (16-bit activations), which io::load_case reads; not a W4A4 case"),
        )),
        _ => Ok(()),
    }
}

/// Writes one dense activation under `name`.
fn write_dense<'a>(w: &mut Writer<'a>, name: String, t: &OutTensor) -> Result<()> {
    w.push(name, Entry::new(file_dtype(t.dtype()), t.shape().to_vec(), t.to_le_bytes()))
}

/// The tensors of `p`'s case file.
fn problem16_writer(p: &Problem16) -> Result<Writer<'_>> {
    let mut w = Writer::default();
    w.meta(PROBLEM_KEY, p.kind().name());
    match p {
        Problem16::Gemv(g) => {
            A.write(&mut w, "", &g.a)?;
            write_dense(&mut w, B.values_name(""), &g.b)?;
            write_alpha(&mut w, "", g.alpha)?;
        }
        Problem16::Gemm(g) => {
            write_dense(&mut w, A.values_name(""), &g.a)?;
            B.write(&mut w, "", &g.b)?;
            write_alpha(&mut w, "", g.alpha)?;
        }
        Problem16::DualGemm(d) => {
            write_dense(&mut w, A.values_name(""), &d.a)?;
            B1.write(&mut w, "", &d.b1)?;
            B2.write(&mut w, "", &d.b2)?;
            write_alpha(&mut w, "", d.alpha)?;
        }
        Problem16::GroupedGemm(g) => {
            for (i, gemm) in g.groups.iter().enumerate() {
                let s = group_suffix(i);
                write_dense(&mut w, A.values_name(&s), &gemm.a)?;
                B.write(&mut w, &s, &gemm.b)?;
                write_alpha(&mut w, &s, gemm.alpha)?;
            }
        }
        Problem16::Moe(_) => return Err(no_moe_file_form()),
    }
    Ok(w)
}

/// The case file of the W4A16 problem `p` as bytes.
pub fn problem16_to_bytes(p: &Problem16) -> Result<Vec<u8>> {
    problem16_writer(p)?.into_bytes()
}

/// Writes the case file of the W4A16 problem `p` to `path`, through a temporary file that
/// replaces `path` only once complete.
pub fn save_problem16(path: &Path, p: &Problem16) -> Result<()> {
    problem16_writer(p)?.write(path)
}

/// Reads a W4A16 `kind` problem from case-file bytes.
pub fn problem16_from_bytes(bytes: &[u8], kind: ProblemKind) -> Result<Problem16> {
    read_problem16(&Archive::from_bytes(bytes, Path::new(IN_MEMORY))?, kind)
}

/// Reads a W4A16 `kind` problem from the case file at `path`, after checking that the host can
/// hold the file's tensors.
pub fn load_problem16(path: &Path, kind: ProblemKind) -> Result<Problem16> {
    let ar = Archive::open(path)?;
    ensure_host(&format!("reading the W4A16 {kind} case {}", path.display()), Some(ar.data_len()))?;
    read_problem16(&ar, kind)
}

/// The dense activation `name`, BF16 or F16: of `dtype` when given (the first group's, so that
/// every group has one type), its shape checked against `dims`.
fn read_dense(ar: &Archive, name: &str, dtype: Option<OutputDtype>, dims: [Dim; 3], note: &str) -> Result<OutTensor> {
    let want: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    let want = format!("BF16 or F16 [{}]", want.join(", "));
    let Some((found, shape)) = ar.info(name) else {
        return Err(tensor_err(name, format!("missing from the file (expected {want})")));
    };
    let Some(got) = dense_dtype(found) else {
        return Err(tensor_err(name, format!("expected {want} (a 16-bit activation), found {found} {shape:?}")));
    };
    if let Some(first) = dtype.filter(|&d| d != got) {
        return Err(tensor_err(
            name,
            format!("is {found}, the first group's activation {}: one case has one activation type", file_dtype(first)),
        ));
    }
    let shape = ar.expect(name, found, &dims, note)?;
    let (l, rows, k) = (shape[0], shape[1], shape[2]);
    if !k.is_multiple_of(16) {
        return Err(tensor_err(name, format!("last dimension K = {k} is not a multiple of 16 (the weights' blocks)")));
    }
    let bits = ar.bytes(name)?.chunks_exact(2).map(|p| u16::from_le_bytes([p[0], p[1]])).collect();
    OutTensor::new(got, [l, rows, k], bits).map_err(|e| tensor_err(name, e.to_string()))
}

/// Refuses scales or a global scale for the dense activation of every group of a `kind` case.
fn refuse_activation_scales(ar: &Archive, kind: ProblemKind, groups: usize) -> Result<()> {
    let op = activation_operand(kind);
    let suffixes: Vec<String> =
        if kind == ProblemKind::GroupedGemm { (0..groups).map(group_suffix).collect() } else { vec![String::new()] };
    for s in &suffixes {
        for name in [op.plain_name(s), op.blocked_name(s), op.global_name(s)] {
            if ar.has(&name) {
                return Err(tensor_err(
                    &name,
                    format!(
                        "`{}` is a 16-bit activation (W4A16), which has no scales and no global scale",
                        op.values_name(s)
                    ),
                ));
            }
        }
    }
    Ok(())
}

pub(super) fn read_problem16(ar: &Archive, kind: ProblemKind) -> Result<Problem16> {
    check_stored_kind(ar, kind)?;
    let groups = check_case_names(ar, kind)?;
    if activation_dtype(ar, kind)?.is_none() {
        return Err(tensor_err(
            &activation_name(kind),
            "is U8: a W4A4 case (NVFP4 activations), which io::load_problem reads; not a W4A16 case",
        ));
    }
    refuse_activation_scales(ar, kind, groups)?;
    use Dim::{Any, Is};
    Ok(match kind {
        ProblemKind::Gemv => {
            let a = A.read(ar, "", [Any("L"), Any("M"), Any("K/2")], "")?;
            let note = "gemv: L and K from `a`, one row";
            let b = read_dense(ar, "b", None, [Is(a.l()), Is(1), Is(a.k())], note)?;
            Problem16::Gemv(in_file(ar, "", Gemv::new(a, b, read_alpha(ar, "")?))?)
        }
        ProblemKind::Gemm | ProblemKind::DualGemm => {
            let a = read_dense(ar, "a", None, [Any("L"), Any("M"), Any("K")], "")?;
            let [l, _, k] = a.shape();
            let dims = [Is(l), Any("N"), Is(k / 2)];
            if kind == ProblemKind::Gemm {
                let b = B.read(ar, "", dims, "L and K from `a`")?;
                Problem16::Gemm(in_file(ar, "", Gemm::new(a, b, read_alpha(ar, "")?))?)
            } else {
                let b1 = B1.read(ar, "", dims, "L and K from `a`")?;
                let n = b1.rows();
                let b2 = B2.read(ar, "", [Is(l), Is(n), Is(k / 2)], "L and K from `a`, N from `b1`")?;
                Problem16::DualGemm(in_file(ar, "", DualGemm::new(a, b1, b2, read_alpha(ar, "")?))?)
            }
        }
        ProblemKind::GroupedGemm => {
            let mut dtype = None;
            let gemms = (0..groups)
                .map(|i| {
                    let s = group_suffix(i);
                    let a = read_dense(ar, &A.values_name(&s), dtype, [Is(1), Any("M"), Any("K")], "grouped: L = 1")?;
                    dtype = Some(a.dtype());
                    let k = a.shape()[2];
                    let b = B.read(ar, &s, [Is(1), Any("N"), Is(k / 2)], "grouped: L = 1, K from `a`")?;
                    in_file(ar, &format!("group {i}: "), Gemm::new(a, b, read_alpha(ar, &s)?))
                })
                .collect::<Result<_>>()?;
            Problem16::GroupedGemm(GroupedGemm::new(gemms)?)
        }
    })
}

/// Refuses a W4A16 shape the file form cannot hold: as [`check_file_form`](super::check_file_form).
pub fn check_file_form16(p: &Problem16) -> Result<()> {
    match p {
        Problem16::Moe(_) => Err(no_moe_file_form()),
        _ => Ok(()),
    }
}
