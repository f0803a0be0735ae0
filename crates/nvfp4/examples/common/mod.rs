//! Helpers shared by the dev diagnostics (`dev_gemv_diag`, `dev_gemm_diag`): the backend, CUDA
//! events, medians and the memset-flushed timing loop.
#![allow(dead_code)] // each diagnostic uses its own subset

pub mod graph;

use nvfp4::backend::cuda::{CudaBackend, Overrides, Prepared};

/// The CUDA backend under the overrides the environment asks for (`NVFP4_*_SM90`,
/// `NVFP4_PRINT_CONFIG`), read once here.
pub fn gpu() -> CudaBackend {
    CudaBackend::new().unwrap_or_else(|e| panic!("CUDA backend: {e}")).with_overrides(Overrides::from_env())
}

pub fn median(v: &mut [f32]) -> f32 {
    v.sort_by(f32::total_cmp);
    v[v.len() / 2]
}

pub fn events(b: &CudaBackend) -> (cudarc::driver::CudaEvent, cudarc::driver::CudaEvent) {
    let ctx = b.stream().context();
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    (ctx.new_event(flags).unwrap(), ctx.new_event(flags).unwrap())
}

pub fn median_min(mut us: Vec<f32>) -> (f32, f32) {
    let min = us.iter().copied().fold(f32::INFINITY, f32::min);
    (median(&mut us), min)
}

/// µs of one launch per sample, L2 flushed by a 512 MB memset before each sample (SPEC §7's
/// "write larger than 2x L2"). NOTE: the memset leaves up to a whole L2 of dirty lines, whose
/// write-back lands inside the timed kernel: up to ~L2 bytes of extra DRAM traffic.
pub fn time_memset_flush(b: &CudaBackend, prep: &mut Prepared, samples: usize) -> (f32, f32) {
    let s = b.stream();
    let mut flush = s.alloc_zeros::<u8>(512 << 20).unwrap();
    let (e0, e1) = events(b);
    prep.launch().unwrap();
    let us = (0..samples)
        .map(|_| {
            s.memset_zeros(&mut flush).unwrap();
            e0.record(s).unwrap();
            prep.launch().unwrap();
            e1.record(s).unwrap();
            e0.elapsed_ms(&e1).unwrap() * 1e3
        })
        .collect();
    median_min(us)
}
