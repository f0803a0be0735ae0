//! Launches with or without programmatic dependent launch (PDL), and the graph protocol of SPEC §7
//! for the dev diagnostics: N launches captured back-to-back in one CUDA graph, µs per launch.

use std::ffi::c_void;

use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, CudaStream};
use nvfp4::backend::cuda::CudaBackend;

use super::{events, median};

/// Enqueues `f` on `stream` with the kernel arguments `args` (pointers to each argument's value),
/// with the programmatic-stream-serialization attribute when `pdl`.
///
/// # Safety
/// `args` must match the kernel's parameter list, and every device address they hold must stay
/// valid until the launch has run.
pub unsafe fn launch_ex(
    stream: &CudaStream,
    f: &CudaFunction,
    (grid, block, smem): (u32, u32, u32),
    args: &mut [*mut c_void],
    pdl: bool,
) {
    let mut attr = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value: sys::CUlaunchAttributeValue { programmaticStreamSerializationAllowed: 1 },
    };
    let config = sys::CUlaunchConfig {
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: smem,
        hStream: stream.cu_stream(),
        numAttrs: u32::from(pdl),
        attrs: &mut attr,
    };
    // SAFETY: the caller vouches for `args`; `config` and `attr` are live locals read during the
    // call only; the function and stream belong to the stream's context.
    unsafe { sys::cuLaunchKernelEx(&config, f.cu_function(), args.as_mut_ptr(), std::ptr::null_mut()) }
        .result()
        .unwrap();
}

/// µs per launch under the graph protocol: `launches` calls of `launch(i)` captured in one CUDA
/// graph (the caller rotates input sets by `i`), replayed `replays` times between events; the
/// median replay divided by `launches`.
pub fn time_graph(b: &CudaBackend, launches: usize, replays: usize, mut launch: impl FnMut(usize)) -> f64 {
    let s = b.stream();
    for i in 0..launches {
        launch(i);
    }
    s.synchronize().unwrap();
    s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    for i in 0..launches {
        launch(i);
    }
    let graph = s.end_capture(sys::CUgraphInstantiate_flags(0)).unwrap().expect("an empty capture");
    graph.upload().unwrap();
    graph.launch().unwrap();
    s.synchronize().unwrap();
    let ev: Vec<_> = (0..replays).map(|_| events(b)).collect();
    for (e0, e1) in &ev {
        e0.record(s).unwrap();
        graph.launch().unwrap();
        e1.record(s).unwrap();
    }
    s.synchronize().unwrap();
    let mut us: Vec<f32> = ev.iter().map(|(e0, e1)| e0.elapsed_ms(e1).unwrap() * 1e3).collect();
    median(&mut us) as f64 / launches as f64
}
