//! What a reader's `Ok` must satisfy, judged from the file's bytes independently of the reader:
//! the file is a valid container, the value holds exactly the file's bytes under the names the
//! format gives them, and no tensor that looks like ours was left unused.

use std::collections::BTreeMap;

use nvfp4::io::{output_to_bytes, problem_to_bytes, WeightConvention, PROBLEM_KEY};
use nvfp4::{Nvfp4Tensor, Output, Problem, ProblemKind};
use safetensors::{Dtype, SafeTensors};

/// One tensor of a file: dtype, shape, bytes.
type Raw = (Dtype, Vec<usize>, Vec<u8>);

type Verdict = Result<(), String>;

/// The tensors and metadata of a file, or why the container itself is invalid.
fn contents(bytes: &[u8]) -> Result<(BTreeMap<String, Raw>, Option<String>), String> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| format!("accepted an invalid container: {e}"))?;
    let map = st.tensors().into_iter().map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec()))).collect();
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(|e| e.to_string())?;
    let kind = meta.metadata().as_ref().and_then(|m| m.get(PROBLEM_KEY).cloned());
    Ok((map, kind))
}

/// The value of an F32 scalar (shape `[]` or `[1]`).
fn scalar(raw: &Raw) -> Option<f32> {
    let (dtype, shape, data) = raw;
    (*dtype == Dtype::F32 && shape.iter().product::<usize>() == 1 && shape.len() <= 1)
        .then(|| f32::from_le_bytes(data[..4].try_into().unwrap()))
}

/// Whether `name` is one of the case or output names, with or without a group suffix.
fn looks_like_ours(name: &str, output: bool) -> bool {
    const CASE: [&str; 17] = [
        "a",
        "b",
        "b1",
        "b2",
        "sfa",
        "sfb",
        "sfb1",
        "sfb2",
        "sfa_blocked",
        "sfb_blocked",
        "sfb1_blocked",
        "sfb2_blocked",
        "a_global_scale",
        "b_global_scale",
        "b1_global_scale",
        "b2_global_scale",
        "alpha",
    ];
    let known = |base: &str| if output { base == "c" } else { CASE.contains(&base) };
    if known(name) {
        return true;
    }
    match name.rfind("_g") {
        Some(i) => {
            let digits = &name[i + 2..];
            known(&name[..i]) && !digits.is_empty() && digits.bytes().all(|c| c.is_ascii_digit())
        }
        None => false,
    }
}

/// Every tensor `written` (the value serialized again) is in `file` with the same bytes, and every
/// name of ours in `file` was written (a global scale of 1.0 is not written, and may be left out).
fn same_tensors(file: &BTreeMap<String, Raw>, written: &BTreeMap<String, Raw>, output: bool) -> Verdict {
    for (name, w) in written {
        let Some(f) = file.get(name) else { return Err(format!("the value has `{name}`, the file does not")) };
        let same = match (scalar(w), scalar(f)) {
            (Some(a), Some(b)) => a.to_bits() == b.to_bits(),
            _ => w == f,
        };
        if !same {
            return Err(format!("`{name}` differs from the file"));
        }
    }
    for (name, f) in file {
        if looks_like_ours(name, output) && !written.contains_key(name) {
            let unit_global = name.contains("_global_scale") && scalar(f) == Some(1.0);
            if !unit_global {
                return Err(format!("`{name}` is in the file but the value does not use it"));
            }
        }
    }
    Ok(())
}

/// A problem read as `kind` from `bytes`.
pub fn problem(bytes: &[u8], kind: ProblemKind, p: &Problem) -> Verdict {
    let (file, stored) = contents(bytes)?;
    if p.kind() != kind {
        return Err(format!("asked for {kind}, got {}", p.kind()));
    }
    if let Some(stored) = stored {
        if stored != kind.name() {
            return Err(format!("the file says it holds a `{stored}` case"));
        }
    }
    let (written, _) = contents(&problem_to_bytes(p).map_err(|e| e.to_string())?)?;
    same_tensors(&file, &written, false)
}

/// An output read as `kind` from `bytes`.
pub fn output(bytes: &[u8], kind: ProblemKind, out: &Output) -> Verdict {
    let (file, _) = contents(bytes)?;
    match (kind, out) {
        (ProblemKind::GroupedGemm, Output::Grouped(ts)) if ts.iter().all(|t| t.l() == 1) => {}
        (ProblemKind::Gemv, Output::Single(t)) if t.cols() == 1 => {}
        (ProblemKind::Gemm | ProblemKind::DualGemm, Output::Single(_)) => {}
        _ => return Err(format!("a {kind} output of the wrong form: {:?}", out.tensors().len())),
    }
    let (written, _) = contents(&output_to_bytes(out).map_err(|e| e.to_string())?)?;
    same_tensors(&file, &written, true)
}

/// A weight read under `prefix` from `bytes`.
pub fn weight(bytes: &[u8], prefix: &str, t: &Nvfp4Tensor, conv: WeightConvention) -> Verdict {
    let (file, _) = contents(bytes)?;
    let get = |name: &str| file.get(&format!("{prefix}{name}")).ok_or(format!("no `{prefix}{name}` in the file"));
    let (values, global) = match conv {
        WeightConvention::ModelOpt => (get("weight")?, get("weight_scale_2")?),
        WeightConvention::CompressedTensors => (get("weight_packed")?, get("weight_global_scale")?),
    };
    let scales = get("weight_scale")?;
    let (n, k) = (t.rows(), t.k());
    if t.l() != 1 || !k.is_multiple_of(16) {
        return Err(format!("a weight of L = {} and K = {k}", t.l()));
    }
    if *values != (Dtype::U8, vec![n, k / 2], t.values().to_vec()) {
        return Err("values differ from the file".into());
    }
    if *scales != (Dtype::F8_E4M3, vec![n, k / 16], t.scales().to_vec()) {
        return Err("scales differ from the file".into());
    }
    let g = scalar(global).ok_or("the global scale is not an F32 scalar")?;
    let want = match conv {
        WeightConvention::ModelOpt => g,
        WeightConvention::CompressedTensors => 1.0 / g,
    };
    let ok = g.is_finite() && g > 0.0 && want.is_finite() && want.to_bits() == t.global_scale().to_bits();
    if !ok {
        return Err(format!("global scale {} from a stored {g}", t.global_scale()));
    }
    Ok(())
}

/// The kind a header names.
pub fn stored_kind(bytes: &[u8], got: Option<ProblemKind>) -> Verdict {
    let (_, stored) = contents(bytes)?;
    match (stored, got) {
        (None, None) => Ok(()),
        (Some(s), Some(k)) if s == k.name() => Ok(()),
        (s, g) => Err(format!("metadata {s:?}, reported {g:?}")),
    }
}
