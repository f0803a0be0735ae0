//! Operands of the operations as the caller passes them: packed values and scales (plain or
//! blocked, SPEC §2) making one NVFP4 tensor, and the f16 or bf16 output, checked against each
//! other.

use nvfp4::backend::cuda::{F16View, Nvfp4Meta, Nvfp4View};
use nvfp4::{Nvfp4Tensor, OutputDtype, ScaleLayout};

use crate::error::{value, IntoPy, PyResult};
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

/// An NVFP4 operand: values `[rows, K/2]` or `[L, rows, K/2]` and their scales.
pub struct Operand {
    pub values: Tensor,
    pub scales: Tensor,
    pub meta: Nvfp4Meta,
    /// Whether the values were 2-D (L = 1, no batch dimension).
    pub flat: bool,
}

impl Operand {
    /// Checks dtypes and shapes and tells the scale layout from the scales' shape: plain
    /// `[.., rows, K/16]` like the values, or blocked `[L, R, C, 512]`, `[R, C, 512]` (L = 1) or
    /// flat with the blocked length. `layout` forces one.
    pub fn new(values: Tensor, scales: Tensor, layout: Option<ScaleLayout>) -> PyResult<Self> {
        let (v, s) = (&values, &scales);
        if v.dtype != Dtype::U8 && v.dtype != Dtype::E2m1x2 {
            return Err(value(format!("{}: packed values must be uint8 or float4_e2m1fn_x2, got {}", v.name, v.dtype)));
        }
        if s.dtype != Dtype::U8 && s.dtype != Dtype::E4m3 {
            return Err(value(format!("{}: scales must be float8_e4m3fn or uint8, got {}", s.name, s.dtype)));
        }
        let (l, rows, half) = match v.shape[..] {
            [rows, half] => (1, rows, half),
            [l, rows, half] => (l, rows, half),
            _ => {
                return Err(value(format!(
                    "{}: packed values must be [rows, K/2] or [L, rows, K/2], got shape {:?}",
                    v.name, v.shape
                )))
            }
        };
        let k = 2 * half;
        if l == 0 || rows == 0 || k == 0 {
            return Err(value(format!("{}: shape {:?} has a zero dimension", v.name, v.shape)));
        }
        if !k.is_multiple_of(16) {
            return Err(crate::error::to_py(nvfp4::Error::KNotMultipleOf16 { k }));
        }
        let flat = v.shape.len() == 2;
        let plain: Vec<usize> = if flat { vec![rows, k / 16] } else { vec![l, rows, k / 16] };
        let (r, c) = nvfp4::format::layout::blocked_dims(rows, k / 16);
        let blocked_len = ScaleLayout::Blocked.len(l, rows, k);
        let is_blocked = s.shape == [l, r, c, 512] || (l == 1 && s.shape == [r, c, 512]) || s.shape == [blocked_len];
        let found = if s.shape == plain {
            Some(ScaleLayout::Plain)
        } else if is_blocked {
            Some(ScaleLayout::Blocked)
        } else {
            None
        };
        let layout = match (layout, found) {
            (None, Some(f)) => f,
            (Some(want), Some(f)) if want == f => f,
            (Some(ScaleLayout::Blocked), _) if is_blocked => ScaleLayout::Blocked,
            (want, _) => {
                let what = match want {
                    Some(ScaleLayout::Plain) => format!("plain {plain:?}"),
                    Some(ScaleLayout::Blocked) => format!("blocked [{l}, {r}, {c}, 512]"),
                    None => format!("plain {plain:?} or blocked [{l}, {r}, {c}, 512]"),
                };
                return Err(value(format!(
                    "{}: scales for {} of shape {:?} must be {what}, got {:?}",
                    s.name, v.name, v.shape, s.shape
                )));
            }
        };
        let meta = Nvfp4Meta { l, rows, k, layout, global_scale: 1.0 };
        Ok(Self { values, scales, meta, flat })
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
        return Err(value(format!("{}: the output must be float16 or bfloat16, got {}", out.name, out.dtype)));
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
