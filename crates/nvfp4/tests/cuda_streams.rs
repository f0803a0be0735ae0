//! Launches on a stream other than the backend's, the way a framework makes them (needs an
//! NVIDIA GPU: `cargo test --release --test cuda_streams -- --ignored`).
//!
//! The stream is kept busy (large GEMMs queued first), then every operation and form runs twice
//! back to back with different shapes: operands uploaded, bound with one shared workspace (grown
//! by the second, larger call), launched there, and everything but the outputs dropped at once,
//! while the stream is still far behind. Memory a queued launch reads (operands, workspace, the
//! grouped and fallback descriptor tables) must outlive it, and the next call's uploads must not
//! land in it: each output is compared with the CPU reference once the stream has drained. The
//! same calls are then captured into a CUDA graph on that stream, bound inside the capture, and
//! the graph replayed twice over poisoned outputs.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use nvfp4::backend::cuda::{BoundOp, CudaBackend, DeviceF16, DeviceOp, GemmViews, Workspace};
use nvfp4::bench::Graph;
use nvfp4::check::{compare_outputs, Mode};
use nvfp4::problem::{generate, Output, Problem, Shape};
use nvfp4::{CpuBackend, OutputDtype};

mod common;
use common::gpu;

/// A stream of the backend's context other than its own.
fn side_stream(b: &CudaBackend) -> Arc<CudaStream> {
    b.stream().context().new_stream().expect("a second stream")
}

/// One call as a framework makes it: upload, bind with the caller's workspace, launch on
/// `stream`. Returns the outputs and the bound operation (which the caller may drop at once).
fn call(b: &CudaBackend, p: &Problem, ws: &mut Option<Workspace>, stream: &CudaStream) -> (Vec<DeviceF16>, BoundOp) {
    let out = |shape| b.alloc_output_as(shape, OutputDtype::F16).unwrap();
    let (outs, op) = match p {
        Problem::Gemv(g) => {
            let (a, bb) = (b.upload(&g.a).unwrap(), b.upload(&g.b.to_layout(g.a.layout())).unwrap());
            let c = out([g.a.l(), g.a.rows(), 1]);
            let op = b.bind_with(
                DeviceOp::Gemv { a: &a.view(), b: nvfp4::ops::Act::Nvfp4(&bb.view()), alpha: g.alpha, c: &c.view() },
                ws,
            );
            (vec![c], op)
        }
        Problem::Gemm(g) => {
            let (a, bb) = (b.upload(&g.a).unwrap(), b.upload(&g.b).unwrap());
            let c = out([g.a.l(), g.a.rows(), g.b.rows()]);
            let op = b.bind_with(
                DeviceOp::Gemm { a: nvfp4::ops::Act::Nvfp4(&a.view()), b: &bb.view(), alpha: g.alpha, c: &c.view() },
                ws,
            );
            (vec![c], op)
        }
        Problem::DualGemm(d) => {
            let (a, b1, b2) = (b.upload(&d.a).unwrap(), b.upload(&d.b1).unwrap(), b.upload(&d.b2).unwrap());
            let c = out([d.a.l(), d.a.rows(), d.b1.rows()]);
            let op = DeviceOp::DualGemm {
                a: nvfp4::ops::Act::Nvfp4(&a.view()),
                b1: &b1.view(),
                b2: &b2.view(),
                alpha: d.alpha,
                c: &c.view(),
            };
            (vec![c], b.bind_with(op, ws))
        }
        Problem::GroupedGemm(gg) => {
            let ups: Vec<_> = gg.groups.iter().map(|g| (b.upload(&g.a).unwrap(), b.upload(&g.b).unwrap())).collect();
            let cs: Vec<DeviceF16> = gg.groups.iter().map(|g| out([1, g.a.rows(), g.b.rows()])).collect();
            let views: Vec<_> = ups.iter().zip(&cs).map(|((a, bb), c)| (a.view(), bb.view(), c.view())).collect();
            let gv: Vec<GemmViews<'_>> = views
                .iter()
                .zip(&gg.groups)
                .map(|((a, bb, c), g)| GemmViews { a: a.into(), b: bb, alpha: g.alpha, c })
                .collect();
            let op = b.bind_with(DeviceOp::GroupedGemm(gv), ws);
            (cs, op)
        }
        Problem::Moe(m) => {
            let (a, bb, offsets) =
                (b.upload(&m.a).unwrap(), b.upload(&m.b).unwrap(), b.upload_i32(&m.offsets).unwrap());
            let alphas = m.alpha.as_ref().try_map(|v| b.upload_f32(v)).unwrap();
            let (_, t, n, _) = m.etnk();
            let c = out([1, t, n]);
            let op = DeviceOp::MoeGemm {
                a: nvfp4::ops::Act::Nvfp4(&a.view()),
                b: &bb.view(),
                offsets: &offsets,
                alpha: alphas.as_ref(),
                c: &c.view(),
            };
            (vec![c], b.bind_with(op, ws))
        }
    };
    let op = op.unwrap_or_else(|e| panic!("bind {}: {e}", p.shape()));
    op.launch_on_stream(stream).unwrap();
    (outs, op)
}

/// Pairs of problems of each operation and form, the second larger than the first (so that it
/// grows the shared workspace): gemv, the small GEMM, the skeleton's GEMM, the fallback (K % 32
/// != 0, by value), the dual GEMM, the grouped list on the skeleton and on the fallback (its
/// descriptor table), and the MoE form.
fn pairs() -> Vec<[Shape; 2]> {
    let gemm = |m, n, k| Shape::Gemm { m, n, k, l: 1 };
    let list = |g: &[(usize, usize, usize)]| Shape::GroupedGemm { groups: g.to_vec() };
    vec![
        [Shape::Gemv { m: 128, k: 256, l: 1 }, Shape::Gemv { m: 512, k: 4096, l: 2 }],
        [gemm(128, 256, 256), gemm(64, 96, 512)],
        [gemm(256, 512, 256), gemm(512, 4096, 1024)],
        [gemm(64, 96, 80), gemm(200, 136, 336)],
        [Shape::DualGemm { m: 256, n: 512, k: 256, l: 1 }, Shape::DualGemm { m: 512, n: 768, k: 1024, l: 1 }],
        [list(&[(96, 128, 256), (128, 256, 512)]), list(&[(256, 512, 1024), (72, 384, 512)])],
        [list(&[(64, 72, 48), (40, 96, 64)]), list(&[(128, 64, 80), (96, 200, 112)])],
        [
            Shape::Moe { n: 384, k: 512, counts: vec![40, 0, 76, 8] },
            Shape::Moe { n: 512, k: 1024, counts: vec![9, 300, 0, 71] },
        ],
    ]
}

fn mode(p: &Problem) -> Mode {
    if p.kind().exact_data() {
        Mode::BitExact
    } else {
        Mode::Tolerance
    }
}

fn check(b: &CudaBackend, p: &Problem, outs: &[DeviceF16], reference: &Output, what: &str) {
    let got: Vec<_> = outs.iter().map(|c| b.download(c).unwrap()).collect();
    let got = match p {
        Problem::GroupedGemm(_) => Output::Grouped(got),
        _ => Output::Single(got.into_iter().next().unwrap()),
    };
    let report = compare_outputs(&got, reference, mode(p));
    assert!(report.passed(), "{what} {}: {report}", p.shape());
}

/// Queues about `launches` large GEMMs on `stream` (a few ms of work) and returns what they read.
fn make_busy(b: &CudaBackend, stream: &CudaStream, launches: usize) -> (Vec<DeviceF16>, BoundOp) {
    let big = generate(&Shape::Gemm { m: 4096, n: 4096, k: 4096, l: 1 }, 1).unwrap();
    let (outs, op) = call(b, &big, &mut None, stream);
    for _ in 1..launches {
        op.launch_on_stream(stream).unwrap();
    }
    (outs, op)
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn back_to_back_calls_on_a_busy_stream_drop_everything_but_the_outputs() {
    let b = gpu();
    let side = side_stream(&b);
    let problems: Vec<[Problem; 2]> = pairs()
        .iter()
        .enumerate()
        .map(|(i, [x, y])| [generate(x, 10 + i as u64).unwrap(), generate(y, 20 + i as u64).unwrap()])
        .collect();
    let references: Vec<[Output; 2]> =
        problems.iter().map(|[x, y]| [x.run(&CpuBackend).unwrap(), y.run(&CpuBackend).unwrap()]).collect();
    for round in 0..2 {
        let busy = make_busy(&b, &side, 20);
        let mut ws = None;
        let mut outs = Vec::new();
        for pair in &problems {
            for p in pair {
                // The bound operation, its operands and (after a growth) the old workspace drop
                // here, with the launch still queued behind the busy work.
                outs.push(call(&b, p, &mut ws, &side).0);
            }
        }
        drop((busy, ws));
        side.synchronize().unwrap();
        let expected = references.iter().flatten();
        for ((p, o), r) in problems.iter().flatten().zip(&outs).zip(expected) {
            check(&b, p, o, r, &format!("round {round}"));
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn calls_bound_inside_a_capture_replay_on_their_stream() {
    let b = gpu();
    let side = side_stream(&b);
    let problems: Vec<Problem> =
        pairs().iter().flatten().enumerate().map(|(i, s)| generate(s, 40 + i as u64).unwrap()).collect();
    let references: Vec<Output> = problems.iter().map(|p| p.run(&CpuBackend).unwrap()).collect();
    let mut ws = None;
    let mut calls = Vec::new();
    let graph = Graph::capture(&side, 1, |_| {
        // Binding inside the capture loads modules and allocates on the backend's own stream:
        // the relaxed capture mode of `enter` allows that.
        let _scope = b.enter()?;
        for p in &problems {
            calls.push(call(&b, p, &mut ws, &side));
        }
        Ok(())
    })
    .unwrap();
    for (outs, op) in &calls {
        assert!(op.captured(), "{}", op.describe());
        for c in outs {
            b.poison(c).unwrap();
        }
    }
    b.sync().unwrap();
    for replay in 0..2 {
        graph.replay().unwrap();
        side.synchronize().unwrap();
        for ((p, (outs, _)), r) in problems.iter().zip(&calls).zip(&references) {
            check(&b, p, outs, r, &format!("replay {replay}"));
        }
        for (outs, _) in &calls {
            for c in outs {
                b.poison(c).unwrap();
            }
        }
        b.sync().unwrap();
    }
}
