//! Launching a kernel: its grid, block, shared memory and attributes ([`LaunchShape`],
//! [`LaunchOptions`]), the driver's launch configuration, and the launch itself with one by-value
//! parameter struct ([`KernelParams`]) on a given stream.

use std::ffi::c_void;

use cudarc::driver::{sys as dsys, CudaFunction};

use super::context::Gpu;
use super::driver::cuda_err;
use super::params::KernelParams;
use super::stream::StreamHandle;
use crate::{Error, Result};

impl Gpu {
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
        let config = launch_config((cluster_x, 1, 1), block, smem_bytes, self.stream().cu_stream(), &mut attrs[..n]);
        let mut n: std::ffi::c_int = 0;
        // SAFETY: `n`, `config` and `attrs` are live locals the driver reads or writes during the
        // call only; `func` is a loaded kernel.
        unsafe { dsys::cuOccupancyMaxActiveClusters(&mut n, func.cu_function(), &config) }
            .result()
            .map_err(cuda_err("cuOccupancyMaxActiveClusters"))?;
        Ok(n.max(0) as u32)
    }
}

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
