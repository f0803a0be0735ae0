//! `quantize_file`: every dense 2-D F32/F16/BF16 tensor `[N, K]` with K a multiple of 16 becomes an
//! NVFP4 weight in the ModelOpt convention (`<name>` U8 [N, K/2], `<name>_scale` F8_E4M3 [N, K/16],
//! `<name>_scale_2` F32 global scale), quantized with [`GlobalScale::Auto`] (so the global scale is
//! finite and at least 2^-126, and the file reads back with `load_weight`; a NaN or an infinity
//! fails the whole file, naming the tensor and the element). Every other tensor is
//! skipped: copied unchanged, and named in the summary with the reason. In strict mode any skip
//! is an error and nothing is written. The header metadata is copied too.

use std::fmt;
use std::path::Path;

use half::{bf16, f16};
use safetensors::Dtype;

use super::archive::{tensor_err, Archive, Entry, Writer};
use super::atomic::check_output;
use super::same_file::refuse_same_file;
use crate::format::{quantize, GlobalScale};
use crate::memory::{checked_product, checked_sum, ensure_host};
use crate::Result;

/// The header metadata key `quantize_file` adds to its output.
pub const QUANTIZED_KEY: &str = "nvfp4_quantized";

/// How [`quantize_file`] treats tensors it cannot quantize.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuantizeOptions {
    /// Refuse the whole file, writing nothing, when any tensor would be skipped.
    pub strict: bool,
}

/// Why a tensor was not quantized.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// Its dtype is not F32, F16 or BF16.
    Dtype,
    /// It is not 2-D.
    NotTwoD,
    /// It has a zero dimension.
    Empty,
    /// Its last dimension K is not a multiple of 16 (one scale per 16 values).
    KNotMultipleOf16,
}

/// One tensor copied unchanged, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Tensor name.
    pub name: String,
    /// Its dtype, as safetensors names it.
    pub dtype: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Why it was not quantized.
    pub reason: SkipReason,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (dtype, shape) = (&self.dtype, &self.shape);
        write!(f, "{} {dtype} {shape:?}: ", self.name)?;
        match self.reason {
            SkipReason::Dtype => write!(f, "{dtype} is not a dtype quantize reads (F32, F16, BF16)"),
            SkipReason::NotTwoD => write!(f, "{}-D, not a 2-D [N, K] weight", shape.len()),
            SkipReason::Empty => f.write_str("has a zero dimension"),
            SkipReason::KNotMultipleOf16 => {
                write!(f, "K = {} is not a multiple of 16 (one scale per 16 values)", shape.last().unwrap_or(&0))
            }
        }
    }
}

/// What [`quantize_file`] did, tensor by tensor, in file order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuantizeSummary {
    /// Quantized tensors: name and dense shape `[N, K]`.
    pub quantized: Vec<(String, [usize; 2])>,
    /// Tensors copied unchanged, with the reason.
    pub skipped: Vec<Skipped>,
    /// Bytes of the input file.
    pub input_bytes: u64,
    /// Bytes of the output file; `None` when the output is a character device or a FIFO,
    /// written in place, whose size says nothing.
    pub output_bytes: Option<u64>,
}

impl fmt::Display for QuantizeSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "quantized {} tensor(s) to NVFP4 (ModelOpt convention):", self.quantized.len())?;
        for (name, [n, k]) in &self.quantized {
            writeln!(
                f,
                "  {name} [{n}, {k}] -> {name} U8 [{n}, {}], {name}_scale F8_E4M3 [{n}, {}], {name}_scale_2 F32",
                k / 2,
                k / 16
            )?;
        }
        writeln!(f, "skipped {} tensor(s), copied unchanged:", self.skipped.len())?;
        for s in &self.skipped {
            writeln!(f, "  {s}")?;
        }
        match self.output_bytes {
            Some(out) => write!(f, "{} bytes in, {out} bytes out", self.input_bytes),
            None => write!(f, "{} bytes in, written in place (not a regular file)", self.input_bytes),
        }
    }
}

/// Little-endian F32/F16/BF16 bytes widened to f32 (exact); `None` for any other dtype.
/// Works on unaligned bytes.
fn widen(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Dtype::BF16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        _ => return None,
    })
}

/// `[N, K]` when a tensor of this dtype and shape is quantized, else why not.
fn classify(dtype: Dtype, shape: &[usize]) -> std::result::Result<[usize; 2], SkipReason> {
    if !matches!(dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) {
        return Err(SkipReason::Dtype);
    }
    let &[n, k] = shape else { return Err(SkipReason::NotTwoD) };
    if n == 0 || k == 0 {
        return Err(SkipReason::Empty);
    }
    if !k.is_multiple_of(16) {
        return Err(SkipReason::KNotMultipleOf16);
    }
    Ok([n, k])
}

/// Host bytes of a quantized `[n, k]` tensor whose dense elements have `elem` bytes: while it is
/// quantized (its bytes, widened to f32, the quantizer's copy, one code per element, packed
/// values and scales twice) and kept for writing (packed values and scales).
fn quantize_bytes(n: usize, k: usize, elem: usize) -> (Option<u64>, Option<u64>) {
    let nk = checked_product(&[n, k]);
    let kept = checked_sum([checked_product(&[n, k / 2]), checked_product(&[n, k / 16]), Some(4)]);
    let working = checked_sum([
        checked_product(&[n, k, elem]),
        nk.and_then(|x| x.checked_mul(4 + 4 + 1)),
        kept.and_then(|x| x.checked_mul(2)),
    ]);
    (working, kept)
}

/// Quantizes the dense file `input` into `output` (see the module docs). Refuses, before reading
/// any tensor, an `output` that is the `input` file or cannot be written ([`check_output`]) and a
/// file whose quantization the host cannot hold. The output replaces `output` only once complete.
pub fn quantize_file(input: &Path, output: &Path, options: QuantizeOptions) -> Result<QuantizeSummary> {
    refuse_same_file(input, output)?;
    check_output(output)?;
    let ar = Archive::open(input)?;
    let mut plan = Vec::new();
    let mut summary = QuantizeSummary::default();
    for name in ar.names() {
        let Some((dtype, shape)) = ar.info(&name) else { continue };
        match classify(dtype, shape) {
            Ok(nk) => plan.push((name, Some(nk))),
            Err(reason) => {
                let dtype = dtype.to_string();
                summary.skipped.push(Skipped { name: name.clone(), dtype, shape: shape.to_vec(), reason });
                plan.push((name, None));
            }
        }
    }
    if options.strict {
        if let Some(first) = summary.skipped.first() {
            let all: Vec<String> = summary.skipped.iter().map(|s| s.to_string()).collect();
            return Err(tensor_err(
                &first.name,
                format!("strict mode: {} tensor(s) would be skipped: {}", all.len(), all.join("; ")),
            ));
        }
    }
    // Peak host use: every tensor kept for writing (copies and quantized results) plus the
    // working set of the largest quantization.
    let mut kept = Vec::new();
    let mut largest = Some(0u64);
    for (name, nk) in &plan {
        match (nk, ar.info(name)) {
            (Some([n, k]), Some((dtype, _))) => {
                let (working, out) = quantize_bytes(*n, *k, dtype.bitsize() / 8);
                largest = largest.zip(working).map(|(a, b)| a.max(b));
                kept.push(out);
            }
            _ => kept.push(ar.byte_len(name)),
        }
    }
    let peak = checked_sum([checked_sum(kept), largest]);
    ensure_host(&format!("quantizing {}", input.display()), peak)?;

    summary.input_bytes = std::fs::metadata(input).map(|m| m.len()).unwrap_or(0);
    let mut w = Writer::default();
    for (key, value) in ar.metadata().into_iter().flatten() {
        w.meta(key, value);
    }
    w.meta(QUANTIZED_KEY, "nvfp4 modelopt");
    for (name, nk) in plan {
        let Some((dtype, shape)) = ar.info(&name) else { continue };
        let data = ar.bytes(&name)?;
        let Some([n, k]) = nk else {
            w.push(name.clone(), Entry::new(dtype, shape.to_vec(), data))?;
            continue;
        };
        let dense = widen(dtype, &data).ok_or_else(|| tensor_err(&name, format!("cannot read {dtype} as floats")))?;
        drop(data);
        // Refuses a NaN or an infinity, naming the first (the library's one rule).
        let t = quantize(&dense, 1, n, k, GlobalScale::Auto).map_err(|e| tensor_err(&name, e.to_string()))?;
        drop(dense);
        let (values, scales) = (t.values().to_vec(), t.scales().to_vec());
        w.push(name.clone(), Entry::new(Dtype::U8, vec![n, k / 2], values))?;
        w.push(format!("{name}_scale"), Entry::new(Dtype::F8_E4M3, vec![n, k / 16], scales))?;
        w.push(format!("{name}_scale_2"), Entry::scalar_f32(t.global_scale()))?;
        summary.quantized.push((name, [n, k]));
    }
    w.write(output)?;
    summary.output_bytes = std::fs::metadata(output).ok().filter(|m| m.is_file()).map(|m| m.len());
    Ok(summary)
}
