//! An operation bound to device operands ([`BoundOp`]): what
//! [`CudaBackend::bind`](super::CudaBackend::bind) returns for a [`DeviceOp`](super::DeviceOp),
//! holding its route and the family's [`Launch`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::device::Keep;
use super::family::Launch;
use super::kernels::{pdl_ready, pdl_safe};
use super::route::Route;
use super::runtime::{Capture, Gpu, StreamHandle};
use crate::Result;

/// An operation bound to device operands, output and workspace: launchable any number of times,
/// on any stream of the backend's context, with no allocation and no copy.
///
/// What it reads of the backend's own memory (uploaded operands, outputs, workspaces, its
/// descriptor tables) stays allocated while it lives, and when it is dropped that memory is
/// freed only after every launch made so far, on any stream, has completed. A launch captured
/// into a CUDA graph is the exception, since no one here knows how long the graph lives: keep
/// the operation until the graph is no longer launched ([`BoundOp::captured`] tells whether a
/// launch was captured).
pub struct BoundOp {
    pub(super) gpu: Arc<Gpu>,
    pub(super) route: Route,
    pub(super) launch: Box<dyn Launch>,
    pub(super) captured: AtomicBool,
}

impl BoundOp {
    /// Enqueues the kernel(s) on the backend's stream.
    pub fn launch(&self) -> Result<()> {
        self.launch_on(self.gpu.stream_handle())
    }
    /// Enqueues the kernel(s) on `stream` (of the backend's context).
    pub fn launch_on(&self, stream: StreamHandle) -> Result<()> {
        self.enqueue(stream, false)
    }
    /// Enqueues the kernel(s) on a stream of the backend's context (one of another context is a
    /// CUDA error).
    pub fn launch_on_stream(&self, stream: &cudarc::driver::CudaStream) -> Result<()> {
        self.enqueue(StreamHandle::borrowed(stream), false)
    }
    /// Enqueues the kernel(s) on `stream`, the first as a programmatic dependent of the kernel
    /// before it there when that kernel is ready for it ([`BoundOp::chains`]): it may start
    /// while the previous one finishes. A plain launch where it is not.
    pub fn launch_chained_on(&self, stream: StreamHandle) -> Result<()> {
        self.enqueue(stream, true)
    }
    /// [`BoundOp::launch_chained_on`] a stream of the backend's context, borrowed for the call.
    pub fn launch_chained_on_stream(&self, stream: &cudarc::driver::CudaStream) -> Result<()> {
        self.enqueue(StreamHandle::borrowed(stream), true)
    }
    /// True when [`BoundOp::launch_chained_on`] launches the first kernel as a programmatic
    /// dependent (its kernel is in [`PDL_READY`](super::kernels::PDL_READY)).
    pub fn chains(&self) -> bool {
        pdl_ready(self.launch.first_symbol())
    }
    /// True when its first kernel reads nothing before its wait ([`pdl_safe`]): then
    /// [`BoundOp::launch_chained_on`] is safe on a stream whose previous kernel is anyone's,
    /// whatever it wrote (a framework's kernels, a weight load, a pack).
    pub fn chains_safely(&self) -> bool {
        pdl_safe(self.launch.first_symbol())
    }
    /// True when a launch of it on a stream other than the backend's own was captured into a
    /// CUDA graph, which may read its memory for as long as the graph lives.
    pub fn captured(&self) -> bool {
        self.captured.load(Ordering::Relaxed)
    }
    fn enqueue(&self, stream: StreamHandle, chain: bool) -> Result<()> {
        self.launch.enqueue(&self.gpu, stream, chain)?;
        if note_reads(&self.gpu, stream, self.launch.keeps())? == Capture::Active {
            self.captured.store(true, Ordering::Relaxed);
        }
        Ok(())
    }
    /// The launch configuration, printable (the plan of its route).
    pub fn describe(&self) -> String {
        match self.launch.bound_kernel() {
            Some(k) => format!("{}, packed W: {k}", self.route.plan()),
            None => self.route.plan(),
        }
    }
    /// Its route: the family, the plan, and why the families before it declined.
    pub fn route(&self) -> &Route {
        &self.route
    }
}

/// Notes that the kernels just enqueued on `stream` read `keeps`, so that their memory is freed
/// after those kernels ([`Owned`](super::device::Owned)); returns whether `stream` is capturing.
/// Nothing to note on the backend's own stream, whose order every free follows.
/// Memory kept for the process needs no note (a binding's workspaces: the common case costs no
/// driver call).
pub(super) fn note_reads(gpu: &Gpu, stream: StreamHandle, keeps: &[Keep]) -> Result<Capture> {
    let fences = gpu.fences();
    if keeps.iter().all(|k| k.for_process()) || fences.is_own(stream) {
        return Ok(Capture::None);
    }
    let capture = fences.capture(stream)?;
    if capture == Capture::None {
        fences.record(stream)?;
        for k in keeps.iter().filter(|k| !k.for_process()) {
            k.read_on(stream);
        }
    }
    Ok(capture)
}
