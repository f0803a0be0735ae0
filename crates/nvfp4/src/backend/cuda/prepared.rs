//! Problems staged on the device: host operands uploaded once, outputs allocated, the operation
//! bound; what `prepare` returns for repeated launches (the tests, `check`, the bench) and what
//! the host-data [`Backend`](crate::Backend) methods run once.

use std::sync::Arc;

use super::backend::CudaBackend;
use super::device::{self, DeviceF16, DeviceNvfp4, F16View, F32View, I32View, Nvfp4View};
use super::device_op::BoundOp;
use crate::format::{Nvfp4Tensor, OutTensor, OutputDtype, ScaleLayout};
use crate::ops::{Act, Activation, HostOp, Op};
use crate::problem::{Output, Problem};
use crate::{Error, Result};

/// f16 quiet NaN: what [`Prepared::poison`] fills f16 outputs with.
pub const F16_NAN_BITS: u16 = 0x7E00;

/// A staged operation: each operand the index of its uploaded tensor (an activation's in the
/// NVFP4 or the dense list), the MoE offsets and per-expert alphas uploaded, outputs to be made.
/// Enough to bind the same inputs again to new outputs.
type Staged = Op<usize, I32View, F32View, (), Act<usize, usize>>;

/// The uploaded operands of a staged operation: NVFP4 tensors, and the 16-bit activations of a
/// W4A16 one.
#[derive(Default)]
pub(super) struct Inputs {
    nvfp4: Vec<DeviceNvfp4>,
    dense: Vec<DeviceF16>,
}

/// A host activation the CUDA backend can stage: uploaded into `inputs`, its index returned.
pub(super) trait Stage {
    /// Uploads it (an NVFP4 GEMV vector in the scale layout `layout` of the matrix, which the
    /// kernel reads both in).
    fn stage(&self, be: &CudaBackend, inputs: &mut Inputs, layout: Option<ScaleLayout>) -> Result<Act<usize, usize>>;
}

impl Stage for &Nvfp4Tensor {
    fn stage(&self, be: &CudaBackend, inputs: &mut Inputs, layout: Option<ScaleLayout>) -> Result<Act<usize, usize>> {
        let up = match layout {
            Some(l) if l != self.layout() => be.upload(&self.to_layout(l))?,
            _ => be.upload(self)?,
        };
        inputs.nvfp4.push(up);
        Ok(Act::Nvfp4(inputs.nvfp4.len() - 1))
    }
}

impl Stage for &OutTensor {
    fn stage(&self, be: &CudaBackend, inputs: &mut Inputs, _: Option<ScaleLayout>) -> Result<Act<usize, usize>> {
        inputs.dense.push(be.upload_dense(self)?);
        Ok(Act::Dense(inputs.dense.len() - 1))
    }
}

impl CudaBackend {
    /// Uploads the operands of `p`, allocates its output(s) and binds it with a workspace of its
    /// own, ready to launch repeatedly.
    pub fn prepare(&self, p: &Problem) -> Result<Prepared> {
        self.prepare_as(p, OutputDtype::F16)
    }

    /// [`CudaBackend::prepare`] with outputs of `dtype`. A MoE problem that no kernel takes in
    /// one launch (W4A4 with K % 32 != 0 or K < 64) is `Error::Unsupported`:
    /// [`Backend::moe_gemm`](crate::Backend::moe_gemm) runs it as a list of groups split on the
    /// host.
    pub fn prepare_as(&self, p: &Problem, dtype: OutputDtype) -> Result<Prepared> {
        let op = p.op();
        op.validate()?;
        // The host values the operation's metadata does not hold: the offsets and per-expert
        // alphas (the fields are public).
        if let Problem::Moe(m) = p {
            m.validate()?;
        }
        if let (Op::MoeGemm { .. }, Err(e)) = (&op, self.route(&op.meta())) {
            return Err(Error::Unsupported {
                backend: "cuda".into(),
                what: format!("preparing this MoE form for repeated launches ({e}); Backend::moe_gemm runs it"),
            });
        }
        self.stage(&op, false, dtype)
    }

    /// Uploads `op`'s operands (a GEMV's B in A's scale layout: its kernel reads both in one),
    /// offsets and per-expert alphas, allocates its outputs (of `dtype`) and binds it: with the backend's shared
    /// workspace (`shared`, locked only while binding) or a workspace of its own.
    pub(super) fn stage<A: Stage + Activation>(
        &self,
        op: &HostOp<'_, A>,
        shared: bool,
        dtype: OutputDtype,
    ) -> Result<Prepared> {
        op.validate()?;
        let gemv_layout = match op {
            Op::Gemv { a, .. } => Some(a.layout()),
            _ => None,
        };
        let inputs = std::cell::RefCell::new(Inputs::default());
        let staged = op.try_map(
            |t| {
                let mut inputs = inputs.borrow_mut();
                inputs.nvfp4.push(self.upload(t)?);
                Ok(inputs.nvfp4.len() - 1)
            },
            |x| x.stage(self, &mut inputs.borrow_mut(), gemv_layout),
            |offsets| self.upload_i32(offsets),
            |alphas| self.upload_f32(alphas),
            |_| Ok::<_, crate::Error>(()),
        )?;
        self.bind_staged(staged, Arc::new(inputs.into_inner()), shared, dtype)
    }

    /// Another launch of `p`'s problem on the same device operands, with outputs and a
    /// workspace of its own: launches of the two may overlap (a graph of chained launches) and
    /// never write the same bytes.
    pub fn replica(&self, p: &Prepared) -> Result<Prepared> {
        self.bind_staged(p.staged.clone(), p.inputs.clone(), false, p.dtype)
    }

    /// Allocates the outputs of `staged` over `inputs` (of `dtype`) and binds them.
    fn bind_staged(&self, staged: Staged, inputs: Arc<Inputs>, shared: bool, dtype: OutputDtype) -> Result<Prepared> {
        let views: Vec<Nvfp4View> = inputs.nvfp4.iter().map(DeviceNvfp4::view).collect();
        let dense: Vec<F16View> = inputs.dense.iter().map(DeviceF16::view).collect();
        let act = |x: &Act<usize, usize>| match *x {
            Act::Nvfp4(i) => Act::Nvfp4(&views[i]),
            Act::Dense(i) => Act::Dense(&dense[i]),
        };
        let shapes =
            staged.map(|&i| views[i].meta, |x| act(x).act_meta(), |o| o.len, |x| x.len, |_| None).output_shapes();
        let outputs: Vec<DeviceF16> =
            shapes.into_iter().map(|s| self.alloc_output_as(s, dtype)).collect::<Result<_>>()?;
        let out_views: Vec<F16View> = outputs.iter().map(DeviceF16::view).collect();
        let mut next = out_views.iter();
        let op = staged.map(|&i| &views[i], act, |o| o, |x| x, |_| next.next().expect("one view per output"));
        let bound = if shared { self.bind(op)? } else { self.bind_with(op, &mut None)? };
        Ok(Prepared { bound, inputs, outputs, staged, dtype })
    }
}

/// A problem whose operands live on the device, ready to launch repeatedly.
pub struct Prepared {
    bound: BoundOp,
    /// Shared with its replicas.
    inputs: Arc<Inputs>,
    /// One output per group for grouped GEMM.
    outputs: Vec<DeviceF16>,
    staged: Staged,
    /// The outputs' element type.
    dtype: OutputDtype,
}

impl Prepared {
    /// Enqueues the kernel(s) on the backend's stream; no allocation, no copy, no sync.
    pub fn launch(&mut self) -> Result<()> {
        self.bound.launch()
    }

    /// [`Prepared::launch`] as a programmatic dependent of the kernel before it on the stream,
    /// where the first kernel is ready for it ([`Prepared::chains`]).
    pub fn launch_chained(&mut self) -> Result<()> {
        self.bound.launch_chained_on(self.bound.gpu.stream_handle())
    }

    /// True when [`Prepared::launch_chained`] chains (see [`BoundOp::chains`]).
    pub fn chains(&self) -> bool {
        self.bound.chains()
    }

    /// Fills the output with its type's NaN so that an unwritten element fails the check.
    pub fn poison(&mut self) -> Result<()> {
        for out in &self.outputs {
            device::fill_f16(&self.bound.gpu, out, out.dtype().nan_bits())?;
        }
        Ok(())
    }

    /// Waits for the stream and downloads the output tensors, of either type (one per group for
    /// grouped GEMM).
    pub fn outputs(&self) -> Result<Vec<OutTensor>> {
        self.outputs.iter().map(|out| device::download(&self.bound.gpu, out)).collect()
    }

    /// Waits for the stream and downloads the f16 output.
    pub fn output(&self) -> Result<Output> {
        let mut tensors = self.outputs()?.into_iter().map(OutTensor::into_f16).collect::<Result<Vec<_>>>()?;
        Ok(if matches!(self.staged, Op::GroupedGemm(_)) {
            Output::Grouped(tensors)
        } else {
            Output::Single(tensors.remove(0))
        })
    }

    /// The launch configuration, printable.
    pub fn describe(&self) -> String {
        self.bound.describe()
    }

    /// The bound operation (its route, launches on other streams).
    pub fn bound(&self) -> &BoundOp {
        &self.bound
    }
}
