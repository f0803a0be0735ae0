//! One NVFP4 linear weight from a checkpoint, as an [`Nvfp4Tensor`] with L = 1, rows = N and plain
//! scales. Two conventions exist in the wild (SPEC §1):
//!
//! | convention | values | block scales | global scale |
//! |---|---|---|---|
//! | ModelOpt | `<prefix>weight` U8 [N, K/2] | `<prefix>weight_scale` F8_E4M3 [N, K/16] | `<prefix>weight_scale_2` F32 = global |
//! | compressed-tensors | `<prefix>weight_packed` U8 [N, K/2] | `<prefix>weight_scale` F8_E4M3 [N, K/16] | `<prefix>weight_global_scale` F32 = 1 / global |
//!
//! Only the header and the three tensors are read, whatever the size of the file.

use std::fmt;
use std::path::Path;

use safetensors::Dtype;

use super::archive::{tensor_err, Archive, Dim, IN_MEMORY};
use crate::format::{Nvfp4Tensor, ScaleLayout};
use crate::ops::global_scale_rule;
use crate::Result;

/// Which checkpoint convention a weight was stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightConvention {
    /// NVIDIA ModelOpt: `weight`, `weight_scale`, `weight_scale_2` (global, multiply).
    ModelOpt,
    /// compressed-tensors (vLLM / llm-compressor): `weight_packed`, `weight_scale`,
    /// `weight_global_scale` (1 / global, divide).
    CompressedTensors,
}

impl fmt::Display for WeightConvention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WeightConvention::ModelOpt => "modelopt",
            WeightConvention::CompressedTensors => "compressed-tensors",
        })
    }
}

/// Packed values `[N, K/2]` and their plain scales `[N, K/16]` as an L = 1 tensor.
fn packed(ar: &Archive, values: &str, scales: &str) -> Result<Nvfp4Tensor> {
    let shape = ar.expect(values, Dtype::U8, &[Dim::Any("N"), Dim::Any("K/2")], "")?;
    let (n, k2) = (shape[0], shape[1]);
    let k = 2 * k2;
    if !k.is_multiple_of(16) {
        return Err(tensor_err(
            values,
            format!("last dimension {k2} means K = {k}, not a multiple of 16 (one E4M3 scale per 16 values)"),
        ));
    }
    let why = format!("[N, K/16] from `{values}`");
    ar.expect(scales, Dtype::F8_E4M3, &[Dim::Is(n), Dim::Is(k / 16)], &why)?;
    let v = ar.bytes(values)?.into_owned();
    let s = ar.bytes(scales)?.into_owned();
    Nvfp4Tensor::new(1, n, k, v, s, ScaleLayout::Plain).map_err(|e| tensor_err(values, e.to_string()))
}

/// A required F32 scalar under the global-scale rule (finite and > 0; the reciprocal that
/// compressed-tensors stores too).
fn positive_scalar(ar: &Archive, name: &str) -> Result<f32> {
    match ar.scalar_f32(name)? {
        None => Err(tensor_err(name, "missing from the file (expected an F32 scalar, shape [] or [1])")),
        Some(v) => global_scale_rule(v).map_err(|e| tensor_err(name, e)),
    }
}

fn modelopt(ar: &Archive, prefix: &str) -> Result<Nvfp4Tensor> {
    let t = packed(ar, &format!("{prefix}weight"), &format!("{prefix}weight_scale"))?;
    let global = positive_scalar(ar, &format!("{prefix}weight_scale_2"))?;
    Ok(t.with_global_scale(global))
}

fn compressed_tensors(ar: &Archive, prefix: &str) -> Result<Nvfp4Tensor> {
    let t = packed(ar, &format!("{prefix}weight_packed"), &format!("{prefix}weight_scale"))?;
    let name = format!("{prefix}weight_global_scale");
    let inverse = positive_scalar(ar, &name)?;
    let global = 1.0 / inverse;
    if !global.is_finite() {
        return Err(tensor_err(&name, format!("{inverse} is too small: 1 / {inverse} overflows f32")));
    }
    Ok(t.with_global_scale(global))
}

fn detect(ar: &Archive, prefix: &str) -> Result<(Nvfp4Tensor, WeightConvention)> {
    let (packed, plain) = (format!("{prefix}weight_packed"), format!("{prefix}weight"));
    if ar.has(&packed) {
        Ok((compressed_tensors(ar, prefix)?, WeightConvention::CompressedTensors))
    } else if ar.has(&plain) {
        Ok((modelopt(ar, prefix)?, WeightConvention::ModelOpt))
    } else {
        Err(tensor_err(
            &plain,
            format!(
                "missing from the file: neither `{plain}` (ModelOpt) nor `{packed}` (compressed-tensors) is present"
            ),
        ))
    }
}

/// Loads the ModelOpt weight under `prefix` (e.g. `model.layers.0.mlp.down_proj.`).
pub fn load_modelopt_weight(path: &Path, prefix: &str) -> Result<Nvfp4Tensor> {
    modelopt(&Archive::open(path)?, prefix)
}

/// Loads the compressed-tensors weight under `prefix`; its global scale is 1 / `weight_global_scale`.
pub fn load_compressed_tensors_weight(path: &Path, prefix: &str) -> Result<Nvfp4Tensor> {
    compressed_tensors(&Archive::open(path)?, prefix)
}

/// Loads the weight under `prefix`, telling the convention by the names present
/// (`weight_packed`: compressed-tensors; `weight`: ModelOpt).
pub fn load_weight(path: &Path, prefix: &str) -> Result<(Nvfp4Tensor, WeightConvention)> {
    detect(&Archive::open(path)?, prefix)
}

/// [`load_weight`] on a file held in memory.
pub fn weight_from_bytes(bytes: &[u8], prefix: &str) -> Result<(Nvfp4Tensor, WeightConvention)> {
    detect(&Archive::from_bytes(bytes, Path::new(IN_MEMORY))?, prefix)
}
