//! One device's primary context and the backend's stream on it ([`Gpu`]), its static facts, and
//! the scopes that make the context current on a thread and put the previous one back.

use std::ffi::c_int;
use std::sync::Arc;

use cudarc::driver::{result as dres, sys as dsys, CudaContext, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;

use super::driver::{cuda_err, device_count};
use super::fences::StreamFences;
use super::stream::StreamHandle;
use crate::{Error, Result};

/// Static facts about the GPU the backend runs on.
#[derive(Clone, Debug)]
pub(crate) struct DeviceInfo {
    pub name: String,
    pub compute_capability: (i32, i32),
    pub sms: u32,
    pub driver_version: i32,
}

/// One device (0 unless opened with [`Gpu::open_device`]): its primary context and the one
/// stream every launch and copy of ours goes to.
pub(crate) struct Gpu {
    stream: Arc<CudaStream>,
    fences: Arc<StreamFences>,
    info: DeviceInfo,
    ordinal: usize,
}

impl Gpu {
    /// Opens device `ordinal` (its primary context, the one PyTorch uses). Errors are typed: no
    /// driver, no GPU, an ordinal beyond the device count (`Error::Invalid` naming both), or a
    /// CUDA failure.
    pub fn open_device(ordinal: usize) -> Result<Self> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::Invalid(format!("CUDA device {ordinal} does not exist ({count} GPU(s) present)")));
        }
        // Opening binds the new context to this thread; the caller's current context (a
        // framework's notion of the current device) is put back when this returns.
        let _restore = RestoreCurrent::save(false)?;
        let ctx = CudaContext::new(ordinal).map_err(cuda_err("creating the CUDA context"))?;
        // SAFETY: the backend issues all its work (copies, memsets, launches) on the single
        // stream created below, so no cross-stream synchronization events are needed. Callers
        // that use this context from another stream must synchronize with `stream()` themselves.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(cuda_err("creating a stream"))?;
        let attr = |a| ctx.attribute(a).map_err(cuda_err("reading a device attribute"));
        let sms = attr(dsys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let compute_capability = ctx.compute_capability().map_err(cuda_err("reading the compute capability"))?;
        let name = ctx.name().map_err(cuda_err("reading the device name"))?;
        let mut driver_version: c_int = 0;
        // SAFETY: cuDriverGetVersion writes one int through a valid pointer; the driver is loaded.
        unsafe { dsys::cuDriverGetVersion(&mut driver_version) }.result().map_err(cuda_err("cuDriverGetVersion"))?;
        let fences = Arc::new(StreamFences::new(stream.clone()));
        Ok(Self { stream, fences, info: DeviceInfo { name, compute_capability, sms, driver_version }, ordinal })
    }

    /// The fences that order frees of the backend's memory after launches on other streams.
    pub fn fences(&self) -> &Arc<StreamFences> {
        &self.fences
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Makes this device's context current on the calling thread until the guard drops, which
    /// restores the thread's previous context (a framework's notion of the current device is
    /// left as it was). Inside the scope the thread's stream-capture mode is relaxed, so that
    /// what a first call does off the caller's stream (loading a module, allocating and zeroing
    /// a workspace on our own stream) is allowed while the caller's stream is being captured
    /// into a CUDA graph; launches on the caller's stream are captured as usual.
    pub fn enter(&self) -> Result<ContextScope> {
        // Restored on every path out, an error after the bind included.
        let previous = RestoreCurrent::save(true)?;
        self.stream.context().bind_to_thread().map_err(cuda_err("making the device's context current"))?;
        let mut mode = dsys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: exchanges the calling thread's capture mode through a valid pointer to a local.
        unsafe { dsys::cuThreadExchangeStreamCaptureMode(&mut mode) }
            .result()
            .map_err(cuda_err("cuThreadExchangeStreamCaptureMode"))?;
        Ok(ContextScope { _previous: previous, mode })
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Loads a CUBIN image as a module.
    pub fn load_module(&self, cubin: &[u8]) -> Result<Arc<CudaModule>> {
        self.stream.context().load_module(Ptx::from_binary(cubin.to_vec())).map_err(cuda_err("loading a module"))
    }

    /// Waits for all work on the stream.
    pub fn sync(&self) -> Result<()> {
        self.stream.synchronize().map_err(cuda_err("synchronizing the stream"))
    }

    /// The backend's own stream, as a launch target.
    pub fn stream_handle(&self) -> StreamHandle {
        StreamHandle(self.stream.cu_stream())
    }
}

/// The thread's previous CUDA context, restored on drop (see [`Gpu::enter`]).
pub struct ContextScope {
    _previous: RestoreCurrent,
    mode: dsys::CUstreamCaptureMode,
}

/// A thread's current CUDA context, made current again on drop. `exact`: also when there was
/// none (the thread is left with none: `Gpu::enter`'s scope, inside which every launch of the
/// caller's happens); otherwise a thread that had none keeps ours (opening a device: the
/// library's launches on a thread that has not entered rely on it).
pub(crate) struct RestoreCurrent {
    previous: Option<dsys::CUcontext>,
    exact: bool,
}

impl RestoreCurrent {
    fn save(exact: bool) -> Result<Self> {
        Ok(Self { previous: dres::ctx::get_current().map_err(cuda_err("cuCtxGetCurrent"))?, exact })
    }
}

impl Drop for RestoreCurrent {
    fn drop(&mut self) {
        if self.previous.is_none() && !self.exact {
            return;
        }
        // SAFETY: the previous context was the thread's current one when this was made; a
        // context stays valid while the process holds its primary-context reference (torch and
        // our `CudaContext` both do); null unbinds. A failure here leaves our context current,
        // which is harmless, so the result is ignored.
        let _ = unsafe { dres::ctx::set_current(self.previous.unwrap_or(std::ptr::null_mut())) };
    }
}

impl Drop for ContextScope {
    fn drop(&mut self) {
        // SAFETY: puts back the thread's capture mode saved by `Gpu::enter`, through a valid
        // pointer to our own field; failure cannot leave anything unsound. The context is put
        // back after this, when `_previous` drops.
        let _ = unsafe { dsys::cuThreadExchangeStreamCaptureMode(&mut self.mode) };
    }
}
