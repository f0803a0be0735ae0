//! The CUDA backend object: device 0's context and stream, the kernel modules loaded so far, a
//! shared workspace, upload and download of operands, and the choice of kernel family and plan
//! for each operation on device operands (bind).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaFunction, CudaModule};

use super::compile;
use super::device::{self, DeviceF16, DeviceNvfp4, I32View, Nvfp4View, Workspace, WorkspaceNeeds};
use super::device_op::{self, BoundOp, DeviceOp, GemmViews, Work};
use super::fallback::{self, MmaLaunch, MmaOperands};
use super::gemv::{self, GemvConfig, GemvLaunch};
use super::kernels::{self, sm90::Op, sm90::DECODE_X, sm90::DECODE_X_SYMBOL, KernelModule};
use super::quantize::{self, DenseView, GlobalSource, QuantizeKernels, ScalarView};
use super::runtime::{cuda_err, ContextScope, Gpu, StreamHandle};
use super::sm90::{self, Forced, GroupedLaunch, GroupedOperands, Sm90Kernels, Sm90Launch, Sm90Operands};
use super::small::{self, SmallLaunch};
use crate::format::{F16Tensor, Nvfp4Tensor, OutTensor, OutputDtype};
use crate::Result;

/// The CUDA backend: device 0's primary context and a stream, the kernel modules loaded so far,
/// and a workspace reused by the launches [`CudaBackend::bind`] makes.
pub struct CudaBackend {
    gpu: Arc<Gpu>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    workspace: Mutex<Option<Workspace>>,
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
        Ok(Self { gpu, modules: Mutex::new(HashMap::new()), workspace: Mutex::new(None) })
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
        self.quantize_with(x, out, global, global_out, ws, stream, false)
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
        self.quantize_with(x, out, global, global_out, ws, stream, true)
    }

    #[allow(clippy::too_many_arguments)]
    fn quantize_with(
        &self,
        x: &DenseView,
        out: &Nvfp4View,
        global: GlobalSource<'_>,
        global_out: &ScalarView,
        ws: &mut Option<Workspace>,
        stream: StreamHandle,
        check: bool,
    ) -> Result<()> {
        let (amax, quant) = x.dtype.symbols();
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

    /// Copies i32 values (a MoE launch's expert offsets) to the device.
    pub fn upload_i32(&self, values: &[i32]) -> Result<I32View> {
        device::upload_i32(&self.gpu, values)
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

    /// Plans and binds `op` with the backend's shared workspace (grown when a plan needs more;
    /// launches that hold an older one keep it alive). Launches of operations bound this way must
    /// stay on one stream: they share the workspace.
    pub fn bind(&self, op: DeviceOp<'_>) -> Result<BoundOp> {
        let mut ws = self.workspace.lock().unwrap_or_else(|e| e.into_inner());
        self.bind_with(op, &mut ws)
    }

    /// [`CudaBackend::bind`] with a workspace of the caller's (replaced when too small).
    pub fn bind_with(&self, op: DeviceOp<'_>, ws: &mut Option<Workspace>) -> Result<BoundOp> {
        let gpu = &self.gpu;
        let sms = gpu.info().sms as usize;
        let mut workspace = |needs: WorkspaceNeeds| grown(gpu, ws, needs);
        let work = match op {
            DeviceOp::Gemv(v) => {
                let (a, b) = (&v.a.meta, &v.b.meta);
                if b.layout != a.layout {
                    return Err(crate::Error::Shape("gemv: A and B must share one scale layout".into()));
                }
                let mut failure = None;
                let config = GemvConfig::choose((a.rows, a.k, a.l), a.layout, v.c.dtype, sms, |sym, smem| {
                    match self.function(&kernels::gemv::GEMV, sym) {
                        Ok(f) => {
                            let _ = gpu.allow_smem(&f, smem);
                            f.occupancy_max_active_blocks_per_multiprocessor(gemv::THREADS, smem, None).unwrap_or(1)
                                as usize
                        }
                        Err(e) => {
                            failure = Some(e);
                            1
                        }
                    }
                });
                if let Some(e) = failure {
                    return Err(e);
                }
                let f = self.function(&kernels::gemv::GEMV, config.symbol)?;
                let ws = workspace(config.scratch())?;
                Work::Gemv(Box::new(GemvLaunch::bind(gpu, config, f, (v.a, v.b), v.alpha, v.c, &ws)?))
            }
            DeviceOp::Gemm(v)
                if small::chosen(
                    (v.a.meta.rows, v.b.meta.rows, v.a.meta.k, v.a.meta.l),
                    sms,
                    Forced::from_env(Op::Gemm),
                ) =>
            {
                let f = self.function(&kernels::small::SMALL, small::SMALL_SYMBOL)?;
                Work::Small(SmallLaunch::bind(f, &v)?)
            }
            DeviceOp::Gemm(v) => {
                let ops = Sm90Operands { a: v.a, b: std::slice::from_ref(v.b), alpha: v.alpha, c: v.c };
                match self.bind_sm90(Op::Gemm, &ops, &mut workspace)? {
                    Some(w) => Work::Sm90(Box::new(w)),
                    None => self.bind_fallback(fallback::GEMM_SYMBOL, &[mma(&v)])?,
                }
            }
            DeviceOp::DualGemm { a, b1, b2, alpha, c } => {
                let b = [b1.clone(), b2.clone()];
                let ops = Sm90Operands { a, b: &b, alpha, c };
                match self.bind_sm90(Op::Dual, &ops, &mut workspace)? {
                    Some(w) => Work::Sm90(Box::new(w)),
                    None => {
                        let op = MmaOperands { a, b: b1, b2: Some(b2), alpha, c };
                        self.bind_fallback(fallback::DUAL_SYMBOL, &[op])?
                    }
                }
            }
            DeviceOp::GroupedGemm(groups) => {
                match self.bind_grouped(&GroupedOperands::List(groups), &mut workspace)? {
                    Some(w) => Work::Grouped(Box::new(w)),
                    None => {
                        let ops: Vec<MmaOperands<'_>> = groups.iter().map(mma).collect();
                        self.bind_fallback(fallback::GEMM_SYMBOL, &ops)?
                    }
                }
            }
            DeviceOp::MoeGemm { a, b, offsets, alpha, c } => {
                let ops = GroupedOperands::Moe { a, b, offsets, alpha, c };
                match self.bind_grouped(&ops, &mut workspace)? {
                    Some(w) => Work::Grouped(Box::new(w)),
                    // The offsets are on the device: no host-side split into a list.
                    None => {
                        let why = sm90::grouped_rejects(&ops.shape()?, None).unwrap_or_default();
                        return Err(crate::Error::Shape(format!("MoE grouped gemm: {why}")));
                    }
                }
            }
        };
        Ok(BoundOp { gpu: self.gpu.clone(), work, captured: Default::default() })
    }

    /// Binds `ops` to the skeleton's kernels of `op`, or `None` when the skeleton does not take
    /// the shape (its alignment rules, or forced off).
    fn bind_sm90(
        &self,
        op: Op,
        ops: &Sm90Operands<'_>,
        workspace: &mut dyn FnMut(WorkspaceNeeds) -> Result<Workspace>,
    ) -> Result<Option<Sm90Launch>> {
        let (a, b) = (&ops.a.meta, &ops.b[0].meta);
        let mnkl = (a.rows, b.rows, a.k, a.l);
        let forced = Forced::from_env(op);
        // The W parts share one scale mode; B1 and B2 in different layouts take the fallback.
        let mixed = ops.b.iter().any(|t| t.meta.layout != b.layout);
        if mixed || sm90::rejects(op, mnkl, forced).is_some() {
            return Ok(None);
        }
        let sms = self.gpu.info().sms as usize;
        let mut plan = sm90::plan(op, mnkl, sms, forced);
        let main = self.function(op.module(), plan.symbol())?;
        let smem = plan.layout().smem_bytes; // the variant's: unchanged by a re-plan below
        self.gpu.allow_smem(&main, smem)?;
        // The schedule assumes every cluster of the grid runs at once; where the GPU holds fewer,
        // CTAs without clusters instead.
        if plan.launch_cluster() > 1 {
            let fit = self.gpu.max_active_clusters(
                &main,
                (kernels::sm90::THREADS, 1, 1),
                smem as u32,
                plan.launch_cluster() as u32,
            )?;
            if (fit as usize) * plan.launch_cluster() < plan.grid {
                plan = sm90::plan(op, mnkl, sms, Some(Forced::Config(plan.variant, Some(1), None)));
            }
        }
        let kernels = Sm90Kernels { main, decode_x: self.function(&DECODE_X, DECODE_X_SYMBOL)? };
        let ws = workspace(plan.scratch().needs)?;
        Ok(Some(sm90::bind(&plan, kernels, ops, &ws)?))
    }

    /// Binds a grouped launch to the skeleton, or `None` when it does not take the shape.
    fn bind_grouped(
        &self,
        ops: &GroupedOperands<'_>,
        workspace: &mut dyn FnMut(WorkspaceNeeds) -> Result<Workspace>,
    ) -> Result<Option<GroupedLaunch>> {
        let shape = ops.shape()?;
        let forced = Forced::from_env(Op::Grouped);
        if sm90::grouped_rejects(&shape, forced).is_some() {
            return Ok(None);
        }
        let plan = sm90::grouped_plan(&shape, self.gpu.info().sms as usize, forced);
        let main = self.function(Op::Grouped.module(), plan.symbol())?;
        self.gpu.allow_smem(&main, plan.smem_bytes())?;
        let prepare = self.function(Op::Grouped.module(), kernels::grouped::PREPARE_SYMBOL)?;
        let ws = workspace(plan.scratch().needs)?;
        Ok(Some(sm90::bind_grouped(&self.gpu, &plan, (prepare, main), ops, &ws)?))
    }

    fn bind_fallback(&self, symbol: &'static str, ops: &[MmaOperands<'_>]) -> Result<Work> {
        let f = self.function(&kernels::fallback::FALLBACK, symbol)?;
        Ok(Work::Mma(MmaLaunch::bind(&self.gpu, symbol, f, ops)?))
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

/// A GEMM's operands for the fallback.
fn mma<'a>(v: &GemmViews<'a>) -> MmaOperands<'a> {
    MmaOperands { a: v.a, b: v.b, b2: None, alpha: v.alpha, c: v.c }
}
