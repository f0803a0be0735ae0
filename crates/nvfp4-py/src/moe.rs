//! `grouped_gemm_moe`: the MoE form of the grouped GEMM, as `torch._grouped_mm` takes it with
//! `offs`: the tokens sorted by expert in one tensor, every expert's weights in one `[E, N, K]`
//! tensor (rows are N, like a `Linear` weight), and int32 cumulative end rows per expert; one
//! alpha, or one per expert (`moe_alpha`). On the GPU the offsets (and a tensor of per-expert
//! alphas) stay in device memory (never read by the host: a captured CUDA graph can change them
//! between replays); on the CPU they are checked and run on the exact reference.

use nvfp4::backend::cuda::{DeviceOp, I32View};
use nvfp4::ops::{Act, Op};
use nvfp4::MoeGemm;
use pyo3::prelude::*;

use crate::act::{self, Activation};
use crate::cpu::on_cpu;
use crate::error::{dtype, value, IntoPy, PyResult};
use crate::gil::Detach;
use crate::moe_alpha::{DeviceAlpha, MoeAlphaArg};
use crate::operand::Operand;
use crate::operand::{check_out, out_dtype, out_view};
use crate::ops::{key, launch_with, validate, Call};
use crate::pack::Packed;
use crate::tensor::{Device, Dtype, Tensor};

/// The bound-op cache's name of this operation (the others are 1 to 3, in `ops`).
const OP_MOE: u64 = 4;

/// Row t of the output, for t in `offsets[e-1]..offsets[e]` (`0..offsets[0]` for e = 0), is
/// `f16(alpha_e · Σ_k A[t, k] · B[e, n, k])` (bf16 for a bfloat16 `out`), alpha_e the one alpha
/// (a float) or expert e's (a sequence of E floats, or a float32 tensor [E] on the operands'
/// device); A is NVFP4 tokens, or dense 16-bit ones with `sfa` None (W4A16). Rows at or past
/// `offsets[E-1]` belong to no expert and are left as they are, on both backends.
#[pyfunction]
#[pyo3(signature = (a, sfa, b, sfb, offsets, out, alpha=None, layout=None, stream=None, packed=None))]
#[allow(clippy::too_many_arguments)]
pub fn grouped_gemm_moe(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    sfa: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
    sfb: &Bound<'_, PyAny>,
    offsets: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    alpha: Option<&Bound<'_, PyAny>>,
    layout: Option<&str>,
    stream: Option<u64>,
    packed: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let mut call = Call::new(stream, layout)?;
    let a = call.activation(a, sfa, "a", "sfa")?;
    let b = call.operand(b, sfb, "b", "sfb")?;
    let offsets = call.tensor(offsets, "offsets")?;
    let out = call.tensor(out, "out")?;
    let packed = Packed::of(&mut call, packed, &a)?;
    let alpha = MoeAlphaArg::parse(&mut call, alpha)?;
    moe_on(&py, call.device(), call.stream(), &a, &b, &offsets, &out, &packed, &alpha)
}

/// [`grouped_gemm_moe`] on imported operands of `device` (CUDA: on `stream`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn moe_on(
    g: &impl Detach,
    device: Device,
    stream: u64,
    a: &Activation,
    b: &Operand,
    offsets: &Tensor,
    out: &Tensor,
    packed: &Option<Packed>,
    alpha: &MoeAlphaArg,
) -> PyResult<()> {
    let shape = moe_rules(a, b, offsets, alpha)?;
    let (n, e) = (shape[2], b.meta.l);
    check_out(out, shape, act::flat(a))?;
    match device {
        Device::Cpu => {
            let ends: Vec<i32> =
                offsets.host_bytes(4)?.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            let (bh, host_alpha, dtype) = (b.to_host()?, alpha.to_host()?, out_dtype(out));
            let (routed, c) = on_cpu!(
                g,
                a,
                |ah| MoeGemm::new(ah, bh, ends, host_alpha),
                moe_gemm_as / moe_gemm16_as,
                dtype,
                MoeGemm::routed_tokens
            );
            out.write_host_prefix(&c.to_le_bytes()[..routed * n * 2], 2)
        }
        Device::Cuda(d) => {
            let (av, cv) = (act::view(a)?, out_view(out, shape)?);
            let bv = match packed {
                Some(p) => p.attach(b.view()?, b, None)?,
                None => b.view()?,
            };
            // SAFETY: a CUDA int32 tensor of the call's device holding exactly E values, dense
            // (checked above and at import), kept alive by the caller's framework while the
            // enqueued kernels run; the kernels clamp its values into [0, T].
            let ov = unsafe { I32View::from_raw(offsets.ptr, e) }.py()?;
            let mut k = key(OP_MOE, &[a, b], &[out, offsets], &[]);
            alpha.key_into(&mut k);
            k.extend(Packed::key(packed));
            let dev_alpha = DeviceAlpha::of(alpha)?;
            launch_with(g, stream, d, k, |backend, ws| {
                let bound_alpha = dev_alpha.bind_form(backend)?;
                let op = DeviceOp::MoeGemm {
                    a: act::borrow(&av),
                    b: &bv,
                    offsets: &ov,
                    alpha: bound_alpha.as_ref(),
                    c: &cv,
                };
                backend.bind_with(op, ws)
            })
        }
    }
}

/// The MoE form's rules on its operands (the output aside): the output's shape [1, T, N].
/// Callers that allocate the output (the torch kernels) check them first.
pub(crate) fn moe_rules(a: &Activation, b: &Operand, offsets: &Tensor, alpha: &MoeAlphaArg) -> PyResult<[usize; 3]> {
    let am = act::meta(a);
    if am.l() != 1 {
        let (shape, want) = match a {
            Act::Nvfp4(o) => (&o.values.shape, "[T, K/2] or [1, T, K/2]"),
            Act::Dense(d) => (&d.tensor.shape, "[T, K] or [1, T, K]"),
        };
        return Err(value(format!("moe gemm: a must be {want} (the tokens, sorted by expert), got shape {shape:?}")));
    }
    if b.flat {
        return Err(value(format!(
            "moe gemm: b must be [E, N, K/2] (one weight per expert), got shape {:?}",
            b.values.shape
        )));
    }
    let (t, n, e) = (am.rows(), b.meta.rows, b.meta.l);
    if offsets.dtype != Dtype::I32 {
        return Err(dtype(format!("offsets: must be int32, got {}", offsets.dtype)));
    }
    if offsets.shape != [e] {
        return Err(value(format!(
            "offsets: must be [E] = [{e}] (the end row of each expert's tokens, cumulative), got shape {:?}",
            offsets.shape
        )));
    }
    validate(Op::MoeGemm { a: am, b: b.meta, offsets: e, alpha: alpha.meta(), c: None })?;
    Ok([1, t, n])
}
