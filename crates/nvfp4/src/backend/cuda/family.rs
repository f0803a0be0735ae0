//! What every kernel family implements: its verdict on an operation (`Verdict`, from
//! the operation's metadata, the device's [`DeviceFacts`] and the overrides), the `Plan` it
//! makes, which binds itself to device operands, and the `Launch` that a bound operation holds
//! and enqueues. The router (`route.rs`) asks the families in order; nothing here depends on
//! which families exist.

use std::fmt;

use cudarc::driver::CudaFunction;

use super::device::{ActView, DeviceOp, Keep, Nvfp4View, Workspace, WorkspaceNeeds};
use super::kernels::KernelModule;
use super::overrides::Overrides;
use super::runtime::{Gpu, StreamHandle};
use crate::ops::{Act, OpMeta};
use crate::{Error, Result};

/// What the router needs to know of the device: its SMs, and how many CTAs or clusters of a
/// kernel fit (which depend on the compiled kernel: the GPU backend asks the driver; a model
/// with fixed numbers stands in for it on a machine without a GPU).
pub trait DeviceFacts {
    /// Streaming multiprocessors.
    fn sms(&self) -> usize;
    /// CTAs of `symbol` (in `module`) with `threads` threads and `smem` bytes of dynamic shared
    /// memory each that one SM holds at once.
    fn ctas_per_sm(
        &self,
        module: &'static KernelModule,
        symbol: &'static str,
        threads: u32,
        smem: usize,
    ) -> Result<usize>;
    /// Clusters of `cluster` CTAs of `symbol` (with `threads` threads and `smem` bytes each)
    /// that the GPU runs at once.
    fn clusters_fit(
        &self,
        module: &'static KernelModule,
        symbol: &'static str,
        threads: u32,
        smem: usize,
        cluster: usize,
    ) -> Result<usize>;
}

/// Device facts without a device: `sms` SMs, `ctas_per_sm` CTAs of any kernel per SM, every
/// cluster the grid asks for fitting. An H100 or H200 has 132 SMs, and 2 CTAs of the GEMV fit
/// one (`Modeled::HOPPER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Modeled {
    /// Streaming multiprocessors.
    pub sms: usize,
    /// CTAs of any kernel per SM.
    pub ctas_per_sm: usize,
}

impl Modeled {
    /// The H100 and H200 (SXM): 132 SMs.
    pub const HOPPER: Self = Self { sms: 132, ctas_per_sm: 2 };
}

impl DeviceFacts for Modeled {
    fn sms(&self) -> usize {
        self.sms
    }
    fn ctas_per_sm(&self, _: &'static KernelModule, _: &'static str, _: u32, _: usize) -> Result<usize> {
        Ok(self.ctas_per_sm)
    }
    fn clusters_fit(
        &self,
        _: &'static KernelModule,
        _: &'static str,
        _: u32,
        _: usize,
        cluster: usize,
    ) -> Result<usize> {
        Ok(self.sms / cluster.max(1))
    }
}

/// What binding needs from the backend: the device and the compiled kernels.
pub(crate) trait Kernels {
    /// The device.
    fn gpu(&self) -> &Gpu;
    /// Kernel `symbol` of `module`, compiled and loaded on first use.
    fn function(&self, module: &'static KernelModule, symbol: &str) -> Result<CudaFunction>;
}

/// A family's plan for one operation: printable, with the workspace it needs and the step that
/// binds it to device operands.
pub(crate) trait Plan: fmt::Display + Send + Sync {
    /// The family's name (as in `FAMILIES`).
    fn family(&self) -> &'static str;
    /// Scratch bytes and counters its launches need.
    fn needs(&self) -> WorkspaceNeeds;
    /// Binds the plan to `op` (the operation it was routed from) and `ws` (holding
    /// [`Plan::needs`]).
    fn bind(&self, k: &dyn Kernels, op: &DeviceOp<'_>, ws: &Workspace) -> Result<Box<dyn Launch>>;
}

/// A family's answer for one operation.
pub(crate) enum Verdict {
    /// It runs the operation with this plan.
    Takes(Box<dyn Plan>),
    /// It has a kernel for the operation but not for this one: the rule that stops it.
    Declines(String),
    /// It has no kernel for this operation.
    NotItsOp,
}

/// A kernel family as the router sees it.
pub(crate) struct Family {
    /// Its name in routes.
    pub name: &'static str,
    /// Its verdict on an operation.
    pub route: fn(&OpMeta, &dyn DeviceFacts, &Overrides) -> Result<Verdict>,
}

/// An operation bound to its operands, output and workspace by a family: enqueued any number of
/// times with no allocation and no copy.
pub(crate) trait Launch: Send + Sync {
    /// Enqueues its kernels on `stream`; `chain`: the first as a programmatic dependent of the
    /// kernel before it there, where that kernel is ready for it
    /// ([`pdl_ready`](super::kernels::pdl_ready)).
    fn enqueue(&self, gpu: &Gpu, stream: StreamHandle, chain: bool) -> Result<()>;
    /// The symbol of the first kernel it enqueues.
    fn first_symbol(&self) -> &'static str;
    /// The main kernel's symbol when the bind chose it beyond the plan (a packed weight's
    /// kernels, format/w16_pack.rs), for the bound operation's description.
    fn bound_kernel(&self) -> Option<&'static str> {
        None
    }
    /// The memory of the backend's that its kernels read (operands, outputs, workspace,
    /// descriptor tables), kept alive while it lives.
    fn keeps(&self) -> &[Keep];
}

/// The decline of a family that has kernels for NVFP4 activations only (W4A4), when `op` is
/// W4A16.
pub(crate) fn w4a4_only(op: &OpMeta) -> Option<Verdict> {
    op.dense_dtype().map(|d| Verdict::Declines(format!("no kernel for {d} activations (W4A16)")))
}

/// The NVFP4 activation of an operation bound to a W4A4 plan.
pub(crate) fn nvfp4_act<'a>(a: &ActView<'a>, family: &str) -> Result<&'a Nvfp4View> {
    match *a {
        Act::Nvfp4(v) => Ok(v),
        Act::Dense(_) => Err(Error::Invalid(format!("a {family} plan (W4A4) bound to a W4A16 operation"))),
    }
}
