//! The CUDA backend (Hopper, sm_90a). Placeholder until the runtime lands: reports no driver.

use std::sync::Arc;

use crate::format::F16Tensor;
use crate::ops::{Backend, DualGemm, Gemm, Gemv, GroupedGemm, Output, Problem};
use crate::{Error, Result};

/// True when a CUDA driver and at least one GPU are present.
pub fn is_available() -> bool {
    false
}

/// The CUDA backend: one context and stream on device 0.
pub struct CudaBackend {
    stream: Arc<cudarc::driver::CudaStream>,
}

/// A problem whose operands live on the device, ready to launch repeatedly.
pub struct Prepared {}

impl CudaBackend {
    /// Opens device 0.
    pub fn new() -> Result<Self> {
        Err(Error::NoDriver("the CUDA backend is not built yet".into()))
    }
    /// The stream every launch goes to.
    pub fn stream(&self) -> &Arc<cudarc::driver::CudaStream> {
        &self.stream
    }
    /// Device name as the driver reports it.
    pub fn device_name(&self) -> String {
        String::new()
    }
    /// Driver version string.
    pub fn driver_version(&self) -> String {
        String::new()
    }
    /// Uploads the operands of `p` and allocates its output.
    pub fn prepare(&self, _p: &Problem) -> Result<Prepared> {
        Err(Error::NoDriver("the CUDA backend is not built yet".into()))
    }
}

impl Prepared {
    /// Enqueues the kernel(s) on the backend's stream; no allocation, no copy, no sync.
    pub fn launch(&mut self) -> Result<()> {
        Ok(())
    }
    /// Fills the output with NaN so that an unwritten element fails the check.
    pub fn poison(&mut self) -> Result<()> {
        Ok(())
    }
    /// Waits for the stream and downloads the output.
    pub fn output(&self) -> Result<Output> {
        Err(Error::NoDriver("the CUDA backend is not built yet".into()))
    }
    /// The launch configuration, printable.
    pub fn describe(&self) -> String {
        String::new()
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn gemv(&self, p: &Gemv) -> Result<F16Tensor> {
        single(self.run(&Problem::Gemv(p.clone()))?)
    }
    fn gemm(&self, p: &Gemm) -> Result<F16Tensor> {
        single(self.run(&Problem::Gemm(p.clone()))?)
    }
    fn dual_gemm(&self, p: &DualGemm) -> Result<F16Tensor> {
        single(self.run(&Problem::DualGemm(p.clone()))?)
    }
    fn grouped_gemm(&self, p: &GroupedGemm) -> Result<Vec<F16Tensor>> {
        match self.run(&Problem::GroupedGemm(p.clone()))? {
            Output::Grouped(v) => Ok(v),
            Output::Single(t) => Ok(vec![t]),
        }
    }
}

impl CudaBackend {
    fn run(&self, p: &Problem) -> Result<Output> {
        let mut prep = self.prepare(p)?;
        prep.poison()?;
        prep.launch()?;
        prep.output()
    }
}

fn single(o: Output) -> Result<F16Tensor> {
    match o {
        Output::Single(t) => Ok(t),
        Output::Grouped(mut v) => Ok(v.remove(0)),
    }
}
