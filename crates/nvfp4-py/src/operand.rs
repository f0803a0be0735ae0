//! Operands of the operations as the caller passes them: packed values and scales (plain or
//! blocked, SPEC §2) making one NVFP4 tensor, and the f16 or bf16 output, checked against each
//! other.

use nvfp4::backend::cuda::{F16View, Nvfp4Meta, Nvfp4View};
use nvfp4::{Nvfp4Tensor, OutputDtype, ScaleLayout};

use pyo3::prelude::*;

use crate::error::{dtype, value, IntoPy, PyResult};
use crate::tensor::{Dtype, Tensor};

/// The scale layout the caller asked for, if any.
pub fn parse_layout(layout: Option<&str>) -> PyResult<Option<ScaleLayout>> {
    match layout {
        None => Ok(None),
        Some("plain") => Ok(Some(ScaleLayout::Plain)),
        Some("blocked") => Ok(Some(ScaleLayout::Blocked)),
        Some(other) => Err(value(format!("layout must be \"plain\" or \"blocked\", got {other:?}"))),
    }
}

/// The logical size of packed values `[rows, K/2]` or `[L, rows, K/2]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueDims {
    pub l: usize,
    pub rows: usize,
    pub k: usize,
    /// Whether the values were 2-D (L = 1, no batch dimension).
    pub flat: bool,
}

impl ValueDims {
    /// The dimensions of packed values of shape `shape` (argument `name`, for messages): L, rows
    /// and K all at least 1, K a multiple of 16.
    pub fn of(shape: &[usize], name: &str) -> PyResult<Self> {
        let (l, rows, half) = match *shape {
            [rows, half] => (1, rows, half),
            [l, rows, half] => (l, rows, half),
            _ => {
                return Err(value(format!(
                    "{name}: packed values must be [rows, K/2] or [L, rows, K/2], got shape {shape:?}"
                )))
            }
        };
        let k = 2 * half;
        if l == 0 || rows == 0 || k == 0 {
            return Err(value(format!("{name}: shape {shape:?} has a zero dimension")));
        }
        if !k.is_multiple_of(16) {
            return Err(crate::error::to_py(nvfp4::Error::KNotMultipleOf16 { k }));
        }
        Ok(Self { l, rows, k, flat: shape.len() == 2 })
    }
}

/// The dimensions of packed values of shape `values` and the layout of their scales of shape
/// `scales` (docs/FORMAT.md §2, "Scale shapes in Python"); `names`: the two arguments' names.
/// Plain: the values' shape with K/16 for K/2, or flat (1-D) of L·rows·K/16 bytes. Blocked:
/// `[L, R, C, 512]`, `[R, C, 512]` when L = 1, or flat of L·R·C·512 bytes. A shape that reads
/// both ways (flat when rows % 128 == 0 and K/16 % 4 == 0, where both lengths agree; `[1, 128,
/// 512]` for values `[1, 128, 4096]`) is refused unless `layout` says which: a guess would read
/// the wrong bytes. `layout` also forces a layout the shape allows.
pub fn scale_layout(
    values: &[usize],
    scales: &[usize],
    layout: Option<ScaleLayout>,
    [vn, sn]: [&str; 2],
) -> PyResult<(ValueDims, ScaleLayout)> {
    let dims = ValueDims::of(values, vn)?;
    let ValueDims { l, rows, k, flat } = dims;
    let plain: Vec<usize> = if flat { vec![rows, k / 16] } else { vec![l, rows, k / 16] };
    let (r, c) = nvfp4::format::layout::blocked_dims(rows, k / 16);
    let plain_len = ScaleLayout::Plain.len(l, rows, k);
    let blocked_len = ScaleLayout::Blocked.len(l, rows, k);
    let is_plain = scales == plain || scales == [plain_len];
    let is_blocked = scales == [l, r, c, 512] || (l == 1 && scales == [r, c, 512]) || scales == [blocked_len];
    let plain_text = format!("plain {plain:?} (or flat [{plain_len}])");
    let blocked_text = format!("blocked [{l}, {r}, {c}, 512] (or flat [{blocked_len}])");
    match (layout, is_plain, is_blocked) {
        (Some(ScaleLayout::Plain), true, _) | (None, true, false) => Ok((dims, ScaleLayout::Plain)),
        (Some(ScaleLayout::Blocked), _, true) | (None, false, true) => Ok((dims, ScaleLayout::Blocked)),
        (None, true, true) => Err(value(format!(
            "{sn}: shape {scales:?} reads both as plain and as blocked scales for {vn} of shape \
             {values:?}: pass layout=\"plain\" or layout=\"blocked\""
        ))),
        (want, _, _) => {
            let what = match want {
                Some(ScaleLayout::Plain) => plain_text,
                Some(ScaleLayout::Blocked) => blocked_text,
                None => format!("{plain_text} or {blocked_text}"),
            };
            Err(value(format!("{sn}: scales for {vn} of shape {values:?} must be {what}, got {scales:?}")))
        }
    }
}

/// `_nvfp4.scale_layout(values_shape, scales_shape, layout=None)`: the layout ("plain" or
/// "blocked") the operations read scales of this shape in, by the rule of [`scale_layout`]
/// (shapes only: it works on any tensor, fake ones included). `nvfp4.torch.dequantize` uses it.
#[pyfunction]
#[pyo3(name = "scale_layout", signature = (values_shape, scales_shape, layout=None))]
pub fn scale_layout_of(
    values_shape: Vec<usize>,
    scales_shape: Vec<usize>,
    layout: Option<&str>,
) -> PyResult<&'static str> {
    let (_, found) = scale_layout(&values_shape, &scales_shape, parse_layout(layout)?, ["values", "scales"])?;
    Ok(match found {
        ScaleLayout::Plain => "plain",
        ScaleLayout::Blocked => "blocked",
    })
}

/// An NVFP4 operand: values `[rows, K/2]` or `[L, rows, K/2]` and their scales.
pub struct Operand {
    pub values: Tensor,
    pub scales: Tensor,
    pub meta: Nvfp4Meta,
    /// Whether the values were 2-D (L = 1, no batch dimension).
    pub flat: bool,
}

impl Operand {
    /// Checks dtypes and shapes and tells the scale layout from the scales' shape
    /// ([`scale_layout`]); `layout` forces one.
    pub fn new(values: Tensor, scales: Tensor, layout: Option<ScaleLayout>) -> PyResult<Self> {
        let (v, s) = (&values, &scales);
        if v.dtype != Dtype::U8 && v.dtype != Dtype::E2m1x2 {
            // A dense activation is passed without scales: say so where one came with them.
            let hint = match v.dtype {
                Dtype::F16 | Dtype::Bf16 => format!(" (a dense {} activation takes {}=None: W4A16)", v.dtype, s.name),
                _ => String::new(),
            };
            return Err(dtype(format!(
                "{}: packed values must be uint8 or float4_e2m1fn_x2, got {}{hint}",
                v.name, v.dtype
            )));
        }
        if s.dtype != Dtype::U8 && s.dtype != Dtype::E4m3 {
            return Err(dtype(format!("{}: scales must be float8_e4m3fn or uint8, got {}", s.name, s.dtype)));
        }
        let (dims, layout) = scale_layout(&v.shape, &s.shape, layout, [&v.name, &s.name])?;
        let meta = Nvfp4Meta { l: dims.l, rows: dims.rows, k: dims.k, layout, global_scale: 1.0 };
        Ok(Self { values, scales, meta, flat: dims.flat })
    }

    /// A host copy (the CPU backend).
    pub fn to_host(&self) -> PyResult<Nvfp4Tensor> {
        let m = &self.meta;
        let v = self.values.host_bytes(1)?.to_vec();
        let s = self.scales.host_bytes(1)?.to_vec();
        Nvfp4Tensor::new(m.l, m.rows, m.k, v, s, m.layout).py()
    }

    /// A device view (the CUDA backend).
    pub fn view(&self) -> PyResult<Nvfp4View> {
        // SAFETY: both tensors are CUDA tensors of the call's device (checked at import), dense,
        // of exactly `value_bytes` and `scale_bytes` bytes (checked above), and the caller's
        // framework keeps them allocated while the kernels that the call enqueues on its current
        // stream run (the stream-ordered contract of torch tensors passed to an operation).
        unsafe { Nvfp4View::from_raw(self.values.ptr, self.scales.ptr, self.meta) }.py()
    }
}

/// The element type of an output tensor (checked by [`check_out`]): the operation rounds to it once.
pub fn out_dtype(out: &Tensor) -> OutputDtype {
    if out.dtype == Dtype::Bf16 {
        OutputDtype::Bf16
    } else {
        OutputDtype::F16
    }
}

/// Checks the output: float16 or bfloat16 of `[L, rows, cols]` (or `[rows, cols]` when `flat`).
pub fn check_out(out: &Tensor, shape: [usize; 3], flat: bool) -> PyResult<()> {
    out.writable()?;
    if !matches!(out.dtype, Dtype::F16 | Dtype::Bf16) {
        return Err(dtype(format!("{}: the output must be float16 or bfloat16, got {}", out.name, out.dtype)));
    }
    let want: Vec<usize> = if flat { shape[1..].to_vec() } else { shape.to_vec() };
    if out.shape != want {
        return Err(value(format!("{}: the output must have shape {want:?}, got {:?}", out.name, out.shape)));
    }
    Ok(())
}

/// A device view of a checked output, of its dtype.
pub fn out_view(out: &Tensor, shape: [usize; 3]) -> PyResult<F16View> {
    // SAFETY: a CUDA f16 or bf16 tensor of the call's device holding exactly `shape` elements,
    // dense (checked by `check_out` and at import), kept alive by the caller's framework while
    // the enqueued kernels run.
    Ok(unsafe { F16View::from_raw(out.ptr, shape) }.py()?.with_dtype(out_dtype(out)))
}
