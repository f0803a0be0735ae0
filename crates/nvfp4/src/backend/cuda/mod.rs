//! The CUDA backend (Hopper, sm_90a): kernels compiled at run time by NVRTC, cached on disk.
//!
//! - [`runtime`]: the thin unsafe layer (driver, context, stream, launches, NVRTC).
//! - [`compile`]: kernel sources, NVRTC options, the CUBIN cache, the ptxas report.
//! - [`gemv`]: the batched GEMV's configuration heuristic and launch.
//! - [`gemm`]: the wgmma GEMM (kernels/gemm_sm90.cu): heuristic, TMA descriptors, launch.
//! - [`fallback`]: a simple tensor-core kernel for GEMM, dual GEMM and grouped GEMM.
//!
//! Environment: `NVFP4_CACHE_DIR` (CUBIN cache folder), `NVFP4_PRINT_CONFIG=1` (print each
//! prepared problem's launch configuration to stderr at its first launch).

pub mod compile;
pub mod fallback;
pub mod gemm;
pub mod gemv;
mod runtime;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaFunction, CudaModule, CudaSlice};
use half::f16;

pub use compile::{kernel_reports, kernel_reports_to, KernelReport, DEFAULT_ARCH};
pub use fallback::MmaConfig;
pub use gemm::GemmSm90Config;
pub use gemv::GemvConfig;

use self::compile::KernelModule;
use self::fallback::MmaLaunch;
use self::gemm::GemmSm90Launch;
use self::gemv::GemvLaunch;
use self::runtime::{cuda_err, Gpu};
use crate::format::F16Tensor;
use crate::ops::{Backend, DualGemm, Gemm, Gemv, GroupedGemm};
use crate::problem::{Output, Problem};
use crate::Result;

/// f16 quiet NaN: what [`Prepared::poison`] fills outputs with.
pub const F16_NAN_BITS: u16 = 0x7E00;

/// True when a CUDA driver and at least one GPU are present (checked once per process).
pub fn is_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| runtime::device_count().is_ok())
}

/// The CUDA backend: one context and stream on device 0, and the kernel modules loaded so far.
pub struct CudaBackend {
    gpu: Arc<Gpu>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
}

/// What a prepared problem launches.
enum Work {
    Gemv(Box<GemvLaunch>),
    Mma(MmaLaunch),
    Sm90(Box<GemmSm90Launch>),
}

/// A problem whose operands live on the device, ready to launch repeatedly.
pub struct Prepared {
    gpu: Arc<Gpu>,
    work: Work,
    /// Output buffers and their `[L, rows, cols]` shapes (one per group for grouped GEMM).
    outputs: Vec<(CudaSlice<u16>, [usize; 3])>,
    grouped: bool,
    print_config: bool,
}

impl CudaBackend {
    /// Opens device 0. Without a driver or GPU this is `Error::NoDriver` / `Error::NoGpu`
    /// (never a panic). NVRTC is needed only when a problem is prepared.
    pub fn new() -> Result<Self> {
        Ok(Self { gpu: Arc::new(Gpu::open()?), modules: Mutex::new(HashMap::new()) })
    }

    /// The stream every launch goes to.
    pub fn stream(&self) -> &Arc<cudarc::driver::CudaStream> {
        self.gpu.stream()
    }

    /// Device name as the driver reports it.
    pub fn device_name(&self) -> String {
        self.gpu.info().name.clone()
    }

    /// Driver version, e.g. `13.0`.
    pub fn driver_version(&self) -> String {
        let v = self.gpu.info().driver_version;
        format!("{}.{}", v / 1000, (v % 1000) / 10)
    }

    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.gpu.info().compute_capability
    }

    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.gpu.info().sms
    }

    /// The loaded module for `m`, compiled (or read from the disk cache) on first use.
    fn module(&self, m: &'static KernelModule) -> Result<Arc<CudaModule>> {
        let mut map = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(module) = map.get(m.file) {
            return Ok(module.clone());
        }
        let module = compile::load(&self.gpu, m)?;
        map.insert(m.file, module.clone());
        Ok(module)
    }

    fn function(&self, m: &'static KernelModule, symbol: &str) -> Result<CudaFunction> {
        self.module(m)?.load_function(symbol).map_err(cuda_err(symbol))
    }

    /// Uploads the operands of `p`, allocates its output(s) and picks the launch configuration.
    pub fn prepare(&self, p: &Problem) -> Result<Prepared> {
        let gpu = &self.gpu;
        let out = |l: usize, rows: usize, cols: usize| -> Result<(CudaSlice<u16>, [usize; 3])> {
            Ok((gpu.zeros::<u16>(l * rows * cols)?, [l, rows, cols]))
        };
        let (work, outputs, grouped) = match p {
            Problem::Gemv(g) => {
                let (m, _, l) = g.mkl();
                let o = out(l, m, 1)?;
                let w = GemvLaunch::prepare(gpu, g, &o.0, |sym| self.function(&compile::GEMV, sym))?;
                (Work::Gemv(Box::new(w)), vec![o], false)
            }
            Problem::Gemm(g) => {
                let (m, n, _, l) = g.mnkl();
                let o = out(l, m, n)?;
                // The wgmma kernel when it takes the shape, the general kernel otherwise.
                let work = if gemm::rejects(g).is_none() {
                    let w = GemmSm90Launch::prepare(gpu, g, &o.0, |sym| self.function(&gemm::GEMM_SM90, sym))?;
                    Work::Sm90(Box::new(w))
                } else {
                    let f = self.function(&compile::FALLBACK, fallback::GEMM_SYMBOL)?;
                    Work::Mma(MmaLaunch::gemm(gpu, g, &o.0, f)?)
                };
                (work, vec![o], false)
            }
            Problem::DualGemm(d) => {
                let (m, n, _, l) = d.mnkl();
                let o = out(l, m, n)?;
                let f = self.function(&compile::FALLBACK, fallback::DUAL_SYMBOL)?;
                (Work::Mma(MmaLaunch::dual(gpu, d, &o.0, f)?), vec![o], false)
            }
            Problem::GroupedGemm(gg) => {
                let outs: Vec<_> = gg.groups.iter().map(|g| out(1, g.a.rows(), g.b.rows())).collect::<Result<_>>()?;
                let f = self.function(&compile::FALLBACK, fallback::GEMM_SYMBOL)?;
                let refs: Vec<&CudaSlice<u16>> = outs.iter().map(|o| &o.0).collect();
                (Work::Mma(MmaLaunch::grouped(gpu, gg, &refs, f)?), outs, true)
            }
        };
        let print_config = std::env::var("NVFP4_PRINT_CONFIG").is_ok_and(|v| v == "1");
        Ok(Prepared { gpu: self.gpu.clone(), work, outputs, grouped, print_config })
    }
}

impl Prepared {
    /// Enqueues the kernel(s) on the backend's stream; no allocation, no copy, no sync.
    pub fn launch(&mut self) -> Result<()> {
        if self.print_config {
            eprintln!("nvfp4 config: {}", self.describe());
            self.print_config = false;
        }
        match &self.work {
            Work::Gemv(w) => w.launch(&self.gpu),
            Work::Mma(w) => w.launch(&self.gpu),
            Work::Sm90(w) => w.launch(&self.gpu),
        }
    }

    /// Fills the output with NaN so that an unwritten element fails the check.
    pub fn poison(&mut self) -> Result<()> {
        for (buf, _) in &mut self.outputs {
            self.gpu.fill_u16(buf, F16_NAN_BITS)?;
        }
        Ok(())
    }

    /// Waits for the stream and downloads the output.
    pub fn output(&self) -> Result<Output> {
        self.gpu.sync()?;
        let mut tensors = Vec::with_capacity(self.outputs.len());
        for (buf, [l, rows, cols]) in &self.outputs {
            let bits = self.gpu.download(buf)?;
            let data = bits.into_iter().take(l * rows * cols).map(f16::from_bits).collect();
            tensors.push(F16Tensor::new(*l, *rows, *cols, data)?);
        }
        Ok(if self.grouped { Output::Grouped(tensors) } else { Output::Single(tensors.remove(0)) })
    }

    /// The launch configuration, printable.
    pub fn describe(&self) -> String {
        match &self.work {
            Work::Gemv(w) => w.config.to_string(),
            Work::Mma(w) => w.config.to_string(),
            Work::Sm90(w) => w.config.to_string(),
        }
    }

    /// The GEMV configuration, when this is a GEMV.
    pub fn gemv_config(&self) -> Option<&GemvConfig> {
        match &self.work {
            Work::Gemv(w) => Some(&w.config),
            Work::Mma(_) | Work::Sm90(_) => None,
        }
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
