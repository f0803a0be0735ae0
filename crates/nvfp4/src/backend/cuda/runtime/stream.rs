//! The handle of a stream that launches and copies are enqueued on: the backend's own, or one a
//! caller owns (a framework's current stream).

use cudarc::driver::{sys as dsys, CudaStream};

/// A stream that launches are enqueued on.
#[derive(Clone, Copy, Debug)]
pub struct StreamHandle(pub(super) dsys::CUstream);

impl StreamHandle {
    /// A stream the caller owns, e.g. PyTorch's current stream (`cuda_stream`, 0 for the legacy
    /// default stream).
    ///
    /// # Safety
    /// `raw` must be a live `CUstream` (or 0) of the context of the backend that launches on it,
    /// and stay alive until the work enqueued on it has been issued.
    pub unsafe fn from_raw(raw: u64) -> Self {
        Self(raw as usize as dsys::CUstream)
    }
    /// The handle of a stream that the borrow keeps alive while the launch is enqueued.
    pub(crate) fn borrowed(stream: &CudaStream) -> Self {
        Self(stream.cu_stream())
    }
    /// The raw handle.
    pub fn as_raw(&self) -> u64 {
        self.0 as usize as u64
    }
}

// SAFETY: a CUstream is an opaque driver handle, valid from any thread of the process.
unsafe impl Send for StreamHandle {}
// SAFETY: as above; the handle is never dereferenced on the host.
unsafe impl Sync for StreamHandle {}
