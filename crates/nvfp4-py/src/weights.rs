//! Reading one NVFP4 linear layer from a safetensors checkpoint (ModelOpt or compressed-tensors,
//! through the library's readers) with its activation scale and its bias, for
//! `nvfp4.torch.Linear`.

use std::path::PathBuf;

use nvfp4::io::weights::{load_weight, WeightConvention};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use safetensors::{Dtype, SafeTensors};

use crate::error::{value, IntoPy, PyResult};

/// The activation global scale of the layer, if the file has one: ModelOpt `input_scale`
/// (global, multiply) or compressed-tensors `input_global_scale` (1 / global).
fn input_scale(st: &SafeTensors<'_>, prefix: &str, convention: WeightConvention) -> PyResult<Option<f32>> {
    let (name, inverse) = match convention {
        WeightConvention::ModelOpt => (format!("{prefix}input_scale"), false),
        WeightConvention::CompressedTensors => (format!("{prefix}input_global_scale"), true),
    };
    let Ok(t) = st.tensor(&name) else { return Ok(None) };
    if t.dtype() != Dtype::F32 || t.data().len() != 4 {
        return Err(value(format!("tensor `{name}`: must be one F32, got {:?} of shape {:?}", t.dtype(), t.shape())));
    }
    let d = t.data();
    let v = f32::from_le_bytes([d[0], d[1], d[2], d[3]]);
    let g = if inverse { 1.0 / v } else { v };
    if !(g.is_finite() && g > 0.0) {
        return Err(value(format!("tensor `{name}`: {v} does not give a finite positive global scale")));
    }
    Ok(Some(g))
}

/// The layer's bias `{prefix}bias`, if the file has one: its little-endian bytes and its type's
/// torch name; F32, F16 or BF16 of shape `[N]`.
fn bias<'py>(
    py: Python<'py>,
    st: &SafeTensors<'_>,
    prefix: &str,
    n: usize,
) -> PyResult<Option<(Bound<'py, PyBytes>, &'static str)>> {
    let name = format!("{prefix}bias");
    let Ok(t) = st.tensor(&name) else { return Ok(None) };
    let ty = match t.dtype() {
        Dtype::F32 => "float32",
        Dtype::F16 => "float16",
        Dtype::BF16 => "bfloat16",
        other => return Err(value(format!("tensor `{name}`: a bias must be F32, F16 or BF16, got {other:?}"))),
    };
    if t.shape() != [n] {
        return Err(value(format!("tensor `{name}`: a bias must be [N] = [{n}], got shape {:?}", t.shape())));
    }
    Ok(Some((PyBytes::new(py, t.data()), ty)))
}

/// What `load_linear` returns to Python: values bytes, scales bytes, N, K, the weight's global
/// scale, the activation global scale if any, the convention's name, the bias (bytes and type
/// name) if any.
type Linear<'py> = (
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    usize,
    usize,
    f32,
    Option<f32>,
    String,
    Option<(Bound<'py, PyBytes>, &'static str)>,
);

/// The layer under `prefix`: values `[N, K/2]` and plain scales `[N, K/16]` as bytes, N, K, the
/// global scales, the convention and the bias.
#[pyfunction]
pub fn load_linear<'py>(py: Python<'py>, path: PathBuf, prefix: &str) -> PyResult<Linear<'py>> {
    let (w, convention) = load_weight(&path, prefix).py()?;
    let bytes = std::fs::read(&path).map_err(|e| value(format!("{}: {e}", path.display())))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| value(format!("{}: {e}", path.display())))?;
    let input = input_scale(&st, prefix, convention)?;
    let bias = bias(py, &st, prefix, w.rows())?;
    Ok((
        PyBytes::new(py, w.values()),
        PyBytes::new(py, w.scales()),
        w.rows(),
        w.k(),
        w.global_scale(),
        input,
        convention.to_string(),
        bias,
    ))
}
