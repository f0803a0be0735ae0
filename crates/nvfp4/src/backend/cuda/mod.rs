//! The CUDA backend (Hopper, sm_90a): kernels compiled at run time by NVRTC, cached on disk.
//!
//! Layers, each depending only on those above it:
//! - [`runtime`](self): the thin unsafe layer (driver, context, stream, launches, TMA, NVRTC).
//! - [`kernels`]: the registry of kernel modules and symbols, each parameter struct beside its
//!   kernel, and the generated header with every size Rust and CUDA share.
//! - [`compile`]: NVRTC options, the CUBIN cache, the ptxas report.
//! - [`device`]: device-resident operands and views ([`DeviceOp`]), `upload`, workspaces, and the
//!   memory the backend owns, freed only after the launches on any stream that read it.
//! - [`quantize`]: the GPU quantizer (dense device memory to NVFP4 on a given stream);
//!   `quantize_job`: a quantization of host data staged for repeated launches (bench, tests).
//! - [`floors`]: the benchmark's floor kernels (empty launch, streaming reads).
//! - [`overrides`]: forced configurations and the route printout, an argument of the backend.
//! - [`family`]: what a kernel family implements (a verdict on an operation, a plan that binds
//!   itself, a launch); the families [`gemv`], [`small`] (small GEMMs in one launch), [`sm90`]
//!   (the GEMM skeleton: GEMM, fused dual GEMM, grouped GEMM) and [`fallback`]; [`route`](mod@route): the
//!   pure router that asks them in order (docs/ROUTE.md walks a call through these files).
//! - `device_op`: [`BoundOp`], an operation bound by its route's plan; `backend`:
//!   [`CudaBackend`]: the device, the module cache, upload and download, `bind`; `host`: the
//!   [`Backend`](crate::Backend) trait for host data, a thin layer on top; `prepared`:
//!   [`Prepared`] problems for repeated launches.
//! - `dev` (hidden): the dev diagnostics' kernel variants, launched through the layers above.
//!
//! Environment, read where a program starts ([`Overrides::from_env`]: the CLI, the Python
//! package, the examples), never inside a bind: `NVFP4_PRINT_CONFIG=1` (print each operation's
//! route when it is bound), `NVFP4_GEMM_SM90`, `NVFP4_DUAL_SM90` and `NVFP4_GROUPED_SM90` (force a
//! family or a skeleton configuration, see [`sm90::Forced`]). Read by the library itself:
//! `NVFP4_CACHE_DIR` (CUBIN cache folder), `NVFP4_KERNELS_DIR` (development: compile kernel
//! sources from this folder instead of the embedded ones, see [`compile::Sources`]),
//! `NVFP4_QUANT_CTAS_PER_SM` (the quantizer's CTAs per SM, experiments).

mod backend;
pub mod compile;
#[doc(hidden)]
pub mod dev;
pub mod device;
mod device_op;
pub mod fallback;
pub mod family;
pub mod floors;
pub mod gemv;
mod gemv16;
pub mod gemv16_moe;
mod gemv_launch;
mod gemv_tiling;
mod host;
pub mod kernels;
pub mod overrides;
mod packed;
mod prepared;
pub mod quantize;
mod quantize_job;
pub mod route;
mod runtime;
pub mod sm90;
pub mod small;

use std::sync::OnceLock;

pub use backend::CudaBackend;
pub use compile::{fill_cache, kernel_reports, kernel_reports_of, kernel_reports_to, KernelReport, DEFAULT_ARCH};
pub use device::{
    DeviceF16, DeviceNvfp4, DeviceOp, F16View, F32View, GemmViews, I32View, Nvfp4Meta, Nvfp4View, Value, ValuesView,
    Workspace, WorkspaceNeeds,
};
pub use device_op::BoundOp;
pub use fallback::MmaConfig;
pub use family::{DeviceFacts, Modeled};
pub use floors::{Floors, ReadKernel, ReadSetting, ReadSource, ReadSums};
pub use gemv::{Form as GemvForm, GemvConfig};
pub use kernels::KernelModule;
pub use overrides::Overrides;
pub use packed::{packed_bytes, DevicePacked};
pub use prepared::{Prepared, F16_NAN_BITS};
pub use quantize::{DenseType, DenseView, GlobalSource, ScalarView};
pub use quantize_job::{DenseBytes, JobGlobal, QuantizeJob};
pub use route::{route, Route};
pub use runtime::{ContextScope, StreamHandle};
pub use sm90::{GroupedPlan, Sm90Plan};

/// True when a CUDA driver and at least one GPU are present (checked once per process).
pub fn is_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| runtime::device_count().is_ok())
}
