//! Problems staged on the device: host operands uploaded once, outputs allocated, the operation
//! bound; what `prepare` returns for repeated launches (the tests, `check`, the bench) and what
//! the host-data [`Backend`](crate::Backend) methods run once.

use super::backend::CudaBackend;
use super::device::{self, DeviceF16, DeviceNvfp4, F16View, Nvfp4View};
use super::device_op::{BoundOp, DeviceOp, GemmViews};
use super::gemv::GemvConfig;
use crate::format::Nvfp4Tensor;
use crate::ops::{DualGemm, Gemm, Gemv, GroupedGemm};
use crate::problem::{Output, Problem};
use crate::{Error, Result};

/// f16 quiet NaN: what [`Prepared::poison`] fills outputs with.
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
        self.stage(HostOp::try_from(p)?, false)
    }

    /// Uploads `op`'s operands, allocates its outputs and binds it: with the backend's shared
    /// workspace (`shared`, locked only while binding) or a workspace of its own.
    pub(super) fn stage(&self, op: HostOp<'_>, shared: bool) -> Result<Prepared> {
        let up = |t: &Nvfp4Tensor| self.upload(t);
        let out = |l: usize, rows: usize, cols: usize| self.alloc_output([l, rows, cols]);
        let bind = |op: DeviceOp<'_>| if shared { self.bind(op) } else { self.bind_with(op, &mut None) };
        let (bound, inputs, outputs) = match op {
            HostOp::Gemv(g) => {
                let (m, _, l) = g.mkl();
                // The kernel reads both operands in one scale layout; B is one row per batch.
                let b = if g.b.layout() == g.a.layout() { up(&g.b)? } else { up(&g.b.to_layout(g.a.layout()))? };
                let (a, c) = (up(&g.a)?, out(l, m, 1)?);
                (
                    bind(DeviceOp::Gemv(GemmViews { a: &a.view(), b: &b.view(), alpha: g.alpha, c: &c.view() }))?,
                    vec![a, b],
                    vec![c],
                )
            }
            HostOp::Gemm(g) => {
                let (m, n, _, l) = g.mnkl();
                let (a, b, c) = (up(&g.a)?, up(&g.b)?, out(l, m, n)?);
                (
                    bind(DeviceOp::Gemm(GemmViews { a: &a.view(), b: &b.view(), alpha: g.alpha, c: &c.view() }))?,
                    vec![a, b],
                    vec![c],
                )
            }
            HostOp::DualGemm(d) => {
                let (m, n, _, l) = d.mnkl();
                let (a, b1, b2, c) = (up(&d.a)?, up(&d.b1)?, up(&d.b2)?, out(l, m, n)?);
                let op =
                    DeviceOp::DualGemm { a: &a.view(), b1: &b1.view(), b2: &b2.view(), alpha: d.alpha, c: &c.view() };
                (bind(op)?, vec![a, b1, b2], vec![c])
            }
            HostOp::GroupedGemm(gg) => {
                let mut inputs = Vec::with_capacity(2 * gg.groups.len());
                let mut outputs = Vec::with_capacity(gg.groups.len());
                for g in &gg.groups {
                    inputs.extend([up(&g.a)?, up(&g.b)?]);
                    outputs.push(out(1, g.a.rows(), g.b.rows())?);
                }
                let views: Vec<(Nvfp4View, Nvfp4View, F16View)> = (0..gg.groups.len())
                    .map(|i| (inputs[2 * i].view(), inputs[2 * i + 1].view(), outputs[i].view()))
                    .collect();
                let groups: Vec<GemmViews<'_>> =
                    views.iter().zip(&gg.groups).map(|((a, b, c), g)| GemmViews { a, b, alpha: g.alpha, c }).collect();
                (bind(DeviceOp::GroupedGemm(&groups))?, inputs, outputs)
            }
        };
        let print_config = std::env::var("NVFP4_PRINT_CONFIG").is_ok_and(|v| v == "1");
        let grouped = matches!(op, HostOp::GroupedGemm(_));
        Ok(Prepared { bound, _inputs: inputs, outputs, grouped, print_config })
    }
}

/// A problem whose operands live on the device, ready to launch repeatedly.
pub struct Prepared {
    bound: BoundOp,
    _inputs: Vec<DeviceNvfp4>,
    /// One output per group for grouped GEMM.
    outputs: Vec<DeviceF16>,
    grouped: bool,
    print_config: bool,
}

impl Prepared {
    /// Enqueues the kernel(s) on the backend's stream; no allocation, no copy, no sync.
    pub fn launch(&mut self) -> Result<()> {
        if self.print_config {
            eprintln!("nvfp4 config: {}", self.describe());
            self.print_config = false;
        }
        self.bound.launch()
    }

    /// Chains each launch to the previous kernel on the stream by programmatic dependent launch
    /// where the operation supports it (see [`BoundOp::set_chained`]); returns whether it does.
    pub fn set_chained(&mut self, on: bool) -> bool {
        self.bound.set_chained(on)
    }

    /// Fills the output with NaN so that an unwritten element fails the check.
    pub fn poison(&mut self) -> Result<()> {
        for out in &self.outputs {
            device::fill_f16(&self.bound.gpu, out, F16_NAN_BITS)?;
        }
        Ok(())
    }

    /// Waits for the stream and downloads the output tensors (one per group for grouped GEMM).
    pub(super) fn output_tensors(&self) -> Result<Vec<crate::format::F16Tensor>> {
        self.outputs.iter().map(|out| device::download(&self.bound.gpu, out)).collect()
    }

    /// Waits for the stream and downloads the output.
    pub fn output(&self) -> Result<Output> {
        let mut tensors = self.output_tensors()?;
        Ok(if self.grouped { Output::Grouped(tensors) } else { Output::Single(tensors.remove(0)) })
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
