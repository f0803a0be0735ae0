//! Opening a device for the benchmark when the CUDA backend cannot lend its stream, device facts
//! (name, driver, L2 size), and the mapping of CUDA errors onto the crate's [`Error`].

use std::sync::Arc;

use cudarc::driver::sys::{cudaError_enum, CUdevice_attribute};
use cudarc::driver::{CudaContext, CudaStream, DriverError};

use crate::{Error, Result};

/// Maps a driver error onto [`Error`], naming what was being done.
pub(crate) fn driver_err(what: &str) -> impl FnOnce(DriverError) -> Error + '_ {
    move |e| match e.0 {
        cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => Error::OutOfMemory(what.to_string()),
        cudaError_enum::CUDA_ERROR_NO_DEVICE => Error::NoGpu,
        _ => Error::Cuda(format!("{what}: {e:?}")),
    }
}

/// True when the CUDA driver library can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library by its usual names; no CUDA call is made.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// True when the cuBLASLt library can be loaded (the peer needs it).
pub fn cublaslt_present() -> bool {
    // SAFETY: only tries to dlopen libcublasLt by its usual names; no cuBLAS call is made.
    unsafe { cudarc::cublaslt::sys::is_culib_present() }
}

/// Opens device 0 and a fresh stream on it: a typed error, never a panic, without a driver or GPU.
pub fn open_stream() -> Result<Arc<CudaStream>> {
    if !driver_present() {
        return Err(Error::NoDriver("libcuda.so could not be loaded".into()));
    }
    let count = CudaContext::device_count().map_err(driver_err("counting devices"))?;
    if count < 1 {
        return Err(Error::NoGpu);
    }
    let ctx = CudaContext::new(0).map_err(driver_err("opening device 0"))?;
    ctx.new_stream().map_err(driver_err("creating a stream"))
}

/// The device's name as the driver reports it.
pub fn device_name(stream: &CudaStream) -> Result<String> {
    stream.context().name().map_err(driver_err("reading the device name"))
}

/// The CUDA version the driver supports, e.g. `13.0` (as `CudaBackend::driver_version` writes it).
pub fn driver_version() -> Result<String> {
    if !driver_present() {
        return Err(Error::NoDriver("libcuda.so could not be loaded".into()));
    }
    let mut v: core::ffi::c_int = 0;
    // SAFETY: cuDriverGetVersion writes one int through a valid pointer and needs no context.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }
        .result()
        .map_err(driver_err("reading the driver version"))?;
    Ok(format!("{}.{}", v / 1000, (v % 1000) / 10))
}

/// The L2 cache size in bytes.
pub fn l2_bytes(stream: &CudaStream) -> Result<usize> {
    let b = stream
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
        .map_err(driver_err("reading the L2 size"))?;
    usize::try_from(b).ok().filter(|&b| b > 0).ok_or_else(|| Error::Cuda(format!("device reports an L2 of {b} bytes")))
}
