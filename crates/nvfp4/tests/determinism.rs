//! Determinism on the GPU. Every benchmark shape of every operation, launched 100 times from one
//! prepared problem (outputs poisoned before each launch), must give the same f16 bits every time,
//! including the GEMM and the dual GEMM under forced split-K, stream-K and CTA-pair schedules; and
//! several host threads sharing one backend, each running operations at once, must each get the
//! reference's answer.
//!
//! The GPU tests are `#[ignore]`d; run them on a Hopper GPU with
//! `cargo test --release --test determinism -- --ignored` (the forced schedules are the
//! backend's overrides, so the tests run on any number of threads). About a
//! minute on an H200, most of it the CPU reference of the benchmark shapes.

use nvfp4::backend::cuda::sm90::Op;
use nvfp4::backend::cuda::CudaBackend;
use nvfp4::check::{compare_outputs, mode_for};
use nvfp4::problem::{bench_shapes, generate, test_shapes};
use nvfp4::{Backend, CpuBackend, Error, Output, Problem, ProblemKind};

mod common;
use common::{gpu, WAVE_COUNTS, WAVE_NK};

/// Launches per prepared problem.
const LAUNCHES: usize = 100;

/// GEMM schedules forced through `NVFP4_GEMM_SM90`: split-K in 2 and 3, stream-K, and stream-K
/// over CTA pairs, on two tile shapes.
const SCHEDULES: [&str; 4] = ["m128n128s2", "m128n128sk", "m256n64s3", "m128n128c2sk"];

/// Host threads sharing one backend.
const THREADS: usize = 4;

/// Rounds each thread makes over its operations.
const ROUNDS: usize = 4;

/// The f16 bits of every output element, tensor by tensor.
fn bits(out: &Output) -> Vec<Vec<u16>> {
    out.tensors().iter().map(|t| t.data().iter().map(|v| v.to_bits()).collect()).collect()
}

/// Prepares `p` once, launches it [`LAUNCHES`] times (poisoned before each, so an element left
/// unwritten shows), and asserts that every launch gives the bits of the first and that the
/// first agrees with `reference`. Returns the launch configuration.
fn repeat(b: &CudaBackend, p: &Problem, reference: &Output, what: &str) -> String {
    let mut prep = b.prepare(p).unwrap_or_else(|e| panic!("{what}: prepare: {e}"));
    let mut first = None;
    for i in 0..LAUNCHES {
        prep.poison().unwrap();
        prep.launch().unwrap_or_else(|e| panic!("{what}: launch {i}: {e}"));
        let out = prep.output().unwrap_or_else(|e| panic!("{what}: output {i}: {e}"));
        match &first {
            None => {
                let report = compare_outputs(&out, reference, mode_for(p.kind()));
                assert!(report.passed(), "{what} ({}): first launch against the reference: {report}", prep.describe());
                first = Some(bits(&out));
            }
            Some(want) => {
                let got = bits(&out);
                if &got != want {
                    let (t, j) = want
                        .iter()
                        .zip(&got)
                        .enumerate()
                        .find_map(|(t, (w, g))| w.iter().zip(g).position(|(a, b)| a != b).map(|j| (t, j)))
                        .unwrap_or((0, 0));
                    panic!(
                        "{what} ({}): launch {i} differs from launch 0, first at tensor {t} element {j}",
                        prep.describe()
                    );
                }
            }
        }
    }
    prep.describe()
}

/// Every benchmark shape of `kind`, launched [`LAUNCHES`] times each.
fn bench_shapes_repeat(kind: ProblemKind) {
    let b = gpu();
    for (i, shape) in bench_shapes(kind).iter().enumerate() {
        let p = generate(shape, 4200 + i as u64).unwrap();
        let reference = p.run(&CpuBackend).unwrap();
        let cfg = repeat(&b, &p, &reference, &format!("{kind} {shape}"));
        println!("ok {kind} {shape} x{LAUNCHES}: {cfg}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemv_bench_shapes_repeat_bit_identically() {
    bench_shapes_repeat(ProblemKind::Gemv);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn grouped_gemm_bench_shapes_repeat_bit_identically() {
    bench_shapes_repeat(ProblemKind::GroupedGemm);
}

/// A MoE launch of more than two waves of prefill tiles: whole waves dealt round robin, the rest
/// stream-K pieces summed across CTAs (sm90/grouped.cuh), empty experts among the routed ones.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn moe_of_whole_waves_repeats_bit_identically() {
    let b = gpu();
    let (n, k) = WAVE_NK;
    let p = generate(&nvfp4::problem::Shape::Moe { n, k, counts: WAVE_COUNTS.to_vec() }, 4400).unwrap();
    let reference = p.run(&CpuBackend).unwrap();
    let cfg = repeat(&b, &p, &reference, "moe of whole waves");
    assert!(cfg.contains("whole waves dealt"), "{cfg}");
    println!("ok moe of whole waves x{LAUNCHES}: {cfg}");
}

/// Every benchmark shape of `kind`, [`LAUNCHES`] times under its automatic configuration and under
/// each of `schedules` forced for skeleton operation `op`; the forced ones must change the launch.
fn schedules_repeat(kind: ProblemKind, op: Op, schedules: &[&str]) {
    let b = gpu();
    for (i, shape) in bench_shapes(kind).iter().enumerate() {
        let p = generate(shape, 4300 + i as u64).unwrap();
        let reference = p.run(&CpuBackend).unwrap();
        let mut configs = vec![repeat(&b, &p, &reference, &format!("{kind} {shape} auto"))];
        for forced in schedules {
            let what = format!("{kind} {shape} {forced}");
            configs.push(common::with_forced(&b, op, forced, |b| repeat(b, &p, &reference, &what)));
        }
        for (name, cfg) in std::iter::once(&"auto").chain(schedules).zip(&configs) {
            println!("ok {kind} {shape} {name} x{LAUNCHES}: {cfg}");
        }
        configs.sort();
        configs.dedup();
        assert!(configs.len() > 2, "{kind} {shape}: the forced schedules did not change the launch: {configs:?}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemm_bench_shapes_repeat_bit_identically_under_every_schedule() {
    schedules_repeat(ProblemKind::Gemm, Op::Gemm, &SCHEDULES);
}

/// Dual GEMM schedules forced through `NVFP4_DUAL_SM90`: split-K and stream-K of the 128 x 256
/// tile (partials summed through shared memory), split-K of the 128 x 128 tile (through
/// registers), stream-K over CTA pairs.
const DUAL_SCHEDULES: [&str; 4] = ["m128n256s2", "m128n256sk", "m128n128s2", "m128n128c2sk"];

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn dual_gemm_bench_shapes_repeat_bit_identically_under_every_schedule() {
    schedules_repeat(ProblemKind::DualGemm, Op::Dual, &DUAL_SCHEDULES);
}

/// One operation for a thread: the problem, its reference, and a label.
struct Job {
    what: String,
    problem: Problem,
    reference: Output,
}

/// Runs `p` through the backend's `Backend` methods (upload, launch, download in one call).
fn run_through_trait(b: &dyn Backend, p: &Problem) -> nvfp4::Result<Output> {
    Ok(match p {
        Problem::Gemv(x) => Output::Single(b.gemv(x)?),
        Problem::Gemm(x) => Output::Single(b.gemm(x)?),
        Problem::DualGemm(x) => Output::Single(b.dual_gemm(x)?),
        Problem::GroupedGemm(x) => Output::Grouped(b.grouped_gemm(x)?),
        Problem::Moe(x) => Output::Single(b.moe_gemm(x)?),
    })
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn threads_sharing_one_backend_each_get_the_reference() {
    let b = gpu();
    // Small catalogue shapes of every operation, so that many launches overlap.
    let picks = [
        (ProblemKind::Gemv, [0, 3, 6]),
        (ProblemKind::Gemm, [0, 2, 8]),
        (ProblemKind::DualGemm, [1, 3, 8]),
        (ProblemKind::GroupedGemm, [0, 3, 8]),
    ];
    let jobs: Vec<Job> = picks
        .iter()
        .flat_map(|&(kind, idx)| idx.map(move |i| (kind, i)))
        .map(|(kind, i)| {
            let shape = &test_shapes(kind)[i];
            let problem = generate(shape, 4400 + i as u64).unwrap();
            let reference = problem.run(&CpuBackend).unwrap();
            Job { what: format!("{kind} test:{i} {shape}"), problem, reference }
        })
        .collect();
    let (b, jobs) = (&b, &jobs);
    let counts: Vec<usize> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                s.spawn(move || {
                    let mut done = 0;
                    for round in 0..ROUNDS {
                        // Each thread walks the jobs from its own starting point, so different
                        // operations run at once.
                        for j in 0..jobs.len() {
                            let job = &jobs[(j + t * jobs.len() / THREADS + round) % jobs.len()];
                            let got = run_through_trait(b, &job.problem)
                                .unwrap_or_else(|e| panic!("thread {t}, {}: {e}", job.what));
                            let report = compare_outputs(&got, &job.reference, mode_for(job.problem.kind()));
                            assert!(report.passed(), "thread {t} round {round}, {}: {report}", job.what);
                            done += 1;
                        }
                    }
                    done
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a thread failed")).collect()
    });
    assert_eq!(counts, vec![ROUNDS * jobs.len(); THREADS]);
    println!("ok {THREADS} threads x {ROUNDS} rounds x {} operations on one backend", jobs.len());
}

/// Without a GPU, asking for the CUDA backend is a typed error (the GPU tests above cover the
/// machines that have one).
#[test]
fn without_a_gpu_the_backend_is_a_typed_error() {
    match CudaBackend::new() {
        Ok(_) => {}
        Err(Error::NoDriver(_) | Error::NoGpu) => {}
        Err(e) => panic!("expected NoDriver or NoGpu without a GPU, got {e:?}"),
    }
}
