//! `quantize_file`: every dense 2-D F32/F16/BF16 tensor `[N, K]` with K a multiple of 16 becomes an
//! NVFP4 weight in the ModelOpt convention (`<name>` U8 [N, K/2], `<name>_scale` F8_E4M3 [N, K/16],
//! `<name>_scale_2` F32 global scale), quantized with [`GlobalScale::Auto`]; every other tensor is
//! copied unchanged, and so is the header metadata.

use std::fmt;
use std::path::Path;

use half::{bf16, f16};
use safetensors::Dtype;

use super::archive::{read_file, tensor_err, Archive, Entry, Writer};
use crate::format::{quantize, GlobalScale};
use crate::Result;

/// The header metadata key `quantize_file` adds to its output.
pub const QUANTIZED_KEY: &str = "nvfp4_quantized";

/// What [`quantize_file`] did, tensor by tensor, in file order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuantizeSummary {
    /// Quantized tensors: name and dense shape `[N, K]`.
    pub quantized: Vec<(String, [usize; 2])>,
    /// Tensors copied unchanged.
    pub copied: Vec<String>,
    /// Bytes of the input file.
    pub input_bytes: u64,
    /// Bytes of the output file.
    pub output_bytes: u64,
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
        writeln!(f, "copied {} tensor(s) unchanged:", self.copied.len())?;
        for name in &self.copied {
            writeln!(f, "  {name}")?;
        }
        write!(f, "{} bytes in, {} bytes out", self.input_bytes, self.output_bytes)
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

/// `[N, K]` if `name` is a tensor `quantize_file` quantizes.
fn quantizable(dtype: Dtype, shape: &[usize]) -> Option<[usize; 2]> {
    match (dtype, shape) {
        (Dtype::F32 | Dtype::F16 | Dtype::BF16, &[n, k]) if n >= 1 && k >= 16 && k.is_multiple_of(16) => Some([n, k]),
        _ => None,
    }
}

/// Quantizes the dense file `input` into `output` (see the module docs).
pub fn quantize_file(input: &Path, output: &Path) -> Result<QuantizeSummary> {
    let bytes = read_file(input)?;
    let ar = Archive::from_bytes(&bytes, input)?;
    let mut summary = QuantizeSummary { input_bytes: bytes.len() as u64, ..Default::default() };
    let mut w = Writer::default();
    for (key, value) in ar.metadata().into_iter().flatten() {
        w.meta(key, value);
    }
    w.meta(QUANTIZED_KEY, "nvfp4 modelopt");
    for name in ar.names() {
        let Some((dtype, shape)) = ar.info(&name) else { continue };
        let data = ar.bytes(&name)?;
        let Some([n, k]) = quantizable(dtype, shape) else {
            w.push(name.clone(), Entry::new(dtype, shape.to_vec(), data))?;
            summary.copied.push(name);
            continue;
        };
        let dense = widen(dtype, &data).ok_or_else(|| tensor_err(&name, format!("cannot read {dtype} as floats")))?;
        if let Some(i) = dense.iter().position(|v| !v.is_finite()) {
            return Err(tensor_err(
                &name,
                format!("element {i} is {}: NVFP4 has no inf or NaN, refusing to quantize", dense[i]),
            ));
        }
        let t = quantize(&dense, 1, n, k, GlobalScale::Auto).map_err(|e| tensor_err(&name, e.to_string()))?;
        let (values, scales) = (t.values().to_vec(), t.scales().to_vec());
        w.push(name.clone(), Entry::new(Dtype::U8, vec![n, k / 2], values))?;
        w.push(format!("{name}_scale"), Entry::new(Dtype::F8_E4M3, vec![n, k / 16], scales))?;
        w.push(format!("{name}_scale_2"), Entry::scalar_f32(t.global_scale()))?;
        summary.quantized.push((name, [n, k]));
    }
    w.write(output)?;
    summary.output_bytes = std::fs::metadata(output).map(|m| m.len()).unwrap_or(0);
    Ok(summary)
}
