//! Output files: what an operation returned, as `c` F16 `[L, M, N]` (gemv: N = 1), or one
//! `c_g{i}` F16 `[1, M_i, N_i]` per group of a grouped GEMM, numbered 0, 1, .. without a gap.

use std::path::Path;

use half::f16;
use safetensors::Dtype;

use super::archive::{tensor_err, Archive, Dim, Entry, Writer, IN_MEMORY};
use super::names::{check_output_names, group_suffix, C};
use crate::format::F16Tensor;
use crate::memory::{checked_product, checked_sum, ensure_host};
use crate::problem::{Output, ProblemKind};
use crate::Result;

fn f16_entry(t: &F16Tensor) -> Entry<'static> {
    let bytes: Vec<u8> = t.data().iter().flat_map(|v| v.to_le_bytes()).collect();
    Entry::new(Dtype::F16, t.shape().to_vec(), bytes)
}

/// The tensors of `out`'s file.
fn output_writer(out: &Output) -> Result<Writer<'static>> {
    let mut w = Writer::default();
    match out {
        Output::Single(t) => w.push(C.into(), f16_entry(t))?,
        Output::Grouped(ts) => {
            for (i, t) in ts.iter().enumerate() {
                w.push(format!("{C}{}", group_suffix(i)), f16_entry(t))?;
            }
        }
    }
    Ok(w)
}

/// The output file of `out` as bytes: `c`, or `c_g{i}` per group.
pub fn output_to_bytes(out: &Output) -> Result<Vec<u8>> {
    output_writer(out)?.into_bytes()
}

/// Writes `out` to `path`, through a temporary file that replaces `path` only once complete.
pub fn save_output(path: &Path, out: &Output) -> Result<()> {
    // Each tensor is copied once into little-endian bytes for the writer.
    let bytes = checked_sum(out.tensors().iter().map(|t| checked_product(&[t.l(), t.rows(), t.cols(), 2])));
    ensure_host(&format!("writing the output {}", path.display()), bytes)?;
    output_writer(out)?.write(path)
}

/// Reads the output of a `kind` problem from bytes.
pub fn output_from_bytes(bytes: &[u8], kind: ProblemKind) -> Result<Output> {
    read_output(&Archive::from_bytes(bytes, Path::new(IN_MEMORY))?, kind)
}

/// Reads the output of a `kind` problem from the file at `path`, after checking that the host
/// can hold its tensors.
pub fn load_output(path: &Path, kind: ProblemKind) -> Result<Output> {
    let ar = Archive::open(path)?;
    ensure_host(&format!("reading the {kind} output {}", path.display()), Some(ar.data_len().saturating_mul(2)))?;
    read_output(&ar, kind)
}

fn read_f16(ar: &Archive, name: &str, dims: [Dim; 3], note: &str) -> Result<F16Tensor> {
    let shape = ar.expect(name, Dtype::F16, &dims, note)?;
    let data = ar.bytes(name)?.chunks_exact(2).map(|p| f16::from_le_bytes([p[0], p[1]])).collect();
    F16Tensor::new(shape[0], shape[1], shape[2], data).map_err(|e| tensor_err(name, e.to_string()))
}

fn read_output(ar: &Archive, kind: ProblemKind) -> Result<Output> {
    use Dim::{Any, Is};
    let count = check_output_names(ar, kind)?;
    Ok(match kind {
        ProblemKind::Gemv => Output::Single(read_f16(ar, C, [Any("L"), Any("M"), Is(1)], "gemv: one column")?),
        ProblemKind::Gemm | ProblemKind::DualGemm => {
            Output::Single(read_f16(ar, C, [Any("L"), Any("M"), Any("N")], "")?)
        }
        ProblemKind::GroupedGemm => {
            let ts = (0..count)
                .map(|i| {
                    read_f16(ar, &format!("{C}{}", group_suffix(i)), [Is(1), Any("M"), Any("N")], "grouped: L = 1")
                })
                .collect::<Result<_>>()?;
            Output::Grouped(ts)
        }
    })
}
