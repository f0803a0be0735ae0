//! Driver discovery: whether libcuda loads, initialising the driver and counting GPUs, and the
//! crate's error for a failed driver call.

use cudarc::driver::{result as dres, sys as dsys};

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
