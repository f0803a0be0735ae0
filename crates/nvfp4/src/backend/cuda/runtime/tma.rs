//! TMA descriptors: the tensor maps the skeleton's kernels load operands with.

use std::ffi::c_void;

use cudarc::driver::sys as dsys;

use super::driver::cuda_err;
use crate::Result;

/// `CUtensorMap`: 128 opaque bytes, 64-byte aligned (the kernel's `TmaMap`); all zeros is "none".
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TmaMap(pub(crate) [u64; 16]);

/// Encodes the TMA descriptor of a `[L, rows, cols]` u8 tensor at `addr`, box
/// `[1, box_rows, box_cols]` (`cols` a multiple of 16), stored with `swizzle` in shared memory.
pub(crate) fn tma_map(
    addr: u64,
    rows: usize,
    cols: usize,
    l: usize,
    (box_rows, box_cols): (usize, usize),
    swizzle: dsys::CUtensorMapSwizzle,
) -> Result<TmaMap> {
    let row_bytes = cols as u64;
    let dims: [u64; 3] = [row_bytes, rows as u64, l as u64];
    let strides: [u64; 2] = [row_bytes, row_bytes * rows as u64]; // dims 1 and 2, in bytes
    let boxes: [u32; 3] = [box_cols as u32, box_rows as u32, 1];
    let elem_strides: [u32; 3] = [1, 1, 1];
    let mut map = dsys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: every pointer refers to a live local array of the length the rank (3) implies;
    // `addr` is a device allocation of `l * rows * k/2` bytes owned by the caller's `Prepared`
    // for as long as the descriptor is used; the driver only writes the 128-byte `map`.
    unsafe {
        dsys::cuTensorMapEncodeTiled(
            &mut map,
            dsys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            3,
            addr as *mut c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem_strides.as_ptr(),
            dsys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            dsys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            dsys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()
    .map_err(cuda_err("cuTensorMapEncodeTiled"))?;
    Ok(TmaMap(map.opaque))
}
