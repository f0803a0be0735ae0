//! The graph protocol's pieces on the GPU (`#[ignore]`d without one): replicas of a prepared
//! problem share its operands and write outputs of their own, launches captured in one CUDA graph
//! (chained with programmatic dependent launch where the kernel supports it) produce the
//! reference bits in every launch's output, and the floor kernels run in a graph.

use nvfp4::backend::cuda::{Prepared, ReadKernel, ReadSetting};
use nvfp4::bench::{Graph, Rotation};
use nvfp4::check::{compare_outputs, Mode};
use nvfp4::problem::{bench_shapes, generate, test_shapes, ProblemKind};
use nvfp4::CpuBackend;

mod common;
use common::gpu;

/// Every problem kind, one test shape and one bench shape: 3 sets, 2 launches per set, the
/// graph replayed with every output poisoned, each launch's output compared bit for bit (or
/// within tolerance for the dual GEMM) with the CPU reference.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn graph_launches_over_replicas_match_the_reference() {
    let b = gpu();
    for kind in ProblemKind::ALL {
        let mut shapes = test_shapes(kind);
        shapes.truncate(1);
        shapes.extend(bench_shapes(kind).into_iter().take(1));
        for shape in shapes {
            if matches!(shape, nvfp4::Shape::Moe { .. }) {
                continue;
            }
            let p = generate(&shape, 3).unwrap();
            let reference = p.run(&CpuBackend).unwrap();
            let mode = if kind.exact_data() { Mode::BitExact } else { Mode::Tolerance };
            let rotation = Rotation { sets: 3, launches: 6, set_bytes: 0 };
            let mut launches: Vec<Prepared> = (0..rotation.sets).map(|_| b.prepare(&p).unwrap()).collect();
            for i in rotation.sets..rotation.launches {
                let r = b.replica(&launches[rotation.set_of(i)]).unwrap();
                launches.push(r);
            }
            let chained = launches[0].chains();
            let graph = Graph::capture(b.stream(), rotation.launches, |i| {
                if i > 0 && chained {
                    launches[i].launch_chained()
                } else {
                    launches[i].launch()
                }
            })
            .unwrap();
            for replay in 0..2 {
                for l in launches.iter_mut() {
                    l.poison().unwrap();
                }
                graph.replay().unwrap();
                for (i, l) in launches.iter().enumerate() {
                    let report = compare_outputs(&l.output().unwrap(), &reference, mode);
                    assert!(report.passed(), "{kind} {shape} replay {replay} launch {i}: {report}");
                }
            }
            // A replica writes only its own output: poisoning the others leaves it intact.
            launches[3].launch().unwrap();
            for (i, l) in launches.iter_mut().enumerate() {
                if i != 3 {
                    l.poison().unwrap();
                }
            }
            assert!(compare_outputs(&launches[3].output().unwrap(), &reference, mode).passed());
            assert!(graph.time_us(1, 3).unwrap().median() > 0.0);
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn floor_kernels_run_cold_and_in_a_graph() {
    let b = gpu();
    let floors = b.floors().unwrap();
    let src = floors.source(1 << 20).unwrap();
    assert_eq!(src.bytes(), 1 << 20);
    let sums = [floors.sums().unwrap(), floors.sums().unwrap()];
    let setting = ReadSetting { kernel: ReadKernel::Contiguous8, ctas_per_sm: 2, threads: 256 };
    floors.launch_read(setting, &src, &sums[0], false).unwrap();
    floors.launch_empty(false).unwrap();
    let g = Graph::capture(b.stream(), 4, |i| {
        floors.launch_empty(i > 0)?;
        floors.launch_read(setting, &src, &sums[i % 2], i > 0)
    })
    .unwrap();
    assert!(g.time_us(1, 3).unwrap().median() > 0.0);
    for bad in [ReadSetting { ctas_per_sm: 0, ..setting }, ReadSetting { threads: 100, ..setting }] {
        assert!(floors.launch_read(bad, &src, &sums[0], false).is_err());
    }
    // A ragged range (not a whole number of warps per CTA) in a chained graph: the case that hung
    // a warp barrier reached by part of a warp.
    let ragged = floors.source(33_030_144 + 48).unwrap();
    let g = Graph::capture(b.stream(), 24, |i| floors.launch_read(setting, &ragged, &sums[i % 2], i > 0)).unwrap();
    assert!(g.time_us(1, 2).unwrap().median() > 0.0);
    b.sync().unwrap();
}
