//! Operations on device-resident operands ([`DeviceOp`]) and an operation bound to them
//! ([`BoundOp`]): what [`CudaBackend::bind`](super::CudaBackend::bind) takes and returns.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub use super::device::GemmViews;
use super::device::{F16View, I32View, Keep, Nvfp4View};
use super::fallback::MmaLaunch;
use super::gemv::{GemvConfig, GemvLaunch};
use super::kernels::{grouped::PREPARE_SYMBOL, pdl_ready, sm90::DECODE_X_SYMBOL};
use super::runtime::{Capture, Gpu, StreamHandle};
use super::sm90::{GroupedLaunch, Sm90Launch};
use super::small::{SmallLaunch, SMALL_SYMBOL};
use crate::Result;

/// One operation on device operands.
pub enum DeviceOp<'a> {
    /// Batched GEMV (B has one row per batch; both operands in one scale layout).
    Gemv(GemmViews<'a>),
    /// GEMM.
    Gemm(GemmViews<'a>),
    /// Gated dual GEMM: `c = f16(silu(A·B1ᵀ) * (A·B2ᵀ))`, alpha applied to each product.
    DualGemm {
        /// `[L, M, K]`.
        a: &'a Nvfp4View,
        /// `[L, N, K]`, the gate weight.
        b1: &'a Nvfp4View,
        /// `[L, N, K]`, the up weight.
        b2: &'a Nvfp4View,
        /// The optional FP32 factor of each product.
        alpha: Option<f32>,
        /// `[L, M, N]` f16 output.
        c: &'a F16View,
    },
    /// Grouped GEMM: every group in one launch (L = 1 each).
    GroupedGemm(&'a [GemmViews<'a>]),
    /// The MoE form of the grouped GEMM: tokens `[1, T, K]` sorted by expert, every expert's
    /// weights in one `[E, N, K]` tensor, `offsets[e]` the end row (exclusive) of expert e's
    /// tokens, in device memory (never read by the host), output `[1, T, N]`. Rows at or past
    /// `offsets[E - 1]` are not written; offsets are clamped into `[0, T]`.
    MoeGemm {
        /// The tokens.
        a: &'a Nvfp4View,
        /// The experts' weights.
        b: &'a Nvfp4View,
        /// E end rows, non-decreasing.
        offsets: &'a I32View,
        /// The optional FP32 factor before the final rounding.
        alpha: Option<f32>,
        /// The output.
        c: &'a F16View,
    },
}

/// What a bound operation launches.
pub(super) enum Work {
    Gemv(Box<GemvLaunch>),
    Mma(MmaLaunch),
    Small(SmallLaunch),
    Sm90(Box<Sm90Launch>),
    Grouped(Box<GroupedLaunch>),
}

impl Work {
    /// The memory its launches read that the backend owns (operands, outputs, workspace,
    /// descriptor tables).
    fn keeps(&self) -> &[Keep] {
        match self {
            Work::Gemv(w) => &w.keep,
            Work::Mma(w) => &w.keep,
            Work::Small(w) => &w.keep,
            Work::Sm90(w) => &w.keep,
            Work::Grouped(w) => &w.keep,
        }
    }
}

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
    pub(super) work: Work,
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
    /// True when [`BoundOp::launch_chained_on`] launches the first kernel as a programmatic
    /// dependent (its kernel is in [`PDL_READY`](super::kernels::PDL_READY)).
    pub fn chains(&self) -> bool {
        pdl_ready(self.first_symbol())
    }
    /// True when a launch of it on a stream other than the backend's own was captured into a
    /// CUDA graph, which may read its memory for as long as the graph lives.
    pub fn captured(&self) -> bool {
        self.captured.load(Ordering::Relaxed)
    }
    fn enqueue(&self, stream: StreamHandle, chain: bool) -> Result<()> {
        match &self.work {
            Work::Gemv(w) => w.launch(&self.gpu, stream, chain),
            Work::Mma(w) => w.launch(&self.gpu, stream, chain),
            Work::Small(w) => w.launch(&self.gpu, stream, chain),
            Work::Sm90(w) => w.launch(&self.gpu, stream, chain),
            Work::Grouped(w) => w.launch(&self.gpu, stream, chain),
        }?;
        if note_reads(&self.gpu, stream, self.work.keeps())? == Capture::Active {
            self.captured.store(true, Ordering::Relaxed);
        }
        Ok(())
    }
    /// The symbol of the first kernel a launch enqueues.
    fn first_symbol(&self) -> &'static str {
        match &self.work {
            Work::Gemv(w) => w.config.symbol,
            Work::Mma(w) => w.config.symbol,
            Work::Small(_) => SMALL_SYMBOL,
            Work::Sm90(_) => DECODE_X_SYMBOL,
            Work::Grouped(_) => PREPARE_SYMBOL,
        }
    }
    /// The launch configuration, printable.
    pub fn describe(&self) -> String {
        match &self.work {
            Work::Gemv(w) => w.config.to_string(),
            Work::Mma(w) => w.config.to_string(),
            Work::Small(w) => w.config.to_string(),
            Work::Sm90(w) => w.plan.to_string(),
            Work::Grouped(w) => w.plan.to_string(),
        }
    }
    /// The GEMV configuration, when this is a GEMV.
    pub fn gemv_config(&self) -> Option<&GemvConfig> {
        match &self.work {
            Work::Gemv(w) => Some(&w.config),
            Work::Mma(_) | Work::Small(_) | Work::Sm90(_) | Work::Grouped(_) => None,
        }
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
