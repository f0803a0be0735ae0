//! The thin unsafe layer of the CUDA backend: driver and NVRTC discovery, the context and its
//! stream, size-checked allocation, module loading, raw launches on a given stream, TMA
//! descriptors, NVRTC compilation to a CUBIN, and the `kernel_struct!` macro that lays out kernel
//! parameter structs for Rust and CUDA from one field list.
//!
//! Everything `unsafe` in the backend lives here, one `// SAFETY:` note per block; the rest of
//! the backend (and the CLI and the tests) use only the safe functions below. This module depends
//! on nothing else in the backend.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result as dres, sys as dsys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream};
use cudarc::driver::{DevicePtr, DeviceRepr, ValidAsZeroBits};
use cudarc::nvrtc::{sys as nsys, Ptx};

use crate::{Error, Result};

/// Turns a driver error into the crate's error, naming what failed.
pub(crate) fn cuda_err(what: &str) -> impl Fn(dres::DriverError) -> Error + '_ {
    move |e| match e.0 {
        dsys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Error::OutOfMemory(format!("{what}: {e}")),
        _ => Error::Cuda(format!("{what}: {e}")),
    }
}

/// True when the CUDA driver library (libcuda) can be loaded.
pub(crate) fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library under its usual names; nothing is called.
    unsafe { dsys::is_culib_present() }
}

/// True when the NVRTC library can be loaded.
pub(crate) fn nvrtc_present() -> bool {
    // SAFETY: as above, a dlopen attempt only.
    unsafe { nsys::is_culib_present() }
}

/// Initializes the driver and counts GPUs, with typed errors; never panics without a driver.
pub(crate) fn device_count() -> Result<usize> {
    if !driver_present() {
        return Err(Error::NoDriver("libcuda.so could not be loaded (no NVIDIA driver on this machine?)".into()));
    }
    match dres::init() {
        Ok(()) => {}
        Err(e) if e.0 == dsys::CUresult::CUDA_ERROR_NO_DEVICE => return Err(Error::NoGpu),
        Err(e) => return Err(Error::NoDriver(format!("cuInit failed: {e}"))),
    }
    let n = dres::device::get_count().map_err(cuda_err("cuDeviceGetCount"))?;
    if n <= 0 {
        return Err(Error::NoGpu);
    }
    Ok(n as usize)
}

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
        let fences = Arc::new(StreamFences { own: stream.clone(), events: Mutex::new(Vec::new()) });
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

    /// Enqueues a fill of `n` u32 words at device address `addr` with `value` on `stream`.
    pub fn memset_u32(&self, addr: u64, value: u32, n: usize, stream: StreamHandle) -> Result<()> {
        // SAFETY: the caller's `addr` holds `n` u32 of device memory of this context (checked by
        // the safe callers from views and workspaces, which keep it allocated); the memset is
        // ordered on `stream`, a live stream of this context.
        unsafe { dsys::cuMemsetD32Async(addr, value, n, stream.0) }.result().map_err(cuda_err("cuMemsetD32Async"))
    }

    /// Enqueues a zero fill of `n` bytes at device address `addr` on `stream`.
    pub fn memset_zero(&self, addr: u64, n: usize, stream: StreamHandle) -> Result<()> {
        // SAFETY: as in `memset_u32`, for `n` bytes.
        unsafe { dsys::cuMemsetD8Async(addr, 0, n, stream.0) }.result().map_err(cuda_err("cuMemsetD8Async"))
    }

    /// Whether `stream` is being captured into a CUDA graph (where waiting for it is an error).
    pub fn capturing(&self, stream: StreamHandle) -> Result<bool> {
        let mut status = dsys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: queries `stream`, a live stream of this context (StreamHandle's contract), into
        // a local.
        unsafe { dsys::cuStreamIsCapturing(stream.0, &mut status) }
            .result()
            .map_err(cuda_err("cuStreamIsCapturing"))?;
        Ok(status != dsys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// The `n` u32 words at device address `addr` once the work enqueued on `stream` before this
    /// call has run: a copy on `stream`, then a wait for it.
    pub fn read_u32(&self, addr: u64, n: usize, stream: StreamHandle) -> Result<Vec<u32>> {
        let mut out = vec![0u32; n];
        // SAFETY: `addr` holds `n` u32 of device memory of this context (the safe callers pass
        // workspace and view addresses, which keep it allocated); the copy writes the `n` words
        // of `out`, which outlives it: the stream is waited for below before `out` is returned,
        // `out` is leaked if that wait fails, and a copy that failed to enqueue writes nothing.
        unsafe { dsys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), addr, n * 4, stream.0) }
            .result()
            .map_err(cuda_err("cuMemcpyDtoHAsync"))?;
        // SAFETY: waits for `stream`, a live stream of this context.
        if let Err(e) = unsafe { dsys::cuStreamSynchronize(stream.0) }.result() {
            std::mem::forget(out); // the copy may still be writing it
            return Err(cuda_err("synchronizing the stream")(e));
        }
        Ok(out)
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

    /// Copies host data to a new device buffer, size-checked first. The copy has completed when
    /// this returns, so that a launch on any stream of the context reads it.
    pub fn upload<T: DeviceRepr>(&self, data: &[T], what: &str) -> Result<CudaSlice<T>> {
        self.check_fits::<T>(data.len(), what)?;
        let buf = self.stream.clone_htod(data).map_err(cuda_err("copying to the device"))?;
        self.sync()?;
        Ok(buf)
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.stream.context().mem_get_info().map_err(cuda_err("cuMemGetInfo"))
    }

    /// Refuses `n` elements of `T` for `what` when the byte count overflows or exceeds the
    /// device's free memory (`Error::TooLarge`, before anything is allocated).
    pub fn check_fits<T>(&self, n: usize, what: &str) -> Result<()> {
        let needed = n.checked_mul(std::mem::size_of::<T>());
        let (free, _) = self.mem_info()?;
        match needed {
            Some(b) if b <= free => Ok(()),
            _ => Err(Error::TooLarge {
                what: format!("{what} on the GPU"),
                needed: needed.map_or(u64::MAX, |b| b as u64),
                available: free as u64,
            }),
        }
    }

    /// A zero-filled device buffer of `n` elements (at least one), size-checked first; zeroed
    /// when this returns, so that a launch on any stream of the context may use it.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize, what: &str) -> Result<CudaSlice<T>> {
        self.check_fits::<T>(n, what)?;
        let buf = self.stream.alloc_zeros(n.max(1)).map_err(cuda_err("allocating device memory"))?;
        self.sync()?;
        Ok(buf)
    }

    /// Copies a device buffer back to the host (waits for the stream).
    pub fn download<T: DeviceRepr + Default + Clone>(&self, buf: &CudaSlice<T>) -> Result<Vec<T>> {
        self.stream.clone_dtoh(buf).map_err(cuda_err("copying from the device"))
    }

    /// Waits for all work on the stream.
    pub fn sync(&self) -> Result<()> {
        self.stream.synchronize().map_err(cuda_err("synchronizing the stream"))
    }

    /// The raw device address of a buffer, for kernel parameter structs.
    pub fn addr<T>(&self, buf: &CudaSlice<T>) -> u64 {
        let (ptr, _guard) = buf.device_ptr(&self.stream);
        ptr
    }

    /// Enqueues a fill of `buf` with the 16-bit pattern `bits` (f16 NaN to poison outputs).
    pub fn fill_u16(&self, buf: &CudaSlice<u16>, bits: u16) -> Result<()> {
        let ptr = self.addr(buf);
        // SAFETY: `ptr` addresses `buf.len()` u16 elements of device memory owned by `buf`, which
        // outlives the enqueued memset because its free is ordered after it on this same stream.
        // The host never reads that memory through `buf`, so a shared borrow suffices.
        unsafe { dsys::cuMemsetD16Async(ptr, bits, buf.len(), self.stream.cu_stream()) }
            .result()
            .map_err(cuda_err("cuMemsetD16Async"))
    }

    /// The backend's own stream, as a launch target.
    pub fn stream_handle(&self) -> StreamHandle {
        StreamHandle(self.stream.cu_stream())
    }

    /// Sets how much dynamic shared memory `func` may take (above 48 KB needs the opt-in).
    pub fn allow_smem(&self, func: &CudaFunction, bytes: usize) -> Result<()> {
        let bytes = i32::try_from(bytes).map_err(|_| Error::Invalid(format!("{bytes} B of shared memory")))?;
        func.set_attribute(dsys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes)
            .map_err(cuda_err("setting a kernel's shared-memory size"))
    }

    /// Enqueues `func` with one by-value parameter struct on `stream`.
    pub fn launch<P: KernelParams>(
        &self,
        stream: StreamHandle,
        func: &CudaFunction,
        shape: LaunchShape,
        params: &P,
    ) -> Result<()> {
        let mut args = [params as *const P as *mut c_void];
        let (mut attrs, n) = shape.options.attributes();
        let config = launch_config(shape.grid, shape.block, shape.smem_bytes, stream.0, &mut attrs[..n]);
        // SAFETY: `KernelParams` promises that P is the `#[repr(C)]` mirror of the kernel's only
        // parameter (its CUDA declaration is generated from the same field list, with size and
        // offset asserts), so the driver copies exactly the bytes the kernel reads. The device
        // addresses inside P belong to buffers that the launch's owner keeps alive (views hold
        // their buffers; frees are ordered on the stream that allocated them). `stream` is a live
        // stream of this context (`StreamHandle` is only made from one). `config` and `attrs` are
        // live locals the driver reads during the call only.
        unsafe { dsys::cuLaunchKernelEx(&config, func.cu_function(), args.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .map_err(cuda_err("launching a kernel"))
    }

    /// How many clusters of `cluster_x` CTAs of `func` (with `block` threads and `smem_bytes` of
    /// dynamic shared memory each) the GPU runs at once.
    pub fn max_active_clusters(
        &self,
        func: &CudaFunction,
        block: (u32, u32, u32),
        smem_bytes: u32,
        cluster_x: u32,
    ) -> Result<u32> {
        let (mut attrs, n) = LaunchOptions { dependent: false, cluster_x }.attributes();
        let config = launch_config((cluster_x, 1, 1), block, smem_bytes, self.stream.cu_stream(), &mut attrs[..n]);
        let mut n: std::ffi::c_int = 0;
        // SAFETY: `n`, `config` and `attrs` are live locals the driver reads or writes during the
        // call only; `func` is a loaded kernel.
        unsafe { dsys::cuOccupancyMaxActiveClusters(&mut n, func.cu_function(), &config) }
            .result()
            .map_err(cuda_err("cuOccupancyMaxActiveClusters"))?;
        Ok(n.max(0) as u32)
    }
}

/// A stream that launches are enqueued on.
#[derive(Clone, Copy, Debug)]
pub struct StreamHandle(dsys::CUstream);

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

// SAFETY: a CUstream is an opaque driver handle, valid from any thread of the process.
unsafe impl Send for StreamHandle {}
// SAFETY: as above; the handle is never dereferenced on the host.
unsafe impl Sync for StreamHandle {}

/// Grid, block, dynamic shared memory and attributes of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchShape {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub smem_bytes: u32,
    pub options: LaunchOptions,
}

impl LaunchShape {
    /// A 1-D grid of 1-D blocks.
    pub fn linear(grid: u32, block: u32, smem_bytes: u32) -> Self {
        Self { grid: (grid, 1, 1), block: (block, 1, 1), smem_bytes, options: LaunchOptions::default() }
    }
    /// The same with `options`.
    pub fn with(self, options: LaunchOptions) -> Self {
        Self { options, ..self }
    }
}

/// Launch attributes beyond grid, block and shared memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchOptions {
    /// Programmatic dependent launch: the kernel may start while the previous kernel on the
    /// stream still runs, and must execute `griddepcontrol.wait` before it reads anything that
    /// kernel writes (the GEMM waits before loading the pre-pass's output).
    pub dependent: bool,
    /// Thread-block clusters of this many CTAs along x (0 or 1: none).
    pub cluster_x: u32,
}

impl LaunchOptions {
    /// The driver's attribute list: the first `n` entries of the array (no allocation per launch).
    fn attributes(self) -> ([dsys::CUlaunchAttribute; 2], usize) {
        let pdl = dsys::CUlaunchAttribute {
            id: dsys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: dsys::CUlaunchAttributeValue { programmaticStreamSerializationAllowed: 1 },
        };
        let cluster = dsys::CUlaunchAttribute {
            id: dsys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
            pad: [0; 4],
            value: dsys::CUlaunchAttributeValue {
                clusterDim: dsys::CUlaunchAttributeValue_union__bindgen_ty_1 { x: self.cluster_x, y: 1, z: 1 },
            },
        };
        match (self.dependent, self.cluster_x > 1) {
            (true, true) => ([pdl, cluster], 2),
            (true, false) => ([pdl, cluster], 1),
            (false, true) => ([cluster, pdl], 1),
            (false, false) => ([pdl, cluster], 0),
        }
    }
}

/// A `CUlaunchConfig` whose attribute pointer borrows `attrs` (keep it alive across the call).
fn launch_config(
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    smem_bytes: u32,
    stream: dsys::CUstream,
    attrs: &mut [dsys::CUlaunchAttribute],
) -> dsys::CUlaunchConfig {
    dsys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block.0,
        blockDimY: block.1,
        blockDimZ: block.2,
        sharedMemBytes: smem_bytes,
        hStream: stream,
        numAttrs: attrs.len() as u32,
        attrs: attrs.as_mut_ptr(),
    }
}

/// A kernel parameter struct passed by value, or an element of an array the kernel reads.
///
/// # Safety
/// Implement only for `#[repr(C)]` plain-data structs whose layout equals the kernel's struct
/// field for field: `kernel_struct!` implements it together with the CUDA declaration.
pub(crate) unsafe trait KernelParams: Copy {}

/// Declares a kernel parameter struct once for both languages: the `#[repr(C)]` Rust struct and,
/// through its `cuda_decl()`, the CUDA declaration with size and alignment `static_assert`s (written
/// into the generated header the kernels include, so a mismatch fails the NVRTC compile, which CI
/// runs). Each field gives its CUDA type, and `[n]` for an array.
macro_rules! kernel_struct {
    (
        $(#[doc = $doc:literal])*
        $vis:vis struct $name:ident $(align($align:literal))? {
            $( $(#[doc = $fdoc:literal])* $field:ident : $ty:ty => $cty:literal $([$n:literal])? ),* $(,)?
        }
    ) => {
        $(#[doc = $doc])*
        #[repr(C $(, align($align))?)]
        #[derive(Clone, Copy, Debug, Default)]
        $vis struct $name {
            $( $(#[doc = $fdoc])* pub $field: $ty, )*
        }

        // SAFETY: `#[repr(C)]` plain data (integers, floats, device addresses as u64, nested
        // kernel structs); the CUDA side is generated from the same field list by `cuda_decl`
        // and asserts this struct's size and every field's size and alignment.
        unsafe impl $crate::backend::cuda::runtime::KernelParams for $name {}
        // SAFETY: as above: plain data the device may read by value from an uploaded array.
        unsafe impl cudarc::driver::DeviceRepr for $name {}

        impl $name {
            /// The CUDA declaration of this struct, with layout asserts against this mirror.
            pub fn cuda_decl() -> String {
                let mut s = String::new();
                $( s += &format!("//{}\n", $doc); )*
                s += &format!("struct {} {{\n", stringify!($name));
                $(
                    $( s += &format!("  //{}\n", $fdoc); )*
                    s += &format!("  {} {}{};\n", $cty, stringify!($field), concat!($("[", $n, "]")?));
                )*
                s += "};\n";
                s += &format!(
                    "static_assert(sizeof({0}) == {1}, \"{0}: size differs from its Rust mirror\");\n",
                    stringify!($name), std::mem::size_of::<$name>()
                );
                // Same field order, each field's size and alignment equal, the same total size:
                // C and Rust then lay the struct out identically.
                $(
                    s += &format!(
                        "static_assert(sizeof({0}::{1}) == {2} && alignof(decltype({0}::{1})) == {3}, \"{0}.{1}: size or \
                         alignment differs from its Rust mirror\");\n",
                        stringify!($name),
                        stringify!($field),
                        std::mem::size_of::<$ty>(),
                        std::mem::align_of::<$ty>()
                    );
                )*
                s
            }
        }
    };
}
pub(crate) use kernel_struct;

// ---- TMA descriptors --------------------------------------------------------------------------

/// `CUtensorMap`: 128 opaque bytes, 64-byte aligned (the kernel's `TmaMap`); all zeros is "none".
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TmaMap(pub(crate) [u64; 16]);

/// Encodes the TMA descriptor of a `[L, rows, cols]` u8 tensor at `addr`, box
/// `[1, box_rows, box_cols]` (`cols` a multiple of 16), stored with `swizzle` in shared memory.
pub(crate) fn tma_map(
    addr: u64,
    rows: usize,
    cols: usize,
    l: usize,
    (box_rows, box_cols): (usize, usize),
    swizzle: dsys::CUtensorMapSwizzle,
) -> Result<TmaMap> {
    let row_bytes = cols as u64;
    let dims: [u64; 3] = [row_bytes, rows as u64, l as u64];
    let strides: [u64; 2] = [row_bytes, row_bytes * rows as u64]; // dims 1 and 2, in bytes
    let boxes: [u32; 3] = [box_cols as u32, box_rows as u32, 1];
    let elem_strides: [u32; 3] = [1, 1, 1];
    let mut map = dsys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: every pointer refers to a live local array of the length the rank (3) implies;
    // `addr` is a device allocation of `l * rows * k/2` bytes owned by the caller's `Prepared`
    // for as long as the descriptor is used; the driver only writes the 128-byte `map`.
    unsafe {
        dsys::cuTensorMapEncodeTiled(
            &mut map,
            dsys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            3,
            addr as *mut c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem_strides.as_ptr(),
            dsys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            dsys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            dsys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()
    .map_err(cuda_err("cuTensorMapEncodeTiled"))?;
    Ok(TmaMap(map.opaque))
}

// ---- NVRTC -----------------------------------------------------------------------------------

fn nvrtc_check(r: nsys::nvrtcResult, what: &str) -> Result<()> {
    if r == nsys::nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    // SAFETY: nvrtcGetErrorString returns a pointer to a static NUL-terminated string.
    let msg = unsafe { CStr::from_ptr(nsys::nvrtcGetErrorString(r)) }.to_string_lossy().into_owned();
    Err(Error::Cuda(format!("{what}: {msg}")))
}

fn require_nvrtc() -> Result<()> {
    if nvrtc_present() {
        Ok(())
    } else {
        Err(Error::NoNvrtc("libnvrtc.so could not be loaded".into()))
    }
}

/// The NVRTC version as (major, minor).
pub(crate) fn nvrtc_version() -> Result<(i32, i32)> {
    static VERSION: OnceLock<(i32, i32)> = OnceLock::new();
    if let Some(v) = VERSION.get() {
        return Ok(*v);
    }
    require_nvrtc()?;
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through valid pointers; the library is loadable.
    nvrtc_check(unsafe { nsys::nvrtcVersion(&mut major, &mut minor) }, "nvrtcVersion")?;
    Ok(*VERSION.get_or_init(|| (major, minor)))
}

/// What one NVRTC compilation produced.
pub(crate) struct NvrtcOutput {
    pub cubin: Vec<u8>,
    pub log: String,
}

/// Owns an nvrtcProgram and destroys it on every path.
struct Program(nsys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: self.0 came from a successful nvrtcCreateProgram and is destroyed once.
        unsafe { nsys::nvrtcDestroyProgram(&mut self.0) };
    }
}

impl Program {
    fn log(&self) -> Result<String> {
        let mut size = 0usize;
        // SAFETY: valid program; writes one usize.
        nvrtc_check(unsafe { nsys::nvrtcGetProgramLogSize(self.0, &mut size) }, "nvrtcGetProgramLogSize")?;
        let mut buf = vec![0u8; size.max(1)];
        // SAFETY: `buf` holds the `size` bytes NVRTC said the log needs.
        nvrtc_check(
            unsafe { nsys::nvrtcGetProgramLog(self.0, buf.as_mut_ptr() as *mut c_char) },
            "nvrtcGetProgramLog",
        )?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).trim_end().to_string())
    }

    fn cubin(&self) -> Result<Vec<u8>> {
        let mut size = 0usize;
        // SAFETY: valid, compiled program; writes one usize.
        nvrtc_check(unsafe { nsys::nvrtcGetCUBINSize(self.0, &mut size) }, "nvrtcGetCUBINSize")?;
        if size == 0 {
            return Err(Error::Cuda("NVRTC produced no CUBIN (was a real sm_XX architecture given?)".into()));
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds the `size` bytes NVRTC said the CUBIN needs.
        nvrtc_check(unsafe { nsys::nvrtcGetCUBIN(self.0, buf.as_mut_ptr() as *mut c_char) }, "nvrtcGetCUBIN")?;
        Ok(buf)
    }
}

fn cstring(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Invalid(format!("{what} contains a NUL byte")))
}

/// Compiles `source` (file name `name`, `#include`-able `headers` as (name, text)) with
/// `options` straight to a CUBIN. A rejected source is `Error::Compile` with NVRTC's log.
pub(crate) fn nvrtc_compile(
    name: &str,
    source: &str,
    headers: &[(&str, &str)],
    options: &[String],
) -> Result<NvrtcOutput> {
    require_nvrtc()?;
    let c_src = cstring(source, name)?;
    let c_name = cstring(name, "kernel name")?;
    let h_src: Vec<CString> = headers.iter().map(|(n, s)| cstring(s, n)).collect::<Result<_>>()?;
    let h_names: Vec<CString> = headers.iter().map(|(n, _)| cstring(n, "header name")).collect::<Result<_>>()?;
    let h_src_ptrs: Vec<*const c_char> = h_src.iter().map(|s| s.as_ptr()).collect();
    let h_name_ptrs: Vec<*const c_char> = h_names.iter().map(|s| s.as_ptr()).collect();
    let c_opts: Vec<CString> = options.iter().map(|o| cstring(o, "option")).collect::<Result<_>>()?;
    let opt_ptrs: Vec<*const c_char> = c_opts.iter().map(|s| s.as_ptr()).collect();

    let mut raw: nsys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer refers to a NUL-terminated string alive until the end of this
    // function, which outlives the program (dropped before them, declared after them).
    nvrtc_check(
        unsafe {
            nsys::nvrtcCreateProgram(
                &mut raw,
                c_src.as_ptr(),
                c_name.as_ptr(),
                headers.len() as c_int,
                h_src_ptrs.as_ptr(),
                h_name_ptrs.as_ptr(),
            )
        },
        "nvrtcCreateProgram",
    )?;
    let prog = Program(raw);
    // SAFETY: valid program; `opt_ptrs` holds options.len() valid C strings.
    let r = unsafe { nsys::nvrtcCompileProgram(prog.0, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
    let log = prog.log()?;
    if r != nsys::nvrtcResult::NVRTC_SUCCESS {
        if log.contains("libnvrtc-builtins") {
            return Err(Error::NoNvrtc(log));
        }
        return Err(Error::Compile { name: name.to_string(), log });
    }
    Ok(NvrtcOutput { cubin: prog.cubin()?, log })
}
