//! Problems staged on the device: host operands uploaded once, outputs allocated, the operation
//! bound; what `prepare` returns for repeated launches (the tests, `check`, the bench) and what
//! the host-data [`Backend`](crate::Backend) methods run once.

use super::backend::CudaBackend;
use std::io::Write;
use std::sync::Arc;

use super::device::{self, DeviceF16, DeviceNvfp4, F16View, Nvfp4View};
use super::device_op::{BoundOp, DeviceOp, GemmViews};
use super::gemv::GemvConfig;
use crate::format::{Nvfp4Tensor, OutTensor, OutputDtype};
use crate::ops::{DualGemm, Gemm, Gemv, GroupedGemm};
use crate::problem::{Output, Problem};
use crate::{Error, Result};

/// f16 quiet NaN: what [`Prepared::poison`] fills f16 outputs with.
pub const F16_NAN_BITS: u16 = 0x7E00;

/// One operation's host operands, borrowed (staging clones none of them).
#[derive(Clone, Copy)]
pub(super) enum HostOp<'a> {
    Gemv(&'a Gemv),
    Gemm(&'a Gemm),
    DualGemm(&'a DualGemm),
    GroupedGemm(&'a GroupedGemm),
}

impl<'a> TryFrom<&'a Problem> for HostOp<'a> {
    type Error = Error;
    fn try_from(p: &'a Problem) -> Result<Self> {
        Ok(match p {
            Problem::Gemv(g) => HostOp::Gemv(g),
            Problem::Gemm(g) => HostOp::Gemm(g),
            Problem::DualGemm(d) => HostOp::DualGemm(d),
            Problem::GroupedGemm(g) => HostOp::GroupedGemm(g),
            Problem::Moe(_) => {
                return Err(Error::Unsupported {
                    backend: "cuda".into(),
                    what: "preparing the MoE form for repeated launches (Backend::moe_gemm runs it)".into(),
                })
            }
        })
    }
}

impl CudaBackend {
    /// Uploads the operands of `p`, allocates its output(s) and binds it with a workspace of its
    /// own, ready to launch repeatedly.
    pub fn prepare(&self, p: &Problem) -> Result<Prepared> {
        self.prepare_as(p, OutputDtype::F16)
    }

    /// [`CudaBackend::prepare`] with outputs of `dtype`.
    pub fn prepare_as(&self, p: &Problem, dtype: OutputDtype) -> Result<Prepared> {
        self.stage(HostOp::try_from(p)?, false, dtype)
    }

    /// Uploads `op`'s operands, allocates its outputs (of `dtype`) and binds it: with the
    /// backend's shared workspace (`shared`, locked only while binding) or a workspace of its own.
    pub(super) fn stage(&self, op: HostOp<'_>, shared: bool, dtype: OutputDtype) -> Result<Prepared> {
        let up = |t: &Nvfp4Tensor| self.upload(t);
        let (binding, inputs) = match op {
            // The kernel reads both operands in one scale layout; B is one row per batch.
            HostOp::Gemv(g) => {
                let b = if g.b.layout() == g.a.layout() { up(&g.b)? } else { up(&g.b.to_layout(g.a.layout()))? };
                (Binding::Gemv(g.alpha), vec![up(&g.a)?, b])
            }
            HostOp::Gemm(g) => (Binding::Gemm(g.alpha), vec![up(&g.a)?, up(&g.b)?]),
            HostOp::DualGemm(d) => (Binding::Dual(d.alpha), vec![up(&d.a)?, up(&d.b1)?, up(&d.b2)?]),
            HostOp::GroupedGemm(gg) => {
                let mut inputs = Vec::with_capacity(2 * gg.groups.len());
                for g in &gg.groups {
                    inputs.extend([up(&g.a)?, up(&g.b)?]);
                }
                (Binding::Grouped(gg.groups.iter().map(|g| g.alpha).collect()), inputs)
            }
        };
        self.bind_staged(binding, Arc::new(inputs), shared, dtype)
    }

    /// Another launch of `p`'s problem on the same device operands, with outputs and a
    /// workspace of its own: launches of the two may overlap (a graph of chained launches) and
    /// never write the same bytes.
    pub fn replica(&self, p: &Prepared) -> Result<Prepared> {
        self.bind_staged(p.binding.clone(), p.inputs.clone(), false, p.dtype)
    }

    /// Allocates the outputs of `binding` over `inputs` (of `dtype`) and binds them.
    fn bind_staged(
        &self,
        binding: Binding,
        inputs: Arc<Vec<DeviceNvfp4>>,
        shared: bool,
        dtype: OutputDtype,
    ) -> Result<Prepared> {
        let out = |l: usize, rows: usize, cols: usize| self.alloc_output_as([l, rows, cols], dtype);
        let bind = |op: DeviceOp<'_>| if shared { self.bind(op) } else { self.bind_with(op, &mut None) };
        let meta = |i: usize| *inputs[i].meta();
        let v: Vec<Nvfp4View> = inputs.iter().map(DeviceNvfp4::view).collect();
        let (bound, outputs) = match &binding {
            &Binding::Gemv(alpha) => {
                let c = out(meta(0).l, meta(0).rows, 1)?;
                (bind(DeviceOp::Gemv(GemmViews { a: &v[0], b: &v[1], alpha, c: &c.view() }))?, vec![c])
            }
            &Binding::Gemm(alpha) => {
                let c = out(meta(0).l, meta(0).rows, meta(1).rows)?;
                (bind(DeviceOp::Gemm(GemmViews { a: &v[0], b: &v[1], alpha, c: &c.view() }))?, vec![c])
            }
            &Binding::Dual(alpha) => {
                let c = out(meta(0).l, meta(0).rows, meta(1).rows)?;
                let op = DeviceOp::DualGemm { a: &v[0], b1: &v[1], b2: &v[2], alpha, c: &c.view() };
                (bind(op)?, vec![c])
            }
            Binding::Grouped(alphas) => {
                let outputs: Vec<DeviceF16> =
                    (0..alphas.len()).map(|g| out(1, meta(2 * g).rows, meta(2 * g + 1).rows)).collect::<Result<_>>()?;
                let cs: Vec<F16View> = outputs.iter().map(DeviceF16::view).collect();
                let groups: Vec<GemmViews<'_>> = alphas
                    .iter()
                    .enumerate()
                    .map(|(g, &alpha)| GemmViews { a: &v[2 * g], b: &v[2 * g + 1], alpha, c: &cs[g] })
                    .collect();
                (bind(DeviceOp::GroupedGemm(&groups))?, outputs)
            }
        };
        let print_config = std::env::var("NVFP4_PRINT_CONFIG").is_ok_and(|v| v == "1");
        Ok(Prepared { bound, inputs, outputs, binding, dtype, print_config })
    }
}

/// Which operation a [`Prepared`] binds its inputs to (in order: a, b; a, b1, b2; a and b of
/// each group), with the alphas: enough to bind them again to new outputs.
#[derive(Clone)]
enum Binding {
    Gemv(Option<f32>),
    Gemm(Option<f32>),
    Dual(Option<f32>),
    Grouped(Vec<Option<f32>>),
}

/// A problem whose operands live on the device, ready to launch repeatedly.
pub struct Prepared {
    bound: BoundOp,
    /// Shared with its replicas.
    inputs: Arc<Vec<DeviceNvfp4>>,
    /// One output per group for grouped GEMM.
    outputs: Vec<DeviceF16>,
    binding: Binding,
    /// The outputs' element type.
    dtype: OutputDtype,
    print_config: bool,
}

impl Prepared {
    /// Enqueues the kernel(s) on the backend's stream; no allocation, no copy, no sync.
    pub fn launch(&mut self) -> Result<()> {
        if self.print_config {
            // Not eprintln!, which panics when stderr is closed: a lost diagnostic is no failure.
            let _ = writeln!(std::io::stderr(), "nvfp4 config: {}", self.describe());
            self.print_config = false;
        }
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
        Ok(if matches!(self.binding, Binding::Grouped(_)) {
            Output::Grouped(tensors)
        } else {
            Output::Single(tensors.remove(0))
        })
    }

    /// The launch configuration, printable.
    pub fn describe(&self) -> String {
        self.bound.describe()
    }

    /// The GEMV configuration, when this is a GEMV.
    pub fn gemv_config(&self) -> Option<&GemvConfig> {
        self.bound.gemv_config()
    }
}
