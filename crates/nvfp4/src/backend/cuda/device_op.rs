//! Operations on device-resident operands ([`DeviceOp`]) and an operation bound to them
//! ([`BoundOp`]): what [`CudaBackend::bind`](super::CudaBackend::bind) takes and returns.

use std::sync::Arc;

pub use super::device::GemmViews;
use super::device::{F16View, I32View, Nvfp4View};
use super::fallback::MmaLaunch;
use super::gemv::{GemvConfig, GemvLaunch};
use super::runtime::{Gpu, StreamHandle};
use super::sm90::{GroupedLaunch, Sm90Launch};
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
    Sm90(Box<Sm90Launch>),
    Grouped(Box<GroupedLaunch>),
}

/// An operation bound to device operands, output and workspace: launchable any number of times
/// with no allocation and no copy.
pub struct BoundOp {
    pub(super) gpu: Arc<Gpu>,
    pub(super) work: Work,
}

impl BoundOp {
    /// Enqueues the kernel(s) on the backend's stream.
    pub fn launch(&self) -> Result<()> {
        self.launch_on(self.gpu.stream_handle())
    }
    /// Enqueues the kernel(s) on `stream` (of the backend's context).
    pub fn launch_on(&self, stream: StreamHandle) -> Result<()> {
        match &self.work {
            Work::Gemv(w) => w.launch(&self.gpu, stream),
            Work::Mma(w) => w.launch(&self.gpu, stream),
            Work::Sm90(w) => w.launch(&self.gpu, stream),
            Work::Grouped(w) => w.launch(&self.gpu, stream),
        }
    }
    /// Lets the launch start while the previous kernel on its stream still runs (programmatic
    /// dependent launch), where the operation supports it, and says whether it does. For graphs
    /// of back-to-back launches: the kernels wait for the previous kernel before they read
    /// anything it may write (the activations) or write anything it may read; only the
    /// weights are loaded before. Supported: the Hopper skeleton's GEMM and dual GEMM.
    pub fn set_chained(&mut self, on: bool) -> bool {
        match &mut self.work {
            Work::Sm90(w) => {
                w.set_chained(on);
                true
            }
            Work::Gemv(_) | Work::Mma(_) | Work::Grouped(_) => false,
        }
    }
    /// The launch configuration, printable.
    pub fn describe(&self) -> String {
        match &self.work {
            Work::Gemv(w) => w.config.to_string(),
            Work::Mma(w) => w.config.to_string(),
            Work::Sm90(w) => w.plan.to_string(),
            Work::Grouped(w) => w.plan.to_string(),
        }
    }
    /// The GEMV configuration, when this is a GEMV.
    pub fn gemv_config(&self) -> Option<&GemvConfig> {
        match &self.work {
            Work::Gemv(w) => Some(&w.config),
            Work::Mma(_) | Work::Sm90(_) | Work::Grouped(_) => None,
        }
    }
}
