//! `quantize`: dense f32/f16/bf16 to NVFP4 in the ModelOpt convention, on the CPU (the library's
//! quantizer) or the GPU (the quantizer kernels on the caller's stream), into caller-owned
//! values, scales and global scale. A NaN or an infinity is refused on the CPU; on the GPU it
//! gives its block the E4M3 NaN scale, unless `check_finite` pays a synchronization to refuse it.

use half::{bf16, f16};
use nvfp4::backend::cuda::{DenseType, DenseView, GlobalSource, ScalarView};
use nvfp4::format::{quantize as cpu_quantize, GlobalScale};
use nvfp4::ScaleLayout;
use pyo3::prelude::*;

use crate::cuda::with_device;
use crate::error::{dtype, kind, value, IntoPy, PyResult};
use crate::gil::Detach;
use crate::operand::{parse_layout, Operand};
use crate::tensor::{Device, Dtype, Importer, Tensor};

pub(crate) fn dense_type(t: &Tensor) -> PyResult<DenseType> {
    match t.dtype {
        Dtype::F32 => Ok(DenseType::F32),
        Dtype::F16 => Ok(DenseType::F16),
        Dtype::Bf16 => Ok(DenseType::Bf16),
        d => Err(dtype(format!("{}: quantize takes float32, float16 or bfloat16, got {d}", t.name))),
    }
}

/// A one-element f32 tensor.
fn check_scalar(t: &Tensor) -> PyResult<()> {
    if t.dtype != Dtype::F32 || t.numel() != 1 {
        return Err(value(format!("{}: must be one float32, got {} of shape {:?}", t.name, t.dtype, t.shape)));
    }
    Ok(())
}

/// The host input as f32 (exact widening).
fn host_f32(x: &Tensor, ty: DenseType) -> PyResult<Vec<f32>> {
    let b = x.host_bytes(ty.size())?;
    Ok(match ty {
        DenseType::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        DenseType::F16 => b.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        DenseType::Bf16 => b.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
    })
}

#[pyfunction]
#[pyo3(signature = (x, values, scales, global_out, global_scale=None, layout="plain", stream=None, check_finite=false))]
#[allow(clippy::too_many_arguments)]
pub fn quantize(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    values: &Bound<'_, PyAny>,
    scales: &Bound<'_, PyAny>,
    global_out: &Bound<'_, PyAny>,
    global_scale: Option<&Bound<'_, PyAny>>,
    layout: &str,
    stream: Option<u64>,
    check_finite: bool,
) -> PyResult<()> {
    let layout = parse_layout(Some(layout))?.unwrap_or(ScaleLayout::Plain);
    let mut imports = Importer::new(stream);
    let x = imports.tensor(x, "x")?;
    // The input's type and shape first: a message about them beats one about the outputs.
    dense_type(&x)?;
    input_dims(&x)?;
    let v = imports.tensor(values, "values")?;
    let s = imports.tensor(scales, "scales")?;
    let g_out = imports.tensor(global_out, "global_out")?;
    // The global scale: None (ModelOpt, from x's amax), a float, or a one-float tensor.
    // A tensor is imported before any float conversion: `extract::<f32>` would go through
    // `__float__`, a host read (a synchronisation, and no device-scalar path under capture).
    let given: Option<Result<f32, Tensor>> = match global_scale.filter(|g| !g.is_none()) {
        None => None,
        Some(g) if g.hasattr("__dlpack__")? => Some(Err(imports.tensor(g, "global_scale")?)),
        Some(g) => match g.extract::<f32>() {
            Ok(v) => Some(Ok(v)),
            Err(_) => return Err(kind("global_scale must be None, a float or a one-element float32 tensor")),
        },
    };
    let stream = imports.stream();
    quantize_on(&py, stream, &x, v, s, &g_out, given.as_ref(), layout, check_finite)
}

/// x's (L, rows, K), checked: 2-D or 3-D, no zero dimension, K a multiple of 16.
pub(crate) fn input_dims(x: &Tensor) -> PyResult<(usize, usize, usize)> {
    let (l, rows, k) = match x.shape[..] {
        [rows, k] => (1, rows, k),
        [l, rows, k] => (l, rows, k),
        _ => return Err(value(format!("x: must be [rows, K] or [L, rows, K], got shape {:?}", x.shape))),
    };
    if l == 0 || rows == 0 || k == 0 {
        return Err(value(format!("x: shape {:?} has a zero dimension", x.shape)));
    }
    if !k.is_multiple_of(16) {
        return Err(crate::error::to_py(nvfp4::Error::KNotMultipleOf16 { k }));
    }
    Ok((l, rows, k))
}

/// [`quantize`] on imported tensors (the device is x's; CUDA: on `stream`): `given` the global
/// scale, a float or a one-float32 tensor.
#[allow(clippy::too_many_arguments)]
pub(crate) fn quantize_on(
    g: &impl Detach,
    stream: u64,
    x: &Tensor,
    v: Tensor,
    s: Tensor,
    g_out: &Tensor,
    given: Option<&Result<f32, Tensor>>,
    layout: ScaleLayout,
    check_finite: bool,
) -> PyResult<()> {
    let ty = dense_type(x)?;
    let (l, rows, k) = input_dims(x)?;
    check_scalar(g_out)?;
    g_out.writable()?;
    // The values first: the scales' expected shape follows from theirs.
    if v.shape != [l, rows, k / 2] && !(l == 1 && v.shape == [rows, k / 2]) {
        let mut want = x.shape.clone();
        want[x.shape.len() - 1] = k / 2;
        return Err(value(format!("values: must be {want:?} for x of shape {:?}, got {:?}", x.shape, v.shape)));
    }
    let out = Operand::new(v, s, Some(layout))?;
    out.values.writable()?;
    out.scales.writable()?;
    if let Some(Err(t)) = given {
        check_scalar(t)?;
    }
    if let Some(Ok(gv)) = given {
        if !(gv.is_finite() && *gv > 0.0) {
            return Err(value(format!("global scale must be finite and > 0, got {gv}")));
        }
    }
    match x.device {
        Device::Cpu => {
            let data = host_f32(x, ty)?;
            let global = match given {
                None => GlobalScale::Auto,
                Some(Ok(v)) => GlobalScale::Fixed(*v),
                Some(Err(t)) => {
                    let b = t.host_bytes(4)?;
                    GlobalScale::Fixed(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                }
            };
            // Always checked here: a NaN or an infinity is refused, naming the first.
            let q = g.run(move || cpu_quantize(&data, l, rows, k, global)).py()?.into_layout(layout);
            out.values.write_host(q.values(), 1)?;
            out.scales.write_host(q.scales(), 1)?;
            g_out.write_host(&q.global_scale().to_le_bytes(), 4)
        }
        Device::Cuda(d) => {
            // SAFETY: CUDA tensors of the call's device, dense, of the checked sizes and dtypes,
            // kept alive by the caller's framework while the kernels enqueued on its current
            // stream run.
            let (dense, gout, gin) = unsafe {
                (
                    DenseView::from_raw(x.ptr, ty, [l, rows, k]).py()?,
                    ScalarView::from_raw(g_out.ptr).py()?,
                    match given {
                        Some(Err(t)) => Some(ScalarView::from_raw(t.ptr).py()?),
                        _ => None,
                    },
                )
            };
            let ov = out.view()?;
            let source = match (given, &gin) {
                (Some(Ok(v)), _) => GlobalSource::Value(*v),
                (_, Some(s)) => GlobalSource::Device(s),
                _ => GlobalSource::Auto,
            };
            g.run(move || {
                with_device(d, stream, |backend, ws, handle| {
                    if check_finite {
                        backend.quantize_checked_on(&dense, &ov, source, &gout, ws, handle)
                    } else {
                        backend.quantize_on(&dense, &ov, source, &gout, ws, handle)
                    }
                })
            })
        }
    }
}

/// `quantize_dequant(x, out, global_out, global_scale=None, stream=None)`: quantizes `x` as
/// [`quantize`] does and writes each element back as its NVFP4 value without the global scale
/// (e2m1 * e4m3, exact) into `out` (x's shape; bfloat16, float16 for float16 x), the global scale
/// into `global_out`. A W4A16 GEMM of `out` with alpha = that global scale times the weight's
/// computes the W4A4 GEMM of x's quantization (SPEC §3, §8).
#[pyfunction]
#[pyo3(signature = (x, out, global_out, global_scale=None, stream=None))]
pub fn quantize_dequant(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    global_out: &Bound<'_, PyAny>,
    global_scale: Option<f32>,
    stream: Option<u64>,
) -> PyResult<()> {
    let mut imports = Importer::new(stream);
    let x = imports.tensor(x, "x")?;
    dense_type(&x)?;
    input_dims(&x)?;
    let o = imports.tensor(out, "out")?;
    let g_out = imports.tensor(global_out, "global_out")?;
    let stream = imports.stream();
    quantize_dequant_on(&py, stream, &x, &o, &g_out, global_scale)
}

/// The dtype [`quantize_dequant`] writes for x's.
pub(crate) fn dequant_dtype(x: &Tensor) -> PyResult<Dtype> {
    Ok(match dense_type(x)?.dequant_type() {
        DenseType::F16 => Dtype::F16,
        _ => Dtype::Bf16,
    })
}

/// [`quantize_dequant`] on imported tensors (CUDA: on `stream`); `given` the global scale.
pub(crate) fn quantize_dequant_on(
    g: &impl Detach,
    stream: u64,
    x: &Tensor,
    out: &Tensor,
    g_out: &Tensor,
    given: Option<f32>,
) -> PyResult<()> {
    let ty = dense_type(x)?;
    let (l, rows, k) = input_dims(x)?;
    check_scalar(g_out)?;
    g_out.writable()?;
    let want = dequant_dtype(x)?;
    if out.shape != x.shape || out.dtype != want {
        return Err(value(format!(
            "out: must be {want} of x's shape {:?}, got {} of shape {:?}",
            x.shape, out.dtype, out.shape
        )));
    }
    out.writable()?;
    if out.device != x.device || g_out.device != x.device {
        return Err(value("out and global_out must be on x's device"));
    }
    if let Some(gv) = given {
        if !(gv.is_finite() && gv > 0.0) {
            return Err(value(format!("global scale must be finite and > 0, got {gv}")));
        }
    }
    match x.device {
        Device::Cpu => {
            let data = host_f32(x, ty)?;
            let global = given.map_or(GlobalScale::Auto, GlobalScale::Fixed);
            // Always checked here: a NaN or an infinity is refused, naming the first.
            let q = g.run(move || cpu_quantize(&data, l, rows, k, global)).py()?;
            let bytes: Vec<u8> = (0..l)
                .flat_map(|b| q.decode_batch(b))
                .flat_map(|v| match want {
                    Dtype::F16 => f16::from_f32(v).to_le_bytes(),
                    _ => bf16::from_f32(v).to_le_bytes(),
                })
                .collect();
            out.write_host(&bytes, 2)?;
            g_out.write_host(&q.global_scale().to_le_bytes(), 4)
        }
        Device::Cuda(d) => {
            // SAFETY: CUDA tensors of the call's device, dense, of the checked sizes and dtypes,
            // kept alive by the caller's framework while the kernels enqueued on its current
            // stream run.
            let (dense, dq, gout) = unsafe {
                (
                    DenseView::from_raw(x.ptr, ty, [l, rows, k]).py()?,
                    DenseView::from_raw(out.ptr, ty.dequant_type(), [l, rows, k]).py()?,
                    ScalarView::from_raw(g_out.ptr).py()?,
                )
            };
            let source = given.map_or(GlobalSource::Auto, GlobalSource::Value);
            g.run(move || {
                with_device(d, stream, |backend, ws, handle| {
                    backend.quantize_dequant_on(&dense, &dq, source, &gout, ws, handle)
                })
            })
        }
    }
}
