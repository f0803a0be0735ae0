//! The packed W4A16 weight form from Python (format/w16_pack.rs): its size, the packing of a CUDA
//! weight (or a dual GEMM's pair) into a buffer the Python layer allocated, and the packed
//! argument of the operations, attached to the weight's view.

use nvfp4::backend::cuda::Nvfp4View;
use nvfp4::format::{dual_packed_rows, packed_len, PackAct};
use pyo3::prelude::*;

use nvfp4::ops::Act;
use nvfp4::OutputDtype;

use crate::act::Activation;
use crate::error::{dtype, value, IntoPy, PyResult};
use crate::operand::Operand;
use crate::ops::Call;
use crate::tensor::{Device, Dtype, Tensor};

/// The activation type named by `dtype` ("bfloat16" or "float16").
pub(crate) fn pack_act(dtype_name: &str) -> PyResult<PackAct> {
    match dtype_name {
        "bfloat16" | "bf16" => Ok(PackAct::Bf16),
        "float16" | "f16" => Ok(PackAct::F16),
        other => Err(value(format!("a packed weight is for bfloat16 or float16 activations, got {other:?}"))),
    }
}

/// Bytes of the packed form of a weight `[l, rows, k]` (`pair`: a dual GEMM's two such weights).
#[pyfunction]
#[pyo3(signature = (l, rows, k, pair=false))]
pub fn packed_size(l: usize, rows: usize, k: usize, pair: bool) -> PyResult<usize> {
    let rows = if pair { dual_packed_rows(rows) } else { rows };
    packed_len(l, rows, k).ok_or_else(|| value("packed weight size overflows"))
}

/// Writes the packed form of CUDA weight `b` (with `sfb`), or of the pair `b`, `b2`, for
/// activations of `dtype`, into the uint8 tensor `out` of exactly [`packed_size`] bytes, on the
/// caller's stream.
#[pyfunction]
#[pyo3(signature = (b, sfb, out, dtype, b2=None, sfb2=None, layout=None, stream=None))]
#[allow(clippy::too_many_arguments)]
pub fn pack_into(
    py: Python<'_>,
    b: &Bound<'_, PyAny>,
    sfb: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    dtype: &str,
    b2: Option<&Bound<'_, PyAny>>,
    sfb2: Option<&Bound<'_, PyAny>>,
    layout: Option<&str>,
    stream: Option<u64>,
) -> PyResult<()> {
    let act = pack_act(dtype)?;
    let mut call = Call::new(stream, layout)?;
    let w = call.operand(b, sfb, "b", "sfb")?;
    let w2 = match (b2, sfb2) {
        (Some(v), Some(s)) => Some(call.operand(v, s, "b2", "sfb2")?),
        (None, None) => None,
        _ => return Err(value("pack: b2 and sfb2 go together")),
    };
    let out = call.tensor(out, "out")?;
    let Device::Cuda(d) = call.device() else {
        return Err(value("pack: the weights must be CUDA tensors (the packed form serves the CUDA kernels)"));
    };
    check_packed_tensor(&out, &w, w2.as_ref())?;
    let views: Vec<Nvfp4View> = std::iter::once(&w).chain(w2.as_ref()).map(Operand::view).collect::<PyResult<_>>()?;
    let (addr, len, stream) = (out.ptr, out.shape.iter().product::<usize>(), call.stream());
    py.detach(move || {
        crate::cuda::with_device(d, stream, |backend, _, stream| {
            let refs: Vec<&Nvfp4View> = views.iter().collect();
            // SAFETY: `out` is a CUDA uint8 tensor of the call's device holding exactly `len`
            // bytes (checked), which the caller's framework keeps allocated while the launch
            // runs on its current stream; the weights likewise.
            unsafe { backend.pack_into(&refs, act, addr, len, stream) }
        })
    })
}

/// `t` is a dense 1-D uint8 tensor of exactly the packed size of `w` (and `w2`).
fn check_packed_tensor(t: &Tensor, w: &Operand, w2: Option<&Operand>) -> PyResult<()> {
    if t.dtype != Dtype::U8 {
        return Err(dtype(format!("{}: a packed weight is a uint8 tensor", t.name)));
    }
    let m = w.meta;
    if let Some(w2) = w2 {
        if (w2.meta.l, w2.meta.rows, w2.meta.k, w2.meta.layout) != (m.l, m.rows, m.k, m.layout) {
            return Err(value("a packed pair's two weights must have one shape and scale layout"));
        }
    }
    let need = packed_size(m.l, m.rows, m.k, w2.is_some())?;
    if t.shape != [need] {
        return Err(value(format!("{}: a packed weight of this shape is [{need}] bytes, got {:?}", t.name, t.shape)));
    }
    Ok(())
}

/// The packed argument of an operation: the uint8 tensor and the activation type it was packed
/// for, checked against its weight(s) when attached.
pub(crate) struct Packed {
    pub tensor: Tensor,
    pub act: PackAct,
}

impl Packed {
    /// The `packed` argument of a call whose activation is `a` (None: no packed form): for a
    /// 16-bit activation only (W4A16), packed for its type.
    pub(crate) fn of(call: &mut Call, obj: Option<&Bound<'_, PyAny>>, a: &Activation) -> PyResult<Option<Self>> {
        let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(None) };
        Self::from_tensor(call.tensor(obj, "packed")?, a).map(Some)
    }

    /// [`Packed::of`] for an imported tensor.
    pub(crate) fn from_tensor(tensor: Tensor, a: &Activation) -> PyResult<Self> {
        let act = match a {
            Act::Dense(d) if d.meta.dtype == OutputDtype::Bf16 => PackAct::Bf16,
            Act::Dense(_) => PackAct::F16,
            Act::Nvfp4(_) => return Err(value("packed: a packed weight serves 16-bit activations (W4A16) only")),
        };
        if !matches!(tensor.device, Device::Cuda(_)) {
            return Err(value("packed: a packed weight is a CUDA tensor"));
        }
        Ok(Self { tensor, act })
    }

    /// `view` of weight `w` (the pair's `w2` beside it) with this packed form attached.
    pub(crate) fn attach(&self, view: Nvfp4View, w: &Operand, w2: Option<&Operand>) -> PyResult<Nvfp4View> {
        check_packed_tensor(&self.tensor, w, w2)?;
        // SAFETY: a CUDA uint8 tensor of the call's device of exactly the packed size (checked),
        // kept allocated by the caller's framework while the launch runs; its bytes are the
        // packed form of `w` the caller wrote with `pack_into` (a wrong content gives wrong
        // results, never an out-of-bounds access: the size is the weight's).
        unsafe { view.with_packed_raw(self.tensor.ptr, self.act, w2.is_some()) }.py()
    }

    /// Its part of a bound-operation cache key.
    pub(crate) fn key(p: &Option<Self>) -> [u64; 2] {
        match p {
            Some(p) => [p.tensor.ptr, 1 + u64::from(p.act == PackAct::Bf16)],
            None => [0, 0],
        }
    }
}
