//! The activation operand as the caller passes it (SPEC §8): NVFP4 values with their scales
//! (W4A4), or a dense float16/bfloat16 tensor whose scale argument is `None` (W4A16). It is `a` of
//! a GEMM, a dual GEMM, a group and the MoE form, and the vector `b` of a GEMV; the weights are
//! NVFP4 in both modes ([`Operand`]).

use nvfp4::backend::cuda::{F16View, Nvfp4View};
use nvfp4::ops::{Act, ActMeta, OutMeta};
use nvfp4::{Nvfp4Tensor, OutTensor, OutputDtype};

use crate::error::{dtype, value, IntoPy, PyResult};
use crate::operand::Operand;
use crate::tensor::{Dtype, Tensor};

/// A dense 16-bit activation `[rows, K]` or `[L, rows, K]`.
pub struct Dense {
    pub tensor: Tensor,
    pub meta: OutMeta,
    /// Whether it was 2-D (L = 1, no batch dimension).
    pub flat: bool,
}

impl Dense {
    /// Checks the element type (float16 or bfloat16) and the shape (2-D or 3-D, no zero
    /// dimension, K a multiple of 16); `sn`: the name of its (absent) scale argument.
    pub fn new(tensor: Tensor, sn: &str) -> PyResult<Self> {
        let t = &tensor;
        let dt = match t.dtype {
            Dtype::F16 => OutputDtype::F16,
            Dtype::Bf16 => OutputDtype::Bf16,
            Dtype::U8 | Dtype::E2m1x2 => {
                return Err(dtype(format!(
                    "{}: {} values with {sn}=None: an NVFP4 activation needs its scales; \
                     {sn}=None marks a dense float16 or bfloat16 activation (W4A16)",
                    t.name, t.dtype
                )))
            }
            d => {
                return Err(dtype(format!(
                    "{}: a dense activation ({sn}=None, W4A16) must be float16 or bfloat16, got {d}; \
                     convert it (.to(torch.bfloat16)), or quantize it to NVFP4 and pass its scales (W4A4)",
                    t.name
                )))
            }
        };
        let (l, rows, k) = match t.shape[..] {
            [rows, k] => (1, rows, k),
            [l, rows, k] => (l, rows, k),
            _ => {
                return Err(value(format!(
                    "{}: a dense activation must be [rows, K] or [L, rows, K], got shape {:?}",
                    t.name, t.shape
                )))
            }
        };
        if l == 0 || rows == 0 || k == 0 {
            return Err(value(format!("{}: shape {:?} has a zero dimension", t.name, t.shape)));
        }
        if !k.is_multiple_of(16) {
            return Err(crate::error::to_py(nvfp4::Error::KNotMultipleOf16 { k }));
        }
        let flat = t.shape.len() == 2;
        Ok(Self { tensor, meta: OutMeta { shape: [l, rows, k], dtype: dt }, flat })
    }

    /// A host copy (the CPU backend).
    pub fn to_host(&self) -> PyResult<OutTensor> {
        let bits = self.tensor.host_bytes(2)?.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        OutTensor::new(self.meta.dtype, self.meta.shape, bits).py()
    }

    /// A device view (the CUDA backend).
    pub fn view(&self) -> PyResult<F16View> {
        // SAFETY: a CUDA float16 or bfloat16 tensor of the call's device (checked at import and
        // in `new`), dense, of exactly `shape` elements, which the caller's framework keeps
        // allocated while the kernels the call enqueues on its current stream run (the
        // stream-ordered contract of torch tensors passed to an operation). The operations only
        // read an activation.
        Ok(unsafe { F16View::from_raw(self.tensor.ptr, self.meta.shape) }.py()?.with_dtype(self.meta.dtype))
    }
}

/// An activation in either form.
pub type Activation = Act<Operand, Dense>;

/// A host activation of either form, as the CPU backend takes it.
pub type HostAct = Act<Nvfp4Tensor, OutTensor>;

/// A device activation of either form, owning its view.
pub type ActViews = Act<Nvfp4View, F16View>;

/// The activation's metadata.
pub fn meta(x: &Activation) -> ActMeta {
    match x {
        Act::Nvfp4(o) => Act::Nvfp4(o.meta),
        Act::Dense(d) => Act::Dense(d.meta),
    }
}

/// Whether it was passed without a batch dimension.
pub fn flat(x: &Activation) -> bool {
    match x {
        Act::Nvfp4(o) => o.flat,
        Act::Dense(d) => d.flat,
    }
}

/// A host copy.
pub fn to_host(x: &Activation) -> PyResult<HostAct> {
    Ok(match x {
        Act::Nvfp4(o) => Act::Nvfp4(o.to_host()?),
        Act::Dense(d) => Act::Dense(d.to_host()?),
    })
}

/// A device view.
pub fn view(x: &Activation) -> PyResult<ActViews> {
    Ok(match x {
        Act::Nvfp4(o) => Act::Nvfp4(o.view()?),
        Act::Dense(d) => Act::Dense(d.view()?),
    })
}

/// The view as an operation borrows it (the library's `ActView`).
pub fn borrow(v: &ActViews) -> Act<&Nvfp4View, &F16View> {
    match v {
        Act::Nvfp4(q) => Act::Nvfp4(q),
        Act::Dense(d) => Act::Dense(d),
    }
}
