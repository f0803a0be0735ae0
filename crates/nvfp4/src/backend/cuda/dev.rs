//! Hooks for the development diagnostics (examples/dev_*), hidden from the documentation: kernels
//! of modules compiled outside the registry (a library kernel's source with other `#define`s or
//! edits, a diagnostic's own streaming reads) launched through the library's bind and launch
//! path with the library's parameter structs, so that the examples carry no copy of a struct and
//! no raw launch.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule};

use super::backend::CudaBackend;
use super::compile;
use super::device::{F16View, Nvfp4View, Workspace};
use super::family::Launch;
use super::floors::{read_params, whole_warps, ReadSource, ReadSums};
use super::gemv::{self, GemvConfig, THREADS};
use super::gemv_launch::GemvLaunch;
use super::kernels::KernelModule;
use super::runtime::{cuda_err, Gpu, LaunchShape};
use crate::{Error, Result};

/// A module compiled from a caller's source against the library's headers (generated.cuh, with
/// every parameter struct, included), loaded on the backend's device. Not cached: variants of one
/// kernel share its file name.
pub struct DevModule {
    gpu: Arc<Gpu>,
    module: Arc<CudaModule>,
}

impl CudaBackend {
    /// Compiles `module` for this GPU and loads it; NVRTC's log comes beside it.
    ///
    /// # Safety
    /// The library passes its parameter structs by value to the kernels taken from the module:
    /// each kernel taken by [`DevModule::gemv`] must take `GemvParams` as its only parameter, and
    /// each one taken by [`DevModule::read`] `FloorReadParams` (kernels/gemv.cu with other
    /// `#define`s keeps this, as does a kernel declared with a struct of generated.cuh).
    pub unsafe fn dev_module(&self, module: &KernelModule) -> Result<(DevModule, String)> {
        let arch = compile::arch_for(self.compute_capability())?;
        let (cubin, log) = compile::compile(module, &arch, false)?;
        let loaded = self.gpu().load_module(&cubin)?;
        Ok((DevModule { gpu: self.gpu().clone(), module: loaded }, log))
    }
}

impl DevModule {
    fn function(&self, symbol: &str) -> Result<CudaFunction> {
        self.module.load_function(symbol).map_err(cuda_err(symbol))
    }

    /// Its GEMV kernel `symbol` (a variant of kernels/gemv.cu's, see [`CudaBackend::dev_module`]).
    pub fn gemv(&self, symbol: &str) -> Result<DevGemv> {
        Ok(DevGemv { gpu: self.gpu.clone(), func: self.function(symbol)? })
    }

    /// Its streaming-read kernel `symbol`, which reads as kernels/floors.cu's reads do (see
    /// [`CudaBackend::dev_module`]).
    pub fn read(&self, symbol: &str) -> Result<DevRead> {
        Ok(DevRead { gpu: self.gpu.clone(), func: self.function(symbol)? })
    }
}

/// A GEMV kernel of a [`DevModule`], configured and bound as the library's own GEMV.
pub struct DevGemv {
    gpu: Arc<Gpu>,
    func: CudaFunction,
}

impl DevGemv {
    /// Resident CTAs per SM with `smem_bytes` of dynamic shared memory: the occupancy
    /// [`GemvConfig::choose`] asks for.
    pub fn ctas_per_sm(&self, smem_bytes: usize) -> Result<usize> {
        let n = self.func.occupancy_max_active_blocks_per_multiprocessor(THREADS, smem_bytes, None);
        Ok(n.map_err(cuda_err("cuOccupancyMaxActiveBlocksPerMultiprocessor"))? as usize)
    }

    /// Binds `config` to A `[L, M, K]`, B `[L, 1, K]`, alpha and the output `[L, M, 1]`, with a
    /// workspace of the config's size of its own.
    pub fn bind(
        &self,
        config: GemvConfig,
        (a, b): (&Nvfp4View, &Nvfp4View),
        alpha: Option<f32>,
        c: &F16View,
    ) -> Result<DevGemvLaunch> {
        let ws = Workspace::new(&self.gpu, config.scratch())?;
        let launch = gemv::bind(&self.gpu, &config, self.func.clone(), (a, b), alpha, c, &ws)?;
        Ok(DevGemvLaunch { gpu: self.gpu.clone(), launch })
    }
}

/// A bound [`DevGemv`]: its parameters hold its operands, output and workspace alive.
pub struct DevGemvLaunch {
    gpu: Arc<Gpu>,
    launch: GemvLaunch,
}

impl DevGemvLaunch {
    /// Enqueues it on the backend's stream; `pdl`: as a programmatic dependent of the previous
    /// kernel there (every GEMV symbol is ready for it, `kernels::PDL_READY_MODULES`).
    pub fn launch(&self, pdl: bool) -> Result<()> {
        self.launch.enqueue(&self.gpu, self.gpu.stream_handle(), pdl)
    }
}

/// A streaming-read kernel of a [`DevModule`].
pub struct DevRead {
    gpu: Arc<Gpu>,
    func: CudaFunction,
}

impl DevRead {
    /// Enqueues one read of all of `src` by `grid` CTAs of `threads` (whole warps), one sum per
    /// CTA into `sums`, on the backend's stream.
    pub fn launch(&self, grid: u32, threads: u32, src: &ReadSource, sums: &ReadSums) -> Result<()> {
        if grid == 0 || grid as usize > sums.ctas() || !whole_warps(threads) {
            return Err(Error::Invalid(format!("streaming read grid {grid} x {threads} ({} sums)", sums.ctas())));
        }
        let params = read_params(&self.gpu, src, sums);
        self.gpu.launch(self.gpu.stream_handle(), &self.func, LaunchShape::linear(grid, threads, 0), &params)
    }
}

/// The view `t` with its packed values read from `out`'s memory instead (as many bytes): a launch
/// that consumes an earlier launch's output as an operand (the GEMV's PDL dependency check).
pub fn with_values_from(t: Nvfp4View, out: &F16View) -> Result<Nvfp4View> {
    t.with_values_from(out)
}
