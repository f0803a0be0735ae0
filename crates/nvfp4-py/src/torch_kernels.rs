//! The CPU and CUDA kernels of `torch.ops.nvfp4.*` as native boxed kernels (torch's stable C
//! ABI, `torch_abi`): an eager call goes from the dispatcher straight to the operation, with no
//! Python frame, no Python-level output allocation and no DLPack exchange: the host cost the
//! Python kernels spent there (about 15 µs of 25 per call on an H100 host, `host_cost.py`).
//!
//! Each kernel takes its arguments (all of them, first: they are owned by the call), allocates
//! its output as the Python kernel did (shape, dtype, zeros for the MoE form's unrouted rows)
//! and runs the same checked operation (`ops::gemm_on` and its siblings) on the current stream of
//! the tensors' device. A refused call raises the operation's message, its Python type named
//! first (`ValueError: gemm: ...`), as a torch operator error (RuntimeError in Python).
//! `grouped_gemm` (tensor lists) and `grouped_gemm_moe.list` keep their Python kernels.

use std::panic::{catch_unwind, AssertUnwindSafe};

use nvfp4::ops::Act;
use pyo3::prelude::*;

use crate::act::{Activation, Dense};
use crate::gil::NoGil;
use crate::moe::{moe_on, moe_rules};
use crate::moe_alpha::MoeAlphaArg;
use crate::operand::{parse_layout, Operand};
use crate::ops::{check_alpha, dual_gemm_on, gemm_on, gemv_on};
use crate::pack::Packed;
use crate::quantize::{dense_type, dequant_dtype, input_dims, quantize_dequant_on, quantize_on};
use crate::tensor::{Device, Dtype, Tensor};
use crate::torch_abi::{self, load, shim, take, BoxedKernel, Handle, StableIValue};

type Res<T> = Result<T, String>;

/// A Python exception of the shared operation code as a message naming its type.
fn msg(e: PyErr) -> String {
    // The error drops inside: with the GIL held.
    Python::attach(move |py| {
        let ty = e.get_type(py).name().map(|n| n.to_string()).unwrap_or_else(|_| "Error".into());
        format!("{ty}: {}", e.value(py))
    })
}

/// Runs kernel body `f` on the stack's `nargs` arguments (`want` by the schema) and puts its
/// outputs in the return slots, or raises its error once everything it held is dropped.
fn boxed(
    stack: *mut StableIValue,
    (nargs, returns): (u64, u64),
    want: usize,
    name: &str,
    f: impl FnOnce(&[StableIValue]) -> Res<Vec<Handle>>,
) {
    // SAFETY: torch's stack holds the `nargs` arguments first (and room for every return).
    let args: Vec<StableIValue> = unsafe { std::slice::from_raw_parts(stack, nargs as usize) }.to_vec();
    let message = if args.len() != want {
        format!("nvfp4.{name}: {} arguments, the schema has {want}", args.len())
    } else {
        match catch_unwind(AssertUnwindSafe(|| f(&args))) {
            Ok(Ok(outs)) if outs.len() as u64 == returns => {
                for (i, h) in outs.into_iter().enumerate() {
                    // SAFETY: slot i < the schema's returns, within the stack.
                    unsafe { *stack.add(i) = h.release() };
                }
                return;
            }
            Ok(Ok(outs)) => format!("nvfp4.{name}: {} outputs, the schema has {returns}", outs.len()),
            Ok(Err(m)) => m,
            Err(_) => format!("nvfp4.{name}: internal error (a panic in the native kernel)"),
        }
    };
    shim().raise(&message)
}

/// The call's device (its first tensor's; every other must share it) and stream.
#[derive(Default)]
struct Ctx {
    device: Option<Device>,
}

impl Ctx {
    fn tensor(&mut self, h: &Handle, name: &str) -> Res<Tensor> {
        let t = h.describe(name)?;
        match self.device {
            Some(d) if d != t.device => {
                Err(format!("ValueError: {name} is on {}, the operation's first tensor on {d}", t.device))
            }
            _ => {
                self.device = Some(t.device);
                Ok(t)
            }
        }
    }
    fn device(&self) -> Device {
        self.device.unwrap_or(Device::Cpu)
    }
    fn stream(&self) -> Res<u64> {
        match self.device() {
            Device::Cpu => Ok(0),
            Device::Cuda(i) => shim().current_stream(i),
        }
    }
    fn operand(
        &mut self,
        v: &Handle,
        s: &Handle,
        layout: Option<nvfp4::ScaleLayout>,
        names: [&str; 2],
    ) -> Res<Operand> {
        let (v, s) = (self.tensor(v, names[0])?, self.tensor(s, names[1])?);
        Operand::new(v, s, layout).map_err(msg)
    }
    /// NVFP4 values with scales, or (`s` None) a dense 16-bit activation.
    fn activation(
        &mut self,
        v: &Handle,
        s: Option<&Handle>,
        layout: Option<nvfp4::ScaleLayout>,
        names: [&str; 2],
    ) -> Res<Activation> {
        match s {
            None => Ok(Act::Dense(Dense::new(self.tensor(v, names[0])?, names[1]).map_err(msg)?)),
            Some(s) => Ok(Act::Nvfp4(self.operand(v, s, layout, names)?)),
        }
    }
    /// A new output on the call's device, with its description.
    fn output(&self, shape: &[usize], dtype: Dtype, zeroed: bool) -> Res<(Handle, Tensor)> {
        let h = shim().empty(shape, dtype, self.device(), zeroed)?;
        let t = h.describe("out")?;
        Ok((h, t))
    }
}

fn layout_of(s: Res<Option<String>>) -> Res<Option<nvfp4::ScaleLayout>> {
    parse_layout(s?.as_deref()).map_err(msg)
}

fn alpha_of(a: Option<f64>) -> Res<Option<f32>> {
    check_alpha(a).map_err(msg)
}

/// The output's type: `out_dtype` (float16 or bfloat16), else a dense activation's, else float16.
fn out_type(code: Option<i32>, act: Option<&Activation>) -> Res<Dtype> {
    let dense = match act {
        Some(Act::Dense(d)) => Some(d.tensor.dtype),
        _ => None,
    };
    match code {
        None => Ok(dense.unwrap_or(Dtype::F16)),
        Some(c) => {
            [Dtype::F16, Dtype::Bf16].into_iter().find(|&d| torch_abi::dtype_code(d) == Some(c)).ok_or_else(|| {
                format!(
                    "ValueError: out_dtype must be torch.float16 or torch.bfloat16, got {}",
                    torch_abi::dtype_name(c)
                )
            })
        }
    }
}

fn act_tensor(a: &Activation) -> &Tensor {
    match a {
        Act::Nvfp4(o) => &o.values,
        Act::Dense(d) => &d.tensor,
    }
}

/// The output's leading dimensions, as `nvfp4.gemm` shapes them: [M] when both operands are
/// 2-D, else [L, M] (shapes already checked: 2-D or 3-D).
fn lead(a: &Tensor, b: &Tensor) -> Vec<usize> {
    let r = a.shape.len();
    if r == 2 && b.shape.len() == 2 {
        vec![a.shape[0]]
    } else {
        vec![if r == 3 { a.shape[0] } else { 1 }, a.shape[r - 2]]
    }
}

/// `gemm(Tensor a, Tensor? sfa, Tensor b, Tensor sfb, float? alpha, ScalarType? out_dtype,
/// str? layout, Tensor? packed) -> Tensor`
unsafe extern "C-unwind" fn gemm(stack: *mut StableIValue, nargs: u64, returns: u64) {
    boxed(stack, (nargs, returns), 8, "gemm", |s| {
        let (a, sfa, b, sfb) = (take::tensor(s[0]), take::opt_tensor(s[1]), take::tensor(s[2]), take::tensor(s[3]));
        let (alpha, dt, layout) = (take::opt_f64(s[4]), take::opt_dtype(s[5]), take::opt_string(s[6]));
        let packed = take::opt_tensor(s[7]);
        let layout = layout_of(layout)?;
        let mut c = Ctx::default();
        let a = c.activation(&a, sfa.as_ref(), layout, ["a", "sfa"])?;
        let b = c.operand(&b, &sfb, layout, ["b", "sfb"])?;
        let packed = match &packed {
            Some(p) => Some(Packed::from_tensor(c.tensor(p, "packed")?, &a).map_err(msg)?),
            None => None,
        };
        let alpha = alpha_of(alpha)?;
        let mut shape = lead(act_tensor(&a), &b.values);
        shape.push(b.meta.rows);
        let (out, ot) = c.output(&shape, out_type(dt, Some(&a))?, false)?;
        gemm_on(&NoGil, c.device(), c.stream()?, &a, &b, &ot, &packed, alpha).map_err(msg)?;
        Ok(vec![out])
    })
}

/// `gemv(Tensor a, Tensor sfa, Tensor b, Tensor? sfb, float? alpha, ScalarType? out_dtype,
/// str? layout) -> Tensor`
unsafe extern "C-unwind" fn gemv(stack: *mut StableIValue, nargs: u64, returns: u64) {
    boxed(stack, (nargs, returns), 7, "gemv", |s| {
        let (a, sfa, b, sfb) = (take::tensor(s[0]), take::tensor(s[1]), take::tensor(s[2]), take::opt_tensor(s[3]));
        let (alpha, dt, layout) = (take::opt_f64(s[4]), take::opt_dtype(s[5]), take::opt_string(s[6]));
        let layout = layout_of(layout)?;
        let mut c = Ctx::default();
        let a = c.operand(&a, &sfa, layout, ["a", "sfa"])?;
        let b = c.activation(&b, sfb.as_ref(), layout, ["b", "sfb"])?;
        let alpha = alpha_of(alpha)?;
        let mut shape = lead(&a.values, act_tensor(&b));
        shape.push(1);
        let (out, ot) = c.output(&shape, out_type(dt, Some(&b))?, false)?;
        gemv_on(&NoGil, c.device(), c.stream()?, &a, &b, &ot, alpha).map_err(msg)?;
        Ok(vec![out])
    })
}

/// `dual_gemm(Tensor a, Tensor? sfa, Tensor b1, Tensor sfb1, Tensor b2, Tensor sfb2, float?
/// alpha, ScalarType? out_dtype, str? layout) -> Tensor`
unsafe extern "C-unwind" fn dual_gemm(stack: *mut StableIValue, nargs: u64, returns: u64) {
    boxed(stack, (nargs, returns), 9, "dual_gemm", |s| {
        let (a, sfa) = (take::tensor(s[0]), take::opt_tensor(s[1]));
        let (b1, sfb1, b2, sfb2) = (take::tensor(s[2]), take::tensor(s[3]), take::tensor(s[4]), take::tensor(s[5]));
        let (alpha, dt, layout) = (take::opt_f64(s[6]), take::opt_dtype(s[7]), take::opt_string(s[8]));
        let layout = layout_of(layout)?;
        let mut c = Ctx::default();
        let a = c.activation(&a, sfa.as_ref(), layout, ["a", "sfa"])?;
        let b1 = c.operand(&b1, &sfb1, layout, ["b1", "sfb1"])?;
        let b2 = c.operand(&b2, &sfb2, layout, ["b2", "sfb2"])?;
        let alpha = alpha_of(alpha)?;
        let mut shape = lead(act_tensor(&a), &b1.values);
        shape.push(b1.meta.rows);
        let (out, ot) = c.output(&shape, out_type(dt, Some(&a))?, false)?;
        dual_gemm_on(&NoGil, c.device(), c.stream()?, &a, [&b1, &b2], &ot, &None, alpha).map_err(msg)?;
        Ok(vec![out])
    })
}

/// The MoE form, `alpha` one float (`.default`) or a float32 tensor [E] (`.Tensor`):
/// `grouped_gemm_moe(Tensor a, Tensor? sfa, Tensor b, Tensor sfb, Tensor offsets, alpha,
/// ScalarType? out_dtype, str? layout, Tensor? packed) -> Tensor`, unrouted rows zero.
fn moe(s: &[StableIValue], tensor_alpha: bool) -> Res<Vec<Handle>> {
    let (a, sfa, b, sfb) = (take::tensor(s[0]), take::opt_tensor(s[1]), take::tensor(s[2]), take::tensor(s[3]));
    let offsets = take::tensor(s[4]);
    let (alpha_t, alpha_f) = if tensor_alpha { (Some(take::tensor(s[5])), None) } else { (None, take::opt_f64(s[5])) };
    let (dt, layout, packed) = (take::opt_dtype(s[6]), take::opt_string(s[7]), take::opt_tensor(s[8]));
    let layout = layout_of(layout)?;
    let mut c = Ctx::default();
    let a = c.activation(&a, sfa.as_ref(), layout, ["a", "sfa"])?;
    let b = c.operand(&b, &sfb, layout, ["b", "sfb"])?;
    let offsets = c.tensor(&offsets, "offsets")?;
    let packed = match &packed {
        Some(p) => Some(Packed::from_tensor(c.tensor(p, "packed")?, &a).map_err(msg)?),
        None => None,
    };
    let alpha = match &alpha_t {
        // `.Tensor` is tried first: torch hands it a None alpha as an undefined tensor.
        Some(h) if !h.defined() => MoeAlphaArg::One(None),
        // A 0-d tensor is one alpha for every expert, read on the host as the Python kernel did.
        Some(h) if h.dim()? == 0 => {
            let t = c.tensor(h, "alpha")?;
            if t.dtype != Dtype::F32 {
                return Err(format!("DtypeError: alpha: a one-value alpha tensor must be float32, got {}", t.dtype));
            }
            MoeAlphaArg::One(alpha_of(Some(f64::from(h.item_f32()?)))?)
        }
        None => MoeAlphaArg::One(alpha_of(alpha_f)?),
        Some(h) => {
            let t = c.tensor(h, "alpha")?;
            if t.dtype != Dtype::F32 {
                return Err(format!("DtypeError: alpha: per-expert alphas must be float32, got {}", t.dtype));
            }
            if t.shape.len() != 1 {
                return Err(format!(
                    "ValueError: alpha: per-expert alphas must be 1-D [E] (one per expert; one alpha for every \
                     expert is a float), got shape {:?}",
                    t.shape
                ));
            }
            MoeAlphaArg::Tensor(t)
        }
    };
    // The rules first: a refused call allocates and zeroes nothing.
    moe_rules(&a, &b, &offsets, &alpha).map_err(msg)?;
    let at = act_tensor(&a);
    let mut shape = at.shape[..at.shape.len().saturating_sub(1)].to_vec();
    shape.push(if b.values.shape.len() == 3 { b.values.shape[1] } else { b.meta.rows });
    // Zeroed for the rows no expert owns: by torch on the CPU, by one driver memset on the
    // call's stream on a GPU (torch's zero_ there costs a dispatch and a launch more).
    let cuda = match c.device() {
        Device::Cuda(d) => Some(d),
        Device::Cpu => None,
    };
    let (out, ot) = c.output(&shape, out_type(dt, Some(&a))?, cuda.is_none())?;
    let stream = c.stream()?;
    if let Some(d) = cuda {
        let bytes = ot.numel() * 2;
        // SAFETY: `ot` is the 16-bit output just allocated on device d (`bytes` bytes, dense, not
        // empty: the rules refuse a zero dimension), held by `out` until torch frees it, which it
        // orders after work on `stream`, the call's current stream of that device.
        crate::cuda::with_device(d, stream, |backend, _, h| unsafe { backend.zero_raw(ot.ptr, bytes, h) })
            .map_err(msg)?;
    }
    moe_on(&NoGil, c.device(), stream, &a, &b, &offsets, &ot, &packed, &alpha).map_err(msg)?;
    Ok(vec![out])
}

unsafe extern "C-unwind" fn grouped_gemm_moe(stack: *mut StableIValue, nargs: u64, returns: u64) {
    boxed(stack, (nargs, returns), 9, "grouped_gemm_moe", |s| moe(s, false))
}

unsafe extern "C-unwind" fn grouped_gemm_moe_tensor(stack: *mut StableIValue, nargs: u64, returns: u64) {
    boxed(stack, (nargs, returns), 9, "grouped_gemm_moe", |s| moe(s, true))
}

/// `quantize(Tensor x, float? global_scale, str layout) -> (Tensor, Tensor, Tensor)`: values
/// uint8 [.., K/2], scales float8_e4m3fn (plain [.., K/16]; blocked [L, ceil(rows/128),
/// ceil(K/64), 512]), the global scale float32 [1].
unsafe extern "C-unwind" fn quantize(stack: *mut StableIValue, nargs: u64, returns: u64) {
    boxed(stack, (nargs, returns), 3, "quantize", |s| {
        let (x, global, layout) = (take::tensor(s[0]), take::opt_f64(s[1]), take::string(s[2]));
        let layout = parse_layout(Some(&layout?)).map_err(msg)?.unwrap_or(nvfp4::ScaleLayout::Plain);
        let mut c = Ctx::default();
        let xt = c.tensor(&x, "x")?;
        dense_type(&xt).map_err(msg)?;
        let (l, rows, k) = input_dims(&xt).map_err(msg)?;
        let lead = &xt.shape[..xt.shape.len() - 1];
        let vshape: Vec<usize> = lead.iter().copied().chain([k / 2]).collect();
        let sshape: Vec<usize> = match layout {
            nvfp4::ScaleLayout::Plain => lead.iter().copied().chain([k / 16]).collect(),
            nvfp4::ScaleLayout::Blocked => vec![l, rows.div_ceil(128), (k / 16).div_ceil(4), 512],
        };
        let (vh, vt) = c.output(&vshape, Dtype::U8, false)?;
        let (sh, st) = c.output(&sshape, Dtype::E4m3, false)?;
        let (gh, gt) = c.output(&[1], Dtype::F32, false)?;
        let given = global.map(|g| Ok(g as f32));
        quantize_on(&NoGil, c.stream()?, &xt, vt, st, &gt, given.as_ref(), layout, false).map_err(msg)?;
        Ok(vec![vh, sh, gh])
    })
}

/// `quantize_dequant(Tensor x, float? global_scale) -> (Tensor, Tensor)`: x quantized and written
/// back as e2m1 * e4m3 (bfloat16; float16 for float16 x), and the global scale float32 [1].
unsafe extern "C-unwind" fn quantize_dequant(stack: *mut StableIValue, nargs: u64, returns: u64) {
    boxed(stack, (nargs, returns), 2, "quantize_dequant", |s| {
        let (x, global) = (take::tensor(s[0]), take::opt_f64(s[1]));
        let mut c = Ctx::default();
        let xt = c.tensor(&x, "x")?;
        input_dims(&xt).map_err(msg)?;
        let (oh, ot) = c.output(&xt.shape, dequant_dtype(&xt).map_err(msg)?, false)?;
        let (gh, gt) = c.output(&[1], Dtype::F32, false)?;
        quantize_dequant_on(&NoGil, c.stream()?, &xt, &ot, &gt, global.map(|g| g as f32)).map_err(msg)?;
        Ok(vec![oh, gh])
    })
}

/// The kernels, by operator name (overloads after a dot).
const KERNELS: [(&str, BoxedKernel); 7] = [
    ("gemm", gemm),
    ("gemv", gemv),
    ("dual_gemm", dual_gemm),
    ("grouped_gemm_moe", grouped_gemm_moe),
    ("grouped_gemm_moe.Tensor", grouped_gemm_moe_tensor),
    ("quantize", quantize),
    ("quantize_dequant", quantize_dequant),
];

/// Registers the native kernels of the `nvfp4` operators (defined already, by `nvfp4/torch.py`)
/// for the CPU and, when `cuda_lib` is given, CUDA dispatch keys, once per process; returns the
/// operator names they serve (the caller registers its Python kernels for the others).
/// `cpu_lib`, `cuda_lib`: the paths of the loaded libtorch_cpu and libtorch_cuda.
#[pyfunction]
#[pyo3(signature = (cpu_lib, cuda_lib=None))]
pub fn register_torch_kernels(cpu_lib: &str, cuda_lib: Option<&str>) -> crate::error::PyResult<Vec<&'static str>> {
    static DONE: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    if !*done {
        let s = load(cpu_lib, cuda_lib).map_err(crate::error::value)?;
        s.register("CPU", &KERNELS).map_err(crate::error::value)?;
        if cuda_lib.is_some() {
            s.register("CUDA", &KERNELS).map_err(crate::error::value)?;
        }
        *done = true;
    }
    Ok(KERNELS.iter().map(|(n, _)| *n).collect())
}
