//! The graph protocol of SPEC §7 for the dev diagnostics: N launches captured back-to-back in one
//! CUDA graph, µs per launch.

use cudarc::driver::sys;
use nvfp4::backend::cuda::CudaBackend;

use super::{events, median};

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
