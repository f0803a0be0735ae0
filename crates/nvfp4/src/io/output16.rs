//! W4A16 output files: what an operation returned in either 16-bit type, as `c` F16 or BF16
//! `[L, M, N]` (gemv: N = 1), or one `c_g{i}` `[1, M_i, N_i]` per group of a grouped GEMM,
//! numbered 0, 1, .. without a gap, every tensor of one type (a run rounds to one type).

use std::path::Path;

use safetensors::Dtype;

use super::archive::{tensor_err, Archive, Dim, Entry, Writer, IN_MEMORY};
use super::names::{check_output_names, group_suffix, C};
use crate::format::{OutTensor, OutputDtype};
use crate::memory::{checked_product, checked_sum, ensure_host};
use crate::problem::ProblemKind;
use crate::{Error, Result};

/// The output names of `count` tensors of a `kind` problem.
fn names(kind: ProblemKind, count: usize) -> Vec<String> {
    if kind == ProblemKind::GroupedGemm {
        (0..count).map(|i| format!("{C}{}", group_suffix(i))).collect()
    } else {
        vec![C.to_string()]
    }
}

/// The tensors of `outs`' file; a non-grouped `kind` has exactly one, and all have one type.
fn outputs_writer(kind: ProblemKind, outs: &[OutTensor]) -> Result<Writer<'static>> {
    let single = kind != ProblemKind::GroupedGemm;
    if outs.is_empty() || (single && outs.len() != 1) {
        let want = if single { "one tensor" } else { "one tensor per group" };
        return Err(Error::Invalid(format!("a {kind} output is {want}, given {}", outs.len())));
    }
    if let Some(t) = outs.iter().find(|t| t.dtype() != outs[0].dtype()) {
        return Err(Error::Invalid(format!(
            "outputs of two types ({} and {}) in one file",
            outs[0].dtype(),
            t.dtype()
        )));
    }
    let mut w = Writer::default();
    for (name, t) in names(kind, outs.len()).into_iter().zip(outs) {
        let dtype = match t.dtype() {
            OutputDtype::F16 => Dtype::F16,
            OutputDtype::Bf16 => Dtype::BF16,
        };
        w.push(name, Entry::new(dtype, t.shape().to_vec(), t.to_le_bytes()))?;
    }
    Ok(w)
}

/// The output file of a `kind` problem's `outs` as bytes.
pub fn outputs16_to_bytes(kind: ProblemKind, outs: &[OutTensor]) -> Result<Vec<u8>> {
    outputs_writer(kind, outs)?.into_bytes()
}

/// Writes a `kind` problem's `outs` to `path`, through a temporary file that replaces `path`
/// only once complete.
pub fn save_outputs16(path: &Path, kind: ProblemKind, outs: &[OutTensor]) -> Result<()> {
    // Each tensor is copied once into little-endian bytes for the writer.
    let bytes = checked_sum(outs.iter().map(|t| {
        let [l, rows, cols] = t.shape();
        checked_product(&[l, rows, cols, 2])
    }));
    ensure_host(&format!("writing the output {}", path.display()), bytes)?;
    outputs_writer(kind, outs)?.write(path)
}

/// Reads the 16-bit outputs of a `kind` problem from bytes.
pub fn outputs16_from_bytes(bytes: &[u8], kind: ProblemKind) -> Result<Vec<OutTensor>> {
    read_outputs(&Archive::from_bytes(bytes, Path::new(IN_MEMORY))?, kind)
}

/// Reads the 16-bit outputs of a `kind` problem from the file at `path`, after checking that the
/// host can hold its tensors.
pub fn load_outputs16(path: &Path, kind: ProblemKind) -> Result<Vec<OutTensor>> {
    let ar = Archive::open(path)?;
    ensure_host(&format!("reading the {kind} output {}", path.display()), Some(ar.data_len().saturating_mul(2)))?;
    read_outputs(&ar, kind)
}

fn read_outputs(ar: &Archive, kind: ProblemKind) -> Result<Vec<OutTensor>> {
    use Dim::{Any, Is};
    let count = check_output_names(ar, kind)?;
    let (dims, note) = match kind {
        ProblemKind::Gemv => ([Any("L"), Any("M"), Is(1)], "gemv: one column"),
        ProblemKind::Gemm | ProblemKind::DualGemm => ([Any("L"), Any("M"), Any("N")], ""),
        ProblemKind::GroupedGemm => ([Is(1), Any("M"), Any("N")], "grouped: L = 1"),
    };
    let mut first: Option<Dtype> = None;
    names(kind, count)
        .iter()
        .map(|name| {
            let found = ar.info(name).map(|(d, _)| d);
            let dtype = match (first, found) {
                (Some(f), _) => f,
                (None, Some(d @ (Dtype::F16 | Dtype::BF16))) => d,
                // Missing or of another type: the message names F16 (and the type found).
                (None, _) => Dtype::F16,
            };
            first = Some(dtype);
            let shape = ar.expect(name, dtype, &dims, note)?;
            let out = if dtype == Dtype::BF16 { OutputDtype::Bf16 } else { OutputDtype::F16 };
            let bits = ar.bytes(name)?.chunks_exact(2).map(|p| u16::from_le_bytes([p[0], p[1]])).collect();
            OutTensor::new(out, [shape[0], shape[1], shape[2]], bits).map_err(|e| tensor_err(name, e.to_string()))
        })
        .collect()
}
