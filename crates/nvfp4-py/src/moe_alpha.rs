//! The MoE form's `alpha` from Python: one float for every expert (as every operation takes it),
//! a sequence of E floats (one per expert: a ModelOpt MoE export's `weight_scale_2` of each
//! expert, differing), or a 1-D float32 tensor of E values on the operands' device. On the GPU
//! the tensor is read by the kernels alone (zero-copy, no host synchronization: a captured CUDA
//! graph may change the values between replays) and a sequence is uploaded when the operation
//! is bound; on the CPU both are host values, checked by the library's scalar rules.

use nvfp4::backend::cuda::{CudaBackend, F32View};
use nvfp4::MoeAlpha;
use pyo3::prelude::*;

use crate::error::{dtype, kind, value, IntoPy, PyResult};
use crate::ops::{check_alpha, Call};
use crate::tensor::{Device, Dtype, Tensor};

/// The `alpha` argument of the MoE form, as the caller gave it.
pub(crate) enum MoeAlphaArg {
    /// One factor for every expert (`None`: 1).
    One(Option<f32>),
    /// One factor per expert, from a sequence of floats (each narrowed to f32 under the alpha rule).
    Values(Vec<f32>),
    /// One factor per expert in a 1-D float32 tensor on the call's device.
    Tensor(Tensor),
}

impl MoeAlphaArg {
    /// Reads `alpha` (imported through `call`, after the operands, so that a tensor must share
    /// their device).
    pub(crate) fn parse(call: &mut Call, alpha: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let Some(alpha) = alpha.filter(|a| !a.is_none()) else {
            return Ok(MoeAlphaArg::One(None));
        };
        // A tensor of per-expert alphas first: a one-element tensor would also read as a float,
        // through a copy to the host (a synchronization on the GPU). A 0-d tensor or array is one
        // float for every expert, as before per-expert alphas existed.
        let zero_d = alpha.getattr("ndim").and_then(|d| d.extract::<usize>()).is_ok_and(|d| d == 0);
        if alpha.hasattr("__dlpack__")? && !zero_d {
            let t = call.tensor(alpha, "alpha")?;
            if t.dtype != Dtype::F32 {
                return Err(dtype(format!("alpha: per-expert alphas must be float32, got {}", t.dtype)));
            }
            if t.shape.len() != 1 {
                return Err(value(format!(
                    "alpha: per-expert alphas must be 1-D [E] (one per expert), got shape {:?}",
                    t.shape
                )));
            }
            return Ok(MoeAlphaArg::Tensor(t));
        }
        if let Ok(x) = alpha.extract::<f64>() {
            return Ok(MoeAlphaArg::One(check_alpha(Some(x))?));
        }
        let list: Vec<f64> = alpha.extract().map_err(|_| {
            kind(format!(
                "alpha must be a float, a sequence of floats (one per expert) or a float32 tensor [E], got {}",
                alpha.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
            ))
        })?;
        let values = list
            .into_iter()
            .enumerate()
            .map(|(i, x)| nvfp4::ops::alpha_from_f64(x).map_err(|e| value(format!("alpha[{i}]: {e}"))))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(MoeAlphaArg::Values(values))
    }

    /// As the rules see it: one alpha, or the count of the per-expert ones.
    pub(crate) fn meta(&self) -> MoeAlpha<usize> {
        match self {
            MoeAlphaArg::One(a) => MoeAlpha::One(*a),
            MoeAlphaArg::Values(v) => MoeAlpha::PerExpert(v.len()),
            MoeAlphaArg::Tensor(t) => MoeAlpha::PerExpert(t.numel()),
        }
    }

    /// The host form (the CPU backend): a tensor's values read from host memory.
    pub(crate) fn to_host(&self) -> PyResult<MoeAlpha> {
        Ok(match self {
            MoeAlphaArg::One(a) => MoeAlpha::One(*a),
            MoeAlphaArg::Values(v) => MoeAlpha::PerExpert(v.clone()),
            MoeAlphaArg::Tensor(t) => MoeAlpha::PerExpert(
                t.host_bytes(4)?.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            ),
        })
    }

    /// What a bound launch depends on, for the cache key: the form, then the values of a
    /// sequence or the address of a tensor (whose values the kernels read at each launch).
    pub(crate) fn key_into(&self, k: &mut Vec<u64>) {
        match self {
            MoeAlphaArg::One(a) => k.extend([0, a.map_or(1 << 32, |v| u64::from(v.to_bits()))]),
            MoeAlphaArg::Values(v) => {
                k.extend([1, v.len() as u64]);
                k.extend(v.iter().map(|x| u64::from(x.to_bits())));
            }
            MoeAlphaArg::Tensor(t) => k.extend([2, t.ptr, t.numel() as u64]),
        }
    }
}

/// The device form of a [`MoeAlphaArg`]: one alpha, or a view of E device f32.
pub(crate) enum DeviceAlpha {
    One(Option<f32>),
    /// A sequence, uploaded when the operation is bound.
    Upload(Vec<f32>),
    /// The caller's tensor.
    View(F32View),
}

impl DeviceAlpha {
    /// The device form of `arg` (a tensor of the call's CUDA device, checked by the caller).
    pub(crate) fn of(arg: &MoeAlphaArg) -> PyResult<Self> {
        Ok(match arg {
            MoeAlphaArg::One(a) => DeviceAlpha::One(*a),
            MoeAlphaArg::Values(v) => DeviceAlpha::Upload(v.clone()),
            MoeAlphaArg::Tensor(t) => {
                if !matches!(t.device, Device::Cuda(_)) {
                    return Err(value("alpha: per-expert alphas must be on the operands' CUDA device"));
                }
                // SAFETY: a float32 tensor of the call's CUDA device (the importer refuses another
                // device), dense, holding `numel` values (checked at import), which the caller's
                // framework keeps alive while the enqueued kernels run, as it does the operands.
                DeviceAlpha::View(unsafe { F32View::from_raw(t.ptr, t.numel()) }.py()?)
            }
        })
    }

    /// The alpha to bind on `backend`: a sequence uploaded now (the bound launch keeps it).
    pub(crate) fn bind_form(&self, backend: &CudaBackend) -> nvfp4::Result<MoeAlpha<F32View>> {
        Ok(match self {
            DeviceAlpha::One(a) => MoeAlpha::One(*a),
            DeviceAlpha::Upload(v) => MoeAlpha::PerExpert(backend.upload_f32(v)?),
            DeviceAlpha::View(v) => MoeAlpha::PerExpert(v.clone()),
        })
    }
}
