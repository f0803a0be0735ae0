//! The CUDA backend object: device 0's context and stream, the kernel modules loaded so far, a
//! shared workspace, upload and download of operands, and the choice of kernel family and plan
//! for each operation on device operands (bind).

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaFunction, CudaModule};

use super::compile;
use super::device::{
    self, DeviceF16, DeviceNvfp4, DeviceOp, F32View, I32View, Nvfp4View, Value, ValuesView, Workspace, WorkspaceNeeds,
};
use super::device_op::{self, BoundOp};
use super::family::{DeviceFacts, Kernels};
use super::kernels::{self, KernelModule};
use super::overrides::Overrides;
use super::quantize::{self, DenseView, GlobalSource, QuantOut, QuantizeKernels, ScalarView};
use super::route::{self, Route};
use super::runtime::{cuda_err, ContextScope, Gpu, StreamHandle};
use crate::format::{F16Tensor, Nvfp4Tensor, OutTensor, OutputDtype};
use crate::ops::OpMeta;
use crate::{Error, Result};

/// The CUDA backend: device 0's primary context and a stream, the kernel modules loaded so far,
/// and a workspace reused by the launches [`CudaBackend::bind`] makes.
pub struct CudaBackend {
    gpu: Arc<Gpu>,
    modules: Arc<Mutex<HashMap<&'static str, Arc<CudaModule>>>>,
    workspace: Arc<Mutex<Option<Workspace>>>,
    overrides: Overrides,
}

impl CudaBackend {
    /// Opens device 0. Without a driver or GPU this is `Error::NoDriver` / `Error::NoGpu`
    /// (never a panic). NVRTC is needed only when a problem is bound.
    pub fn new() -> Result<Self> {
        Self::on_device(0)
    }

    /// Opens device `ordinal` (its primary context: the one PyTorch uses for that device).
    pub fn on_device(ordinal: usize) -> Result<Self> {
        let gpu = Arc::new(Gpu::open_device(ordinal)?);
        Ok(Self { gpu, modules: Arc::default(), workspace: Arc::default(), overrides: Overrides::NONE })
    }

    /// The same backend (device, loaded kernels, shared workspace) routing under `overrides`:
    /// forced configurations, the route printout ([`Overrides::from_env`] reads what the
    /// environment asks for; a program does that once, where it starts).
    pub fn with_overrides(&self, overrides: Overrides) -> Self {
        Self { gpu: self.gpu.clone(), modules: self.modules.clone(), workspace: self.workspace.clone(), overrides }
    }

    /// The overrides it routes under.
    pub fn overrides(&self) -> &Overrides {
        &self.overrides
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.gpu.ordinal()
    }

    /// Makes the device's context current on this thread until the scope drops (which restores
    /// the previous one): for launches on a caller's stream from a thread whose current context
    /// may be another device's.
    pub fn enter(&self) -> Result<ContextScope> {
        self.gpu.enter()
    }

    /// Waits for the backend's own stream (where workspaces are allocated and zeroed): callers
    /// that launch on their own streams do this once after a workspace was created or grown.
    pub fn sync(&self) -> Result<()> {
        self.gpu.sync()
    }

    /// Enqueues the quantization of `x` into `out` (its layout) and the global scale used into
    /// `global_out`, on `stream`; `ws` as in [`CudaBackend::bind_with`]. A block holding a NaN or
    /// an infinity gets the E4M3 NaN scale (docs/FORMAT.md §1; no host synchronization).
    pub fn quantize_on(
        &self,
        x: &DenseView,
        out: &Nvfp4View,
        global: GlobalSource<'_>,
        global_out: &ScalarView,
        ws: &mut Option<Workspace>,
        stream: StreamHandle,
    ) -> Result<()> {
        self.quantize_with(x, QuantOut::Nvfp4(out), global, global_out, ws, stream, false)
    }

    /// [`CudaBackend::quantize_on`], then waits for `stream` and refuses a NaN or an infinity
    /// in `x` (`Error::NonFinite`, the first) or a device global scale that is not finite and
    /// positive (`Error::Invalid`); the outputs are written as by `quantize_on` either way.
    /// Refused while `stream` is being captured into a CUDA graph.
    pub fn quantize_checked_on(
        &self,
        x: &DenseView,
        out: &Nvfp4View,
        global: GlobalSource<'_>,
        global_out: &ScalarView,
        ws: &mut Option<Workspace>,
        stream: StreamHandle,
    ) -> Result<()> {
        self.quantize_with(x, QuantOut::Nvfp4(out), global, global_out, ws, stream, true)
    }

    /// Enqueues the quantization of `x` as [`CudaBackend::quantize_on`] does, but writes each
    /// quantized element back as its value without the global scale (e2m1 * e4m3, exact) into
    /// `out`: x's shape in [`DenseType::dequant_type`](super::DenseType::dequant_type) (bf16, f16
    /// for f16 input). A W4A16 GEMM of `out` with alpha = the global scale * the weight's global
    /// scale computes the W4A4 GEMM of x's quantization (SPEC §3, §8), on the W4A16 kernels and
    /// the weight's packed form. Launched as a programmatic dependent that lets its own dependent
    /// start first: a kernel chained after it may start while the kernel before it still runs,
    /// so chain after it only operations whose first kernel reads nothing before its wait
    /// ([`BoundOp::chains_safely`](super::BoundOp::chains_safely): the W4A16 GEMMs; not the W4A4
    /// GEMM, whose main kernel reads W after its pre-pass's trigger). A block holding a NaN or an
    /// infinity is 16 NaNs, as its E4M3 NaN scale would make every product of the W4A4 GEMM.
    pub fn quantize_dequant_on(
        &self,
        x: &DenseView,
        out: &DenseView,
        global: GlobalSource<'_>,
        global_out: &ScalarView,
        ws: &mut Option<Workspace>,
        stream: StreamHandle,
    ) -> Result<()> {
        self.quantize_with(x, QuantOut::Dequant(out), global, global_out, ws, stream, false)
    }

    #[allow(clippy::too_many_arguments)]
    fn quantize_with(
        &self,
        x: &DenseView,
        out: QuantOut<'_>,
        global: GlobalSource<'_>,
        global_out: &ScalarView,
        ws: &mut Option<Workspace>,
        stream: StreamHandle,
        check: bool,
    ) -> Result<()> {
        let (amax, quant) = x.dtype.symbols();
        let quant = if matches!(out, QuantOut::Dequant(_)) { x.dtype.dequant_symbol() } else { quant };
        let k = QuantizeKernels {
            amax: self.function(&kernels::quantize::QUANTIZE, amax)?,
            quantize: self.function(&kernels::quantize::QUANTIZE, quant)?,
        };
        let w = grown(&self.gpu, ws, quantize::needs())?;
        quantize::launch(&self.gpu, &k, x, out, global, global_out, &w, stream, check)?;
        // The workspace outlives these kernels even if a later call replaces it.
        device_op::note_reads(&self.gpu, stream, &[w.keep()])?;
        if check {
            quantize::verify(&self.gpu, x, global, &w, stream)?;
        }
        Ok(())
    }

    /// Enqueues a zero fill of `bytes` bytes at device address `addr` on `stream` (one driver
    /// memset: a framework's own zero fill costs a dispatch and a kernel launch more).
    ///
    /// # Safety
    /// `addr` must hold `bytes` bytes of device memory of this backend's device that stay
    /// allocated until the fill has run on `stream`, a live stream of this device's context.
    pub unsafe fn zero_raw(&self, addr: u64, bytes: usize, stream: StreamHandle) -> Result<()> {
        self.gpu.memset_zero(addr, bytes, stream)
    }

    /// The device (for the backend's sibling modules).
    pub(super) fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The backend's stream.
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

    pub(super) fn function(&self, m: &'static KernelModule, symbol: &str) -> Result<CudaFunction> {
        self.module(m)?.load_function(symbol).map_err(cuda_err(symbol))
    }

    /// Copies a host tensor to the device (the only path for host operand data), size-checked
    /// against the GPU's free memory.
    pub fn upload(&self, t: &Nvfp4Tensor) -> Result<DeviceNvfp4> {
        device::upload(&self.gpu, t)
    }

    /// Uploads a host 16-bit tensor (a W4A16 activation), size-checked.
    pub fn upload_dense(&self, t: &OutTensor) -> Result<DeviceF16> {
        device::upload_dense(&self.gpu, t)
    }

    /// Copies i32 values (a MoE launch's expert offsets) to the device.
    pub fn upload_i32(&self, values: &[i32]) -> Result<I32View> {
        device::upload_values(&self.gpu, values)
    }

    /// Copies f32 values (a MoE launch's per-expert alphas) to the device.
    pub fn upload_f32(&self, values: &[f32]) -> Result<F32View> {
        device::upload_values(&self.gpu, values)
    }

    /// Overwrites the device values `view` describes (a MoE launch's offsets or per-expert
    /// alphas) with `values`, as many as it holds: a copy on the backend's stream, waited for.
    /// Operations bound to the view read the new values from their next launch on (a captured
    /// CUDA graph from its next replay), with no new bind; a launch still running on another
    /// stream may read either.
    pub fn write_values<T: Value>(&self, view: &ValuesView<T>, values: &[T]) -> Result<()> {
        if values.len() != view.len {
            return Err(Error::Shape(format!("{} {} values for a device view of {}", values.len(), T::NAME, view.len)));
        }
        self.gpu.write_raw(view.addr, values, self.gpu.stream_handle())
    }

    /// A zeroed f16 output `[L, rows, cols]` on the device.
    pub fn alloc_output(&self, shape: [usize; 3]) -> Result<DeviceF16> {
        self.alloc_output_as(shape, OutputDtype::F16)
    }

    /// A zeroed output `[L, rows, cols]` of `dtype` on the device.
    pub fn alloc_output_as(&self, shape: [usize; 3], dtype: OutputDtype) -> Result<DeviceF16> {
        device::alloc_out(&self.gpu, shape, dtype)
    }

    /// Enqueues a fill of an output with its type's NaN (tests: an element a kernel leaves
    /// unwritten stays NaN).
    pub fn poison(&self, t: &DeviceF16) -> Result<()> {
        device::fill_f16(&self.gpu, t, t.dtype().nan_bits())
    }

    /// Waits for the stream and copies an f16 output back to the host.
    pub fn download(&self, t: &DeviceF16) -> Result<F16Tensor> {
        self.download_out(t)?.into_f16()
    }

    /// Waits for the stream and copies an output of either type back to the host.
    pub fn download_out(&self, t: &DeviceF16) -> Result<OutTensor> {
        device::download(&self.gpu, t)
    }

    /// Routes and binds `op` with the backend's shared workspace (grown when a plan needs more;
    /// launches that hold an older one keep it alive). Launches of operations bound this way must
    /// stay on one stream: they share the workspace.
    pub fn bind(&self, op: DeviceOp<'_>) -> Result<BoundOp> {
        let mut ws = self.workspace.lock().unwrap_or_else(|e| e.into_inner());
        self.bind_with(op, &mut ws)
    }

    /// [`CudaBackend::bind`] with a workspace of the caller's (replaced when too small): checks
    /// the operation's rules, asks the router which family runs it with which plan (under the
    /// backend's overrides; printed when they say so), and binds that plan.
    pub fn bind_with(&self, op: DeviceOp<'_>, ws: &mut Option<Workspace>) -> Result<BoundOp> {
        let route = self.route(&op.meta())?;
        if self.overrides.print_routes {
            // Not eprintln!, which panics when stderr is closed: a lost printout is no failure.
            let _ = writeln!(std::io::stderr(), "nvfp4 route: {route}");
        }
        let w = grown(&self.gpu, ws, route.plan.needs())?;
        let launch = route.plan.bind(self, &op, &w)?;
        Ok(BoundOp { gpu: self.gpu.clone(), route, launch, captured: Default::default() })
    }

    /// The route of an operation on this device under the backend's overrides.
    pub fn route(&self, op: &OpMeta) -> Result<Route> {
        route::route(op, self, &self.overrides)
    }
}

impl Kernels for CudaBackend {
    fn gpu(&self) -> &Gpu {
        &self.gpu
    }
    fn function(&self, m: &'static KernelModule, symbol: &str) -> Result<CudaFunction> {
        CudaBackend::function(self, m, symbol)
    }
}

impl DeviceFacts for CudaBackend {
    fn sms(&self) -> usize {
        self.gpu.info().sms as usize
    }
    fn ctas_per_sm(
        &self,
        module: &'static KernelModule,
        symbol: &'static str,
        threads: u32,
        smem: usize,
    ) -> Result<usize> {
        let f = self.function(module, symbol)?;
        self.gpu.allow_smem(&f, smem)?;
        f.occupancy_max_active_blocks_per_multiprocessor(threads, smem, None)
            .map(|n| n as usize)
            .map_err(cuda_err("cuOccupancyMaxActiveBlocksPerMultiprocessor"))
    }
    fn clusters_fit(
        &self,
        module: &'static KernelModule,
        symbol: &'static str,
        threads: u32,
        smem: usize,
        cluster: usize,
    ) -> Result<usize> {
        let f = self.function(module, symbol)?;
        self.gpu.allow_smem(&f, smem)?;
        let fit = self.gpu.max_active_clusters(&f, (threads, 1, 1), smem as u32, cluster as u32)?;
        Ok(fit as usize)
    }
}

/// `ws` if it holds `needs`, else a new workspace holding both (stored in `ws`; launches bound
/// to the old one keep it alive).
fn grown(gpu: &Gpu, ws: &mut Option<Workspace>, needs: WorkspaceNeeds) -> Result<Workspace> {
    if let Some(w) = ws.as_ref().filter(|w| w.holds(needs)) {
        return Ok(w.clone());
    }
    let old = ws.as_ref().map_or(WorkspaceNeeds::default(), Workspace::size);
    let size = WorkspaceNeeds { bytes: needs.bytes.max(old.bytes), counters: needs.counters.max(old.counters) };
    let w = Workspace::new(gpu, size)?;
    *ws = Some(w.clone());
    Ok(w)
}
