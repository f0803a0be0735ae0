//! The four operations on tensors from Python: checked operands, then the CPU backend for host
//! tensors (a copy in, the exact reference, a copy out) or the CUDA backend for device tensors
//! (zero-copy views, bound and launched on the caller's stream, nothing allocated).

use nvfp4::backend::cuda::{BoundOp, CudaBackend, DeviceOp, F16View, GemmViews, Nvfp4View, Workspace};
use nvfp4::ops::{Act, Group, Op, OpMeta};
use nvfp4::{DualGemm, Gemm, Gemv, OutputDtype, ScaleLayout};
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::act::{self, ActViews, Activation, Dense};
use crate::cpu::on_cpu;
use crate::cuda::launch_cached;
use crate::error::{value, IntoPy, PyResult};
use crate::gil::Detach;
use crate::operand::{check_out, out_dtype, out_view, parse_layout, Operand};
use crate::pack::Packed;
use crate::tensor::{Device, Importer, Tensor};

/// The imports of one call (the first tensor fixes the device and the stream; the rest must
/// share the device) and its scale layout.
pub(crate) struct Call {
    imports: Importer,
    layout: Option<ScaleLayout>,
}

impl Call {
    pub(crate) fn new(stream: Option<u64>, layout: Option<&str>) -> PyResult<Self> {
        Ok(Self { imports: Importer::new(stream), layout: parse_layout(layout)? })
    }
    pub(crate) fn tensor(&mut self, obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Tensor> {
        self.imports.tensor(obj, name)
    }
    pub(crate) fn operand(
        &mut self,
        v: &Bound<'_, PyAny>,
        s: &Bound<'_, PyAny>,
        vn: &str,
        sn: &str,
    ) -> PyResult<Operand> {
        let values = self.tensor(v, vn)?;
        let scales = self.tensor(s, sn)?;
        Operand::new(values, scales, self.layout)
    }
    /// The activation: NVFP4 values `v` with scales `s` (W4A4), or, when `s` is `None`, a dense
    /// 16-bit tensor `v` (W4A16, SPEC §8).
    pub(crate) fn activation(
        &mut self,
        v: &Bound<'_, PyAny>,
        s: &Bound<'_, PyAny>,
        vn: &str,
        sn: &str,
    ) -> PyResult<Activation> {
        if s.is_none() {
            let t = self.tensor(v, vn)?;
            return Ok(Act::Dense(Dense::new(t, sn)?));
        }
        Ok(Act::Nvfp4(self.operand(v, s, vn, sn)?))
    }
    pub(crate) fn device(&self) -> Device {
        self.imports.device()
    }
    pub(crate) fn stream(&self) -> u64 {
        self.imports.stream()
    }
}

/// A Python float as the kernels' f32 alpha, under the library's rule
/// (`nvfp4::ops::alpha_from_f64`): finite, and a non-zero value that neither overflows f32 nor
/// rounds to 0 there (PyO3's own f32 conversion would round 1e-50 to 0 silently).
pub(crate) fn check_alpha(alpha: Option<f64>) -> PyResult<Option<f32>> {
    let narrow = |a| {
        nvfp4::ops::alpha_from_f64(a).map_err(|e| match e {
            nvfp4::Error::Invalid(msg) => value(msg),
            other => crate::error::to_py(other),
        })
    };
    alpha.map(narrow).transpose()
}

/// The operation's rules on its operands' metadata: the library's one [`Op::validate`], which
/// the Rust API and the CLI call too (the outputs' forms are the binding's own: `check_out`).
pub(crate) fn validate(op: OpMeta) -> PyResult<()> {
    op.validate().py()
}

/// The bound-op cache's name of the grouped GEMM's list form (the MoE form is 4, in `moe`).
const OP_GROUPED: u64 = 5;

/// What of an operand a bound operation's parameters depend on.
pub(crate) trait KeyPart {
    /// Appends it to a cache key.
    fn key_into(&self, k: &mut Vec<u64>);
}

impl KeyPart for Operand {
    fn key_into(&self, k: &mut Vec<u64>) {
        let m = &self.meta;
        k.extend([
            self.values.ptr,
            self.scales.ptr,
            m.l as u64,
            m.rows as u64,
            m.k as u64,
            (m.layout == ScaleLayout::Blocked) as u64,
        ]);
    }
}

impl KeyPart for Activation {
    /// Its form first (0: NVFP4, 1: dense), so that keys of the two modes never meet.
    fn key_into(&self, k: &mut Vec<u64>) {
        match self {
            Act::Nvfp4(o) => {
                k.push(0);
                o.key_into(k);
            }
            Act::Dense(d) => {
                let [l, rows, kk] = d.meta.shape;
                k.extend([
                    1,
                    d.tensor.ptr,
                    l as u64,
                    rows as u64,
                    kk as u64,
                    (d.meta.dtype == OutputDtype::Bf16) as u64,
                ]);
            }
        }
    }
}

/// What a bound operation's parameters depend on: operation, operand addresses, shapes, layouts
/// and forms, outputs (address, shape, dtype), alphas.
pub(crate) fn key(op: u64, operands: &[&dyn KeyPart], outs: &[&Tensor], alphas: &[Option<f32>]) -> Vec<u64> {
    let mut k = vec![op];
    for o in operands {
        o.key_into(&mut k);
    }
    for t in outs {
        k.extend([t.ptr, (out_dtype(t) == OutputDtype::Bf16) as u64]);
        k.extend(t.shape.iter().map(|&d| d as u64));
    }
    k.extend(alphas.iter().map(|a| a.map_or(1 << 32, |v| v.to_bits() as u64)));
    k
}

/// Runs an operation on CUDA device `ordinal` and `stream` (without the GIL when `g` is the
/// caller's `Python`): bound now, or the one bound by an earlier call with the same key.
pub(crate) fn launch<'v>(
    g: &impl Detach,
    stream: u64,
    ordinal: usize,
    key: Vec<u64>,
    op: impl FnOnce() -> DeviceOp<'v> + Send,
) -> PyResult<()> {
    launch_with(g, stream, ordinal, key, |backend, ws| backend.bind_with(op(), ws))
}

/// [`launch`] with the bind step the caller's (which may upload what the bound launch keeps,
/// such as a sequence of per-expert alphas).
pub(crate) fn launch_with(
    g: &impl Detach,
    stream: u64,
    ordinal: usize,
    key: Vec<u64>,
    bind: impl FnOnce(&CudaBackend, &mut Option<Workspace>) -> nvfp4::Result<BoundOp> + Send,
) -> PyResult<()> {
    g.run(move || launch_cached(ordinal, stream, key, bind))
}

/// `c = A·Bᵀ`: A the activation (NVFP4, or dense 16-bit with `sfa` None), B the NVFP4 weight.
#[pyfunction]
#[pyo3(signature = (a, sfa, b, sfb, out, alpha=None, layout=None, stream=None, packed=None))]
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    sfa: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
    sfb: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    alpha: Option<f64>,
    layout: Option<&str>,
    stream: Option<u64>,
    packed: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let mut call = Call::new(stream, layout)?;
    let a = call.activation(a, sfa, "a", "sfa")?;
    let b = call.operand(b, sfb, "b", "sfb")?;
    let out = call.tensor(out, "out")?;
    let packed = Packed::of(&mut call, packed, &a)?;
    let alpha = check_alpha(alpha)?;
    gemm_on(&py, call.device(), call.stream(), &a, &b, &out, &packed, alpha)
}

/// [`gemm`] on imported operands of `device` (CUDA: on `stream`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_on(
    g: &impl Detach,
    device: Device,
    stream: u64,
    a: &Activation,
    b: &Operand,
    out: &Tensor,
    packed: &Option<Packed>,
    alpha: Option<f32>,
) -> PyResult<()> {
    let am = act::meta(a);
    validate(Op::Gemm { a: am, b: b.meta, alpha, c: None })?;
    let shape = [am.l(), am.rows(), b.meta.rows];
    check_out(out, shape, act::flat(a) && b.flat)?;
    match device {
        Device::Cpu => {
            let (bh, dtype) = (b.to_host()?, out_dtype(out));
            let c = on_cpu!(g, a, |ah| Gemm::new(ah, bh, alpha), gemm_as / gemm16_as, dtype);
            out.write_host(&c.to_le_bytes(), 2)
        }
        Device::Cuda(d) => {
            let (av, cv) = (act::view(a)?, out_view(out, shape)?);
            let bv = match packed {
                Some(p) => p.attach(b.view()?, b, None)?,
                None => b.view()?,
            };
            let mut k = key(1, &[a, b], &[out], &[alpha]);
            k.extend(Packed::key(packed));
            launch(g, stream, d, k, || DeviceOp::Gemm { a: act::borrow(&av), b: &bv, alpha, c: &cv })
        }
    }
}

/// Batched GEMV `c = A·b`: A the NVFP4 weight matrix, b the activation vector (one row per
/// batch; NVFP4 in A's scale layout, or dense 16-bit with `sfb` None).
#[pyfunction]
#[pyo3(signature = (a, sfa, b, sfb, out, alpha=None, layout=None, stream=None))]
#[allow(clippy::too_many_arguments)]
pub fn gemv(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    sfa: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
    sfb: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    alpha: Option<f64>,
    layout: Option<&str>,
    stream: Option<u64>,
) -> PyResult<()> {
    let mut call = Call::new(stream, layout)?;
    let a = call.operand(a, sfa, "a", "sfa")?;
    let b = call.activation(b, sfb, "b", "sfb")?;
    let out = call.tensor(out, "out")?;
    let alpha = check_alpha(alpha)?;
    gemv_on(&py, call.device(), call.stream(), &a, &b, &out, alpha)
}

/// [`gemv`] on imported operands of `device` (CUDA: on `stream`).
pub(crate) fn gemv_on(
    g: &impl Detach,
    device: Device,
    stream: u64,
    a: &Operand,
    b: &Activation,
    out: &Tensor,
    alpha: Option<f32>,
) -> PyResult<()> {
    validate(Op::Gemv { a: a.meta, b: act::meta(b), alpha, c: None })?;
    // The GEMV kernel reads both NVFP4 operands in one scale layout: refused on both devices alike.
    if let Act::Nvfp4(bq) = b {
        if a.meta.layout != bq.meta.layout {
            return Err(value("gemv: a and b must share one scale layout"));
        }
    }
    let shape = [a.meta.l, a.meta.rows, 1];
    check_out(out, shape, a.flat && act::flat(b))?;
    match device {
        Device::Cpu => {
            let (ah, dtype) = (a.to_host()?, out_dtype(out));
            let c = on_cpu!(g, b, |bh| Gemv::new(ah, bh, alpha), gemv_as / gemv16_as, dtype);
            out.write_host(&c.to_le_bytes(), 2)
        }
        Device::Cuda(d) => {
            let (av, bv, cv) = (a.view()?, act::view(b)?, out_view(out, shape)?);
            let k = key(2, &[a, b], &[out], &[alpha]);
            launch(g, stream, d, k, || DeviceOp::Gemv { a: &av, b: act::borrow(&bv), alpha, c: &cv })
        }
    }
}

#[pyfunction]
#[pyo3(signature = (a, sfa, b1, sfb1, b2, sfb2, out, alpha=None, layout=None, stream=None, packed=None))]
#[allow(clippy::too_many_arguments)]
pub fn dual_gemm(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    sfa: &Bound<'_, PyAny>,
    b1: &Bound<'_, PyAny>,
    sfb1: &Bound<'_, PyAny>,
    b2: &Bound<'_, PyAny>,
    sfb2: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    alpha: Option<f64>,
    layout: Option<&str>,
    stream: Option<u64>,
    packed: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let mut call = Call::new(stream, layout)?;
    let a = call.activation(a, sfa, "a", "sfa")?;
    let b1 = call.operand(b1, sfb1, "b1", "sfb1")?;
    let b2 = call.operand(b2, sfb2, "b2", "sfb2")?;
    let out = call.tensor(out, "out")?;
    let packed = Packed::of(&mut call, packed, &a)?;
    let alpha = check_alpha(alpha)?;
    dual_gemm_on(&py, call.device(), call.stream(), &a, [&b1, &b2], &out, &packed, alpha)
}

/// [`dual_gemm`] on imported operands of `device` (CUDA: on `stream`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn dual_gemm_on(
    g: &impl Detach,
    device: Device,
    stream: u64,
    a: &Activation,
    [b1, b2]: [&Operand; 2],
    out: &Tensor,
    packed: &Option<Packed>,
    alpha: Option<f32>,
) -> PyResult<()> {
    let am = act::meta(a);
    validate(Op::DualGemm { a: am, b1: b1.meta, b2: b2.meta, alpha, c: None })?;
    let shape = [am.l(), am.rows(), b1.meta.rows];
    check_out(out, shape, act::flat(a) && b1.flat && b2.flat)?;
    match device {
        Device::Cpu => {
            let (b1h, b2h, dtype) = (b1.to_host()?, b2.to_host()?, out_dtype(out));
            let c = on_cpu!(g, a, |ah| DualGemm::new(ah, b1h, b2h, alpha), dual_gemm_as / dual_gemm16_as, dtype);
            out.write_host(&c.to_le_bytes(), 2)
        }
        Device::Cuda(d) => {
            let (av, cv) = (act::view(a)?, out_view(out, shape)?);
            let (b1v, b2v) = match packed {
                Some(p) => (p.attach(b1.view()?, b1, Some(b2))?, p.attach(b2.view()?, b1, Some(b2))?),
                None => (b1.view()?, b2.view()?),
            };
            let mut k = key(3, &[a, b1, b2], &[out], &[alpha]);
            k.extend(Packed::key(packed));
            launch(g, stream, d, k, || DeviceOp::DualGemm { a: act::borrow(&av), b1: &b1v, b2: &b2v, alpha, c: &cv })
        }
    }
}

/// Per-group alphas: none, one for all, or a list of one per group.
fn group_alphas(alpha: Option<&Bound<'_, PyAny>>, g: usize) -> PyResult<Vec<Option<f32>>> {
    let Some(alpha) = alpha.filter(|a| !a.is_none()) else {
        return Ok(vec![None; g]);
    };
    let list: Vec<f64> = if let Ok(x) = alpha.extract::<f64>() {
        vec![x; g]
    } else {
        let v: Vec<f64> = alpha
            .extract()
            .map_err(|_| crate::error::kind("alpha must be a float or a list of floats, one per group"))?;
        if v.len() != g {
            return Err(value(format!("alpha: {} values for {g} groups", v.len())));
        }
        v
    };
    list.into_iter().map(|a| check_alpha(Some(a))).collect()
}

#[pyfunction]
#[pyo3(signature = (groups, outs, alpha=None, layout=None, stream=None))]
pub fn grouped_gemm(
    py: Python<'_>,
    groups: &Bound<'_, PyList>,
    outs: &Bound<'_, PyList>,
    alpha: Option<&Bound<'_, PyAny>>,
    layout: Option<&str>,
    stream: Option<u64>,
) -> PyResult<()> {
    let g = groups.len();
    if g == 0 {
        return Err(value("grouped gemm: no groups"));
    }
    if outs.len() != g {
        return Err(value(format!("grouped gemm: {g} groups but {} outputs", outs.len())));
    }
    let alphas = group_alphas(alpha, g)?;
    let mut call = Call::new(stream, layout)?;
    let mut pairs = Vec::with_capacity(g);
    for (i, item) in groups.iter().enumerate() {
        let t: (Bound<'_, PyAny>, Bound<'_, PyAny>, Bound<'_, PyAny>, Bound<'_, PyAny>) =
            item.extract().map_err(|_| crate::error::kind(format!("groups[{i}] must be a tuple (a, sfa, b, sfb)")))?;
        let a = call.activation(&t.0, &t.1, &format!("groups[{i}].a"), &format!("groups[{i}].sfa"))?;
        let b = call.operand(&t.2, &t.3, &format!("groups[{i}].b"), &format!("groups[{i}].sfb"))?;
        pairs.push((a, b));
    }
    // The operation's rules first (a group's L or K, one activation form for all), then each
    // output against its group.
    validate(Op::GroupedGemm(
        pairs
            .iter()
            .zip(&alphas)
            .map(|((a, b), &alpha)| Group { a: act::meta(a), b: b.meta, alpha, c: None })
            .collect(),
    ))?;
    let mut ops = Vec::with_capacity(g);
    for (i, (a, b)) in pairs.into_iter().enumerate() {
        let out = call.tensor(&outs.get_item(i)?, &format!("outs[{i}]"))?;
        let am = act::meta(&a);
        let shape = [1, am.rows(), b.meta.rows];
        check_out(&out, shape, act::flat(&a) && b.flat)?;
        ops.push((a, b, out, shape));
    }
    match call.device() {
        Device::Cpu => {
            // Each group as a GEMM (the CPU reference has no launch to share), in its output's
            // dtype: a list may mix them.
            for ((a, b, out, _), al) in ops.iter().zip(&alphas) {
                let (bh, dtype) = (b.to_host()?, out_dtype(out));
                let c = on_cpu!(&py, a, |ah| Gemm::new(ah, bh, *al), gemm_as / gemm16_as, dtype);
                out.write_host(&c.to_le_bytes(), 2)?;
            }
            Ok(())
        }
        Device::Cuda(d) => {
            let mut views: Vec<(ActViews, Nvfp4View, F16View)> = Vec::with_capacity(g);
            for (a, b, out, shape) in &ops {
                views.push((act::view(a)?, b.view()?, out_view(out, *shape)?));
            }
            let gv: Vec<GemmViews<'_>> = views
                .iter()
                .zip(&alphas)
                .map(|((a, b, c), al)| GemmViews { a: act::borrow(a), b, alpha: *al, c })
                .collect();
            let operands: Vec<&dyn KeyPart> =
                ops.iter().flat_map(|(a, b, _, _)| [a as &dyn KeyPart, b as &dyn KeyPart]).collect();
            let outs: Vec<&Tensor> = ops.iter().map(|(_, _, out, _)| out).collect();
            let k = key(OP_GROUPED, &operands, &outs, &alphas);
            launch(&py, call.stream(), d, k, move || DeviceOp::GroupedGemm(gv))
        }
    }
}
