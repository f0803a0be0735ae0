//! Ordering the frees of the backend's memory after launches on other streams, and whether a
//! stream is capturing a CUDA graph.

use std::sync::{Arc, Mutex};

use cudarc::driver::{result as dres, sys as dsys, CudaStream};

use super::driver::cuda_err;
use super::stream::StreamHandle;
use crate::{Error, Result};

/// Orders the frees of the backend's memory after the launches on other streams that read it.
///
/// The backend allocates on its own stream and frees there (stream-ordered, asynchronously), but
/// launches may go to any stream of the context. Each launch on another stream that reads
/// memory of ours records that stream's event after it ([`StreamFences::record`]); before such
/// memory is freed, the backend's stream waits for the latest record of every stream it was
/// read on ([`StreamFences::order_frees_after`]). One event per stream, re-recorded: waiting on
/// a later record than needed only delays a free.
pub(crate) struct StreamFences {
    own: Arc<CudaStream>,
    events: Mutex<Vec<(u64, dsys::CUevent)>>,
}

/// Whether a stream is recording a CUDA graph, which launches on it join instead of running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Capture {
    /// Launches run.
    None,
    /// Launches are captured: the graph keeps their parameters, and the addresses in them, for
    /// as long as it lives.
    Active,
}
impl StreamFences {
    /// The fences of `own`, the backend's stream; no stream recorded yet.
    pub(super) fn new(own: Arc<CudaStream>) -> Self {
        Self { own, events: Mutex::new(Vec::new()) }
    }

    /// True when `stream` is the backend's own stream, whose order every free already follows.
    pub fn is_own(&self, stream: StreamHandle) -> bool {
        stream.0 == self.own.cu_stream()
    }

    /// Whether `stream` is capturing. An invalidated capture is an error.
    pub fn capture(&self, stream: StreamHandle) -> Result<Capture> {
        // SAFETY: `stream` is a live stream of this context (`StreamHandle`'s contract).
        match unsafe { dres::stream::is_capturing(stream.0) }.map_err(cuda_err("cuStreamIsCapturing"))? {
            dsys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Ok(Capture::None),
            dsys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => Ok(Capture::Active),
            other => Err(Error::Cuda(format!("the launch stream's capture is {other:?}"))),
        }
    }

    /// Records `stream`'s event after the work enqueued there so far (a launch that read our
    /// memory). `stream` must not be capturing.
    pub fn record(&self, stream: StreamHandle) -> Result<()> {
        let key = stream.as_raw();
        let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let event = match events.iter().find(|(s, _)| *s == key) {
            Some(&(_, e)) => e,
            None => {
                let e = dres::event::create(dsys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                    .map_err(cuda_err("cuEventCreate"))?;
                events.push((key, e));
                e
            }
        };
        // SAFETY: `event` is a live event of this context (destroyed only with `self`); `stream`
        // is a live, non-capturing stream of the context (`StreamHandle`'s contract, checked by
        // the caller).
        unsafe { dres::event::record(event, stream.0) }.map_err(cuda_err("cuEventRecord"))
    }

    /// Makes the backend's stream wait for the latest record of each stream in `streams`, so
    /// that frees enqueued there afterwards follow every launch recorded so far. Errors are
    /// ignored (a drop path): the wait then is missing, as it was before this existed.
    pub fn order_frees_after(&self, streams: &[u64]) {
        let events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        for &(_, e) in events.iter().filter(|(s, _)| streams.contains(s)) {
            // SAFETY: `e` is a live event of this context, recorded at least once on stream `s`
            // (it is only created in `record`, which records it); the backend's stream is alive
            // (held by `self`).
            let _ = unsafe {
                dres::stream::wait_event(self.own.cu_stream(), e, dsys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
            };
        }
    }
}

impl Drop for StreamFences {
    fn drop(&mut self) {
        for &(_, e) in self.events.get_mut().unwrap_or_else(|e| e.into_inner()).iter() {
            // SAFETY: each event was created by `record` and is destroyed once, here; a pending
            // record or wait keeps the driver's copy alive until it completes.
            let _ = unsafe { dres::event::destroy(e) };
        }
    }
}

// SAFETY: CUevent handles are opaque driver handles, valid from any thread of the process; the
// list is behind a mutex.
unsafe impl Send for StreamFences {}
// SAFETY: as above.
unsafe impl Sync for StreamFences {}
