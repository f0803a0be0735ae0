//! Device memory of the backend's context: size-checked allocation, copies both ways, fills
//! enqueued on a stream, and the raw addresses that kernel parameter structs carry.

use cudarc::driver::{sys as dsys, CudaSlice, DevicePtr, DeviceRepr, ValidAsZeroBits};

use super::context::Gpu;
use super::driver::cuda_err;
use super::stream::StreamHandle;
use crate::{Error, Result};

impl Gpu {
    /// The `n` u32 words at device address `addr` once the work enqueued on `stream` before this
    /// call has run: a copy on `stream`, then a wait for it.
    pub fn read_u32(&self, addr: u64, n: usize, stream: StreamHandle) -> Result<Vec<u32>> {
        let mut out = vec![0u32; n];
        // SAFETY: `addr` holds `n` u32 of device memory of this context (the safe callers pass
        // workspace and view addresses, which keep it allocated); the copy writes the `n` words
        // of `out`, which outlives it: the stream is waited for below before `out` is returned,
        // `out` is leaked if that wait fails, and a copy that failed to enqueue writes nothing.
        unsafe { dsys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), addr, n * 4, stream.0) }
            .result()
            .map_err(cuda_err("cuMemcpyDtoHAsync"))?;
        // SAFETY: waits for `stream`, a live stream of this context.
        if let Err(e) = unsafe { dsys::cuStreamSynchronize(stream.0) }.result() {
            std::mem::forget(out); // the copy may still be writing it
            return Err(cuda_err("synchronizing the stream")(e));
        }
        Ok(out)
    }

    /// Copies `values` to the device memory at `addr` on `stream`, after the work enqueued there
    /// before this call, and waits for the copy.
    pub fn write_raw<T: DeviceRepr + Clone>(&self, addr: u64, values: &[T], stream: StreamHandle) -> Result<()> {
        // A copy of the values, so that a failed wait can leave it to the copy (leaked).
        let src = values.to_vec();
        let bytes = std::mem::size_of_val(values);
        // SAFETY: `addr` holds `values.len()` elements of `T` of device memory of this context
        // (the safe caller passes a view's address and length, which its maker guarantees); the
        // copy reads the `bytes` of `src`, which outlives it: the stream is waited for below
        // before `src` is dropped, `src` is leaked if that wait fails, and a copy that failed to
        // enqueue reads nothing.
        unsafe { dsys::cuMemcpyHtoDAsync_v2(addr, src.as_ptr().cast(), bytes, stream.0) }
            .result()
            .map_err(cuda_err("cuMemcpyHtoDAsync"))?;
        // SAFETY: waits for `stream`, a live stream of this context.
        if let Err(e) = unsafe { dsys::cuStreamSynchronize(stream.0) }.result() {
            std::mem::forget(src); // the copy may still be reading it
            return Err(cuda_err("synchronizing the stream")(e));
        }
        Ok(())
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.stream().context().mem_get_info().map_err(cuda_err("cuMemGetInfo"))
    }

    /// Refuses `n` elements of `T` for `what` when the byte count overflows or exceeds the
    /// device's free memory (`Error::TooLarge`, before anything is allocated).
    pub fn check_fits<T>(&self, n: usize, what: &str) -> Result<()> {
        let needed = n.checked_mul(std::mem::size_of::<T>());
        let (free, _) = self.mem_info()?;
        match needed {
            Some(b) if b <= free => Ok(()),
            _ => Err(Error::TooLarge {
                what: format!("{what} on the GPU"),
                needed: needed.map_or(u64::MAX, |b| b as u64),
                available: free as u64,
            }),
        }
    }

    /// Copies host data to a new device buffer, size-checked first. The copy has completed when
    /// this returns, so that a launch on any stream of the context reads it.
    pub fn upload<T: DeviceRepr>(&self, data: &[T], what: &str) -> Result<CudaSlice<T>> {
        self.check_fits::<T>(data.len(), what)?;
        let buf = self.stream().clone_htod(data).map_err(cuda_err("copying to the device"))?;
        self.sync()?;
        Ok(buf)
    }

    /// A zero-filled device buffer of `n` elements (at least one), size-checked first; zeroed
    /// when this returns, so that a launch on any stream of the context may use it.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize, what: &str) -> Result<CudaSlice<T>> {
        self.check_fits::<T>(n, what)?;
        let buf = self.stream().alloc_zeros(n.max(1)).map_err(cuda_err("allocating device memory"))?;
        self.sync()?;
        Ok(buf)
    }

    /// Copies a device buffer back to the host (waits for the stream).
    pub fn download<T: DeviceRepr + Default + Clone>(&self, buf: &CudaSlice<T>) -> Result<Vec<T>> {
        self.stream().clone_dtoh(buf).map_err(cuda_err("copying from the device"))
    }

    /// The raw device address of a buffer, for kernel parameter structs.
    pub fn addr<T>(&self, buf: &CudaSlice<T>) -> u64 {
        let (ptr, _guard) = buf.device_ptr(self.stream());
        ptr
    }

    /// Enqueues a fill of `n` u32 words at device address `addr` with `value` on `stream`.
    pub fn memset_u32(&self, addr: u64, value: u32, n: usize, stream: StreamHandle) -> Result<()> {
        // SAFETY: the caller's `addr` holds `n` u32 of device memory of this context (checked by
        // the safe callers from views and workspaces, which keep it allocated); the memset is
        // ordered on `stream`, a live stream of this context.
        unsafe { dsys::cuMemsetD32Async(addr, value, n, stream.0) }.result().map_err(cuda_err("cuMemsetD32Async"))
    }

    /// Enqueues a zero fill of `n` bytes at device address `addr` on `stream`.
    pub fn memset_zero(&self, addr: u64, n: usize, stream: StreamHandle) -> Result<()> {
        // SAFETY: as in `memset_u32`, for `n` bytes.
        unsafe { dsys::cuMemsetD8Async(addr, 0, n, stream.0) }.result().map_err(cuda_err("cuMemsetD8Async"))
    }

    /// Enqueues a fill of `buf` with the 16-bit pattern `bits` (f16 NaN to poison outputs).
    pub fn fill_u16(&self, buf: &CudaSlice<u16>, bits: u16) -> Result<()> {
        let ptr = self.addr(buf);
        // SAFETY: `ptr` addresses `buf.len()` u16 elements of device memory owned by `buf`, which
        // outlives the enqueued memset because its free is ordered after it on this same stream.
        // The host never reads that memory through `buf`, so a shared borrow suffices.
        unsafe { dsys::cuMemsetD16Async(ptr, bits, buf.len(), self.stream().cu_stream()) }
            .result()
            .map_err(cuda_err("cuMemsetD16Async"))
    }
}
