//! A thin owned layer over cuBLASLt's raw API for the FP16 peer and the FP16 ceiling: a handle
//! with its workspace, f16 device buffers with cached addresses, and GEMM plans whose descriptors
//! and algorithm are chosen once, so that a timed launch is one `cublasLtMatmul` call and nothing
//! else (cudarc's safe `Matmul` rebuilds descriptors and reruns the heuristic on every call, and
//! needs its `f16` feature). Every `unsafe` block of the benchmark's cuBLASLt use is in this file.

use std::ffi::c_void;
use std::mem::size_of;
use std::sync::Arc;

use cudarc::cublaslt::result::{self, CublasError};
use cudarc::cublaslt::sys;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use half::f16;

use super::gpu::{cublaslt_present, driver_err};
use crate::{Error, Result};

/// cuBLASLt's recommended workspace on Hopper (the size cudarc and PyTorch use there).
const WORKSPACE_BYTES: usize = 32 << 20;

fn lt_err(what: &str) -> impl FnOnce(CublasError) -> Error + '_ {
    move |e| Error::Cuda(format!("cuBLASLt {what}: {:?}", e.0))
}

/// A cuBLASLt handle bound to one stream, with its workspace.
pub struct Lt {
    handle: sys::cublasLtHandle_t,
    stream: Arc<CudaStream>,
    // [WORKSPACE_BYTES] u8; `workspace_ptr` is its address, valid while `_workspace` lives.
    _workspace: CudaSlice<u8>,
    workspace_ptr: CUdeviceptr,
}

impl Lt {
    /// Loads cuBLASLt (a typed error when the library is missing) and allocates the workspace.
    pub fn new(stream: Arc<CudaStream>) -> Result<Self> {
        if !cublaslt_present() {
            return Err(Error::Cuda(
                "libcublasLt.so could not be loaded (put CUDA's or the nvidia-cublas wheel's lib folder on \
                 LD_LIBRARY_PATH)"
                    .into(),
            ));
        }
        stream.context().bind_to_thread().map_err(driver_err("binding the context"))?;
        let handle = result::create_handle().map_err(lt_err("create"))?;
        let workspace = match stream.alloc_zeros::<u8>(WORKSPACE_BYTES) {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: `handle` was just created and is destroyed once, here.
                let _ = unsafe { result::destroy_handle(handle) };
                return Err(driver_err("allocating the cuBLASLt workspace")(e));
            }
        };
        let workspace_ptr = workspace.device_ptr(&stream).0;
        Ok(Self { handle, stream, _workspace: workspace, workspace_ptr })
    }

    /// The stream every GEMM of this handle is enqueued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: the handle was created in `new` and is destroyed once; plans keep no reference
        // to it. The workspace is freed after this by its own (stream-ordered) drop.
        let _ = unsafe { result::destroy_handle(self.handle) };
    }
}

/// An f16 device buffer (stored as its bit pattern) whose address is read once.
pub(crate) struct DeviceF16 {
    // [len] f16 bits.
    buf: CudaSlice<u16>,
    ptr: CUdeviceptr,
}

impl DeviceF16 {
    /// Uploads `data`.
    pub(crate) fn upload(stream: &Arc<CudaStream>, data: &[f16]) -> Result<Self> {
        let bits: Vec<u16> = data.iter().map(|x| x.to_bits()).collect();
        let buf = stream.clone_htod(&bits).map_err(driver_err("uploading an f16 operand"))?;
        let ptr = buf.device_ptr(stream).0;
        Ok(Self { buf, ptr })
    }

    /// A zero-filled buffer of `len` elements.
    pub(crate) fn zeros(stream: &Arc<CudaStream>, len: usize) -> Result<Self> {
        let buf = stream.alloc_zeros::<u16>(len).map_err(driver_err("allocating an f16 output"))?;
        let ptr = buf.device_ptr(stream).0;
        Ok(Self { buf, ptr })
    }

    /// Elements.
    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    /// Waits for the stream and downloads the buffer.
    pub(crate) fn download(&self, stream: &Arc<CudaStream>) -> Result<Vec<f16>> {
        stream.synchronize().map_err(driver_err("synchronising before a download"))?;
        let bits = stream.clone_dtoh(&self.buf).map_err(driver_err("downloading an f16 output"))?;
        Ok(bits.into_iter().map(f16::from_bits).collect())
    }
}

/// One column-major, possibly strided-batched GEMM `C = alpha · op(A) · op(B)`: f16 operands and
/// output, FP32 compute and accumulation (`CUBLAS_COMPUTE_32F`, FP32 alpha).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GemmSpec {
    /// Rows of op(A) and C.
    pub m: u64,
    /// Columns of op(B) and C.
    pub n: u64,
    /// Reduction length.
    pub k: u64,
    /// A is stored `k x m` (column-major) and used transposed.
    pub trans_a: bool,
    /// B is stored `n x k` and used transposed.
    pub trans_b: bool,
    /// Leading dimensions (column-major).
    pub lda: i64,
    pub ldb: i64,
    pub ldc: i64,
    /// Batch count (1 for a plain GEMM) and element strides between batches.
    pub batch: i32,
    pub stride_a: i64,
    pub stride_b: i64,
    pub stride_c: i64,
}

/// Elements a column-major `rows x cols` matrix with leading dimension `ld` spans over `batch`
/// matrices `stride` apart.
fn span(rows: u64, cols: u64, ld: i64, batch: i32, stride: i64) -> usize {
    ((cols - 1) * ld as u64 + rows + (batch as u64 - 1) * stride as u64) as usize
}

impl GemmSpec {
    /// Stored (rows, cols) of A, B and C.
    fn stored(&self) -> [(u64, u64); 3] {
        let a = if self.trans_a { (self.k, self.m) } else { (self.m, self.k) };
        let b = if self.trans_b { (self.n, self.k) } else { (self.k, self.n) };
        [a, b, (self.m, self.n)]
    }

    /// Elements the A, B and C buffers must hold.
    pub(crate) fn spans(&self) -> [usize; 3] {
        let [a, b, c] = self.stored();
        [
            span(a.0, a.1, self.lda, self.batch, self.stride_a),
            span(b.0, b.1, self.ldb, self.batch, self.stride_b),
            span(c.0, c.1, self.ldc, self.batch, self.stride_c),
        ]
    }

    fn validate(&self) -> Result<()> {
        let [a, b, c] = self.stored();
        let ok_ld = |(rows, _): (u64, u64), ld: i64| ld >= 1 && ld as u64 >= rows;
        if self.m == 0 || self.n == 0 || self.k == 0 || self.batch < 1 {
            return Err(Error::Invalid(format!("cuBLASLt GEMM with an empty dimension: {self:?}")));
        }
        if !(ok_ld(a, self.lda) && ok_ld(b, self.ldb) && ok_ld(c, self.ldc)) {
            return Err(Error::Invalid(format!("cuBLASLt GEMM with a leading dimension below its rows: {self:?}")));
        }
        if self.batch > 1 && (self.stride_a < 0 || self.stride_b < 0 || self.stride_c < 1) {
            return Err(Error::Invalid(format!("cuBLASLt batched GEMM with a bad stride: {self:?}")));
        }
        Ok(())
    }
}

/// A GEMM whose descriptors and algorithm are chosen once (cuBLASLt's top heuristic, as PyTorch
/// does), ready to launch any number of times.
pub(crate) struct LtPlan {
    spec: GemmSpec,
    alpha: f32,
    beta: f32,
    desc: sys::cublasLtMatmulDesc_t,
    // A, B, C (C doubles as D).
    layouts: [sys::cublasLtMatrixLayout_t; 3],
    algo: sys::cublasLtMatmulAlgo_t,
}

/// Owns descriptors while a plan is being built, so that an error destroys what exists so far.
struct Descriptors {
    desc: Option<sys::cublasLtMatmulDesc_t>,
    layouts: Vec<sys::cublasLtMatrixLayout_t>,
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by cuBLASLt and is destroyed once; `take_all`
        // empties this guard when ownership moves to a plan.
        unsafe {
            if let Some(d) = self.desc.take() {
                let _ = result::destroy_matmul_desc(d);
            }
            for l in self.layouts.drain(..) {
                let _ = result::destroy_matrix_layout(l);
            }
        }
    }
}

fn set_desc_attr<T>(desc: sys::cublasLtMatmulDesc_t, attr: sys::cublasLtMatmulDescAttributes_t, v: &T) -> Result<()> {
    // SAFETY: `desc` is a live descriptor and `v` points to `size_of::<T>()` readable bytes of the
    // type cuBLASLt documents for `attr` (int32 for TRANSA/TRANSB).
    unsafe { result::set_matmul_desc_attribute(desc, attr, v as *const T as *const c_void, size_of::<T>()) }
        .map_err(lt_err("matmul descriptor attribute"))
}

fn set_layout_attr<T>(
    layout: sys::cublasLtMatrixLayout_t,
    attr: sys::cublasLtMatrixLayoutAttribute_t,
    v: &T,
) -> Result<()> {
    // SAFETY: `layout` is a live descriptor and `v` points to `size_of::<T>()` readable bytes of
    // the type cuBLASLt documents for `attr` (int32 batch count, int64 batch stride).
    unsafe { result::set_matrix_layout_attribute(layout, attr, v as *const T as *const c_void, size_of::<T>()) }
        .map_err(lt_err("matrix layout attribute"))
}

impl LtPlan {
    /// Builds the descriptors and asks cuBLASLt's heuristic for its best algorithm.
    pub(crate) fn new(lt: &Lt, spec: GemmSpec, alpha: f32) -> Result<Self> {
        use sys::cublasLtMatmulDescAttributes_t as D;
        use sys::cublasLtMatrixLayoutAttribute_t as L;
        spec.validate()?;
        let mut guard = Descriptors { desc: None, layouts: Vec::with_capacity(3) };
        let desc =
            result::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_32F)
                .map_err(lt_err("create matmul descriptor"))?;
        guard.desc = Some(desc);
        set_desc_attr(desc, D::CUBLASLT_MATMUL_DESC_TRANSA, &(spec.trans_a as i32))?;
        set_desc_attr(desc, D::CUBLASLT_MATMUL_DESC_TRANSB, &(spec.trans_b as i32))?;
        let lds = [spec.lda, spec.ldb, spec.ldc];
        let strides = [spec.stride_a, spec.stride_b, spec.stride_c];
        for (i, (rows, cols)) in spec.stored().into_iter().enumerate() {
            let layout = result::create_matrix_layout(sys::cudaDataType::CUDA_R_16F, rows, cols, lds[i])
                .map_err(lt_err("create matrix layout"))?;
            guard.layouts.push(layout);
            if spec.batch > 1 {
                set_layout_attr(layout, L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &spec.batch)?;
                set_layout_attr(layout, L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i])?;
            }
        }
        let pref = result::create_matmul_pref().map_err(lt_err("create preference"))?;
        let ws = WORKSPACE_BYTES as u64;
        // SAFETY: `pref` is live; the attribute takes a uint64 byte count. The preference is
        // destroyed right after the heuristic, whatever it returned.
        let heuristic = unsafe {
            let set = result::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                size_of::<u64>(),
            );
            let h = set.and_then(|()| {
                let l = &guard.layouts;
                result::get_matmul_algo_heuristic(lt.handle, desc, l[0], l[1], l[2], l[2], pref)
            });
            let _ = result::destroy_matmul_pref(pref);
            h
        }
        .map_err(lt_err("heuristic (no algorithm for this GEMM)"))?;
        let layouts = [guard.layouts[0], guard.layouts[1], guard.layouts[2]];
        guard.desc = None;
        guard.layouts.clear();
        Ok(Self { spec, alpha, beta: 0.0, desc, layouts, algo: heuristic.algo })
    }

    /// The GEMM this plan runs.
    pub(crate) fn spec(&self) -> &GemmSpec {
        &self.spec
    }

    /// Enqueues `c = alpha · op(a) · op(b)` on the handle's stream. `c` is written through its
    /// device address although it is borrowed shared: Rust never reads device memory, and every
    /// later read of it (a download) is ordered after this GEMM on the same stream.
    pub(crate) fn launch(&self, lt: &Lt, a: &DeviceF16, b: &DeviceF16, c: &DeviceF16) -> Result<()> {
        let [sa, sb, sc] = self.spec.spans();
        if a.len() < sa || b.len() < sb || c.len() < sc {
            return Err(Error::Invalid(format!(
                "cuBLASLt GEMM buffers too small: a {} < {sa}, b {} < {sb} or c {} < {sc}",
                a.len(),
                b.len(),
                c.len()
            )));
        }
        // SAFETY: the handle, descriptors and algorithm are live (owned by `lt` and `self`); each
        // buffer holds at least the elements its layout spans (checked above) and stays alive
        // until the GEMM ran: the buffers' own drops free stream-ordered on the same stream; the
        // workspace is the one the heuristic was given the size of; alpha and beta are host FP32
        // values as the FP32 scale type requires.
        unsafe {
            result::matmul(
                lt.handle,
                self.desc,
                &self.alpha as *const f32 as *const c_void,
                &self.beta as *const f32 as *const c_void,
                a.ptr as *const c_void,
                self.layouts[0],
                b.ptr as *const c_void,
                self.layouts[1],
                c.ptr as *const c_void,
                self.layouts[2],
                c.ptr as *mut c_void,
                self.layouts[2],
                &self.algo,
                lt.workspace_ptr as *mut c_void,
                WORKSPACE_BYTES,
                lt.stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(lt_err("matmul"))
    }
}

impl Drop for LtPlan {
    fn drop(&mut self) {
        // SAFETY: the descriptors were created in `new` and are destroyed once, here.
        unsafe {
            let _ = result::destroy_matmul_desc(self.desc);
            for l in self.layouts {
                let _ = result::destroy_matrix_layout(l);
            }
        }
    }
}
