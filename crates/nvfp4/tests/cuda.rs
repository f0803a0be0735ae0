//! CUDA backend tests. All but the first need an NVIDIA GPU and are `#[ignore]`d: run them with
//! `cargo test --release --test cuda -- --ignored --test-threads=1` (or the binary that
//! scripts/build-gpu.sh copies to gpu-bin/).
//!
//! Tiers: exact (SPEC GEMV / GEMM / grouped data, bit-identical to the CPU reference, both scale
//! layouts, outputs poisoned first), random (extra shapes, signed data, alpha, NaN scales),
//! tolerance (dual GEMM), and probes for the GEMV benchmark shapes: `gemv_timing` (prints a
//! table) and `gemv_profile_target` (for ncu).

use std::time::Instant;

use nvfp4::backend::cuda::{self, CudaBackend, Prepared};
use nvfp4::check::{compare_outputs, Mode};
use nvfp4::format::{Nvfp4Tensor, ScaleLayout};
use nvfp4::ops::{Gemv, Output, Problem};
use nvfp4::problem::{bench_shapes, generate, test_shapes, ProblemKind, Shape};
use nvfp4::{CpuBackend, Error};

const LAYOUTS: [ScaleLayout; 2] = [ScaleLayout::Plain, ScaleLayout::Blocked];

#[test]
fn no_gpu_is_a_typed_error() {
    if cuda::is_available() {
        return; // covered by the GPU tests
    }
    match CudaBackend::new() {
        Err(Error::NoDriver(_)) | Err(Error::NoGpu) => {}
        Err(e) => panic!("expected NoDriver or NoGpu, got {e}"),
        Ok(_) => panic!("CudaBackend::new() succeeded although is_available() is false"),
    }
    // Auto falls back to the CPU with a note instead of failing.
    let (backend, note) = nvfp4::backend::open(nvfp4::backend::BackendChoice::Auto).unwrap();
    assert_eq!(backend.name(), "cpu", "{note}");
}

fn gpu() -> CudaBackend {
    CudaBackend::new().unwrap_or_else(|e| panic!("CUDA backend: {e}"))
}

/// Poison, launch, read back: an unwritten element stays NaN and fails the comparison.
fn run_prepared(prep: &mut Prepared) -> Output {
    prep.poison().unwrap();
    prep.launch().unwrap();
    prep.output().unwrap()
}

/// Runs `p` on the GPU `launches` times (poisoning before each) and checks every result against
/// the CPU reference. Returns the config description.
fn check(b: &CudaBackend, p: &Problem, mode: Mode, launches: usize, what: &str) -> String {
    let reference = p.run(&CpuBackend).unwrap();
    let mut prep = b.prepare(p).unwrap_or_else(|e| panic!("{what}: prepare: {e}"));
    for i in 0..launches {
        let got = run_prepared(&mut prep);
        let report = compare_outputs(&got, &reference, mode);
        assert!(report.passed(), "{what} (launch {i}, {}): {report}", prep.describe());
    }
    prep.describe()
}

fn gemv_from(a: Nvfp4Tensor, b: Nvfp4Tensor, alpha: Option<f32>) -> Problem {
    Problem::Gemv(Gemv::new(a, b, alpha).unwrap())
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemv_spec_tests_bit_exact() {
    let b = gpu();
    for (i, shape) in test_shapes(ProblemKind::Gemv).iter().enumerate() {
        let p = generate(shape, 1000 + i as u64).unwrap();
        for layout in LAYOUTS {
            // Three launches of one Prepared: split-K counters must reset themselves.
            let cfg = check(&b, &p.with_layout(layout), Mode::BitExact, 3, &format!("gemv {shape} {layout:?}"));
            println!("ok gemv {shape} {layout:?}: {cfg}");
        }
    }
}

/// GEMV shapes beyond the SPEC list, with SPEC GEMV data (all positive) and with GEMM data (all
/// 16 codes incl. negatives and -0, scales 0..3; sums still exact in f32), in both layouts.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemv_random_shapes_bit_exact() {
    let b = gpu();
    let mut seed = 7u64;
    for m in [1, 7, 40, 130, 1000] {
        for k in [16, 48, 64, 4112] {
            for l in [1, 3] {
                seed += 1;
                let gemv_data = generate(&Shape::Gemv { m, k, l }, seed).unwrap();
                let Problem::Gemm(g) = generate(&Shape::Gemm { m, n: 1, k, l }, seed).unwrap() else { unreachable!() };
                let signed = gemv_from(g.a, g.b, None);
                for layout in LAYOUTS {
                    for (name, p) in [("gemv data", &gemv_data), ("signed data", &signed)] {
                        let what = format!("gemv {m}x{k}x{l} {layout:?} {name}");
                        check(&b, &p.with_layout(layout), Mode::BitExact, 2, &what);
                    }
                }
            }
        }
    }
}

/// Alpha and global scales go through f64 before the one rounding: still bit-identical. A NaN
/// scale makes exactly its row NaN. Mixed layouts (A blocked, B plain) are accepted.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemv_alpha_nan_and_mixed_layouts() {
    let b = gpu();
    let Problem::Gemm(g) = generate(&Shape::Gemm { m: 300, n: 1, k: 1024, l: 2 }, 99).unwrap() else { unreachable!() };
    let a = g.a.clone().with_global_scale(0.75);
    let p = gemv_from(a, g.b.clone(), Some(0.3));
    check(&b, &p, Mode::BitExact, 1, "gemv alpha");

    let mixed = gemv_from(g.a.to_layout(ScaleLayout::Blocked), g.b.clone(), None);
    check(&b, &mixed, Mode::BitExact, 1, "gemv mixed layouts");

    let mut scales = g.a.scales().to_vec();
    scales[5 * (1024 / 16) + 3] = 0x7F; // batch 0, row 5, block 3
    let a = Nvfp4Tensor::new(2, 300, 1024, g.a.values().to_vec(), scales, ScaleLayout::Plain).unwrap();
    let p = gemv_from(a, g.b.clone(), None);
    let got = b.prepare(&p).map(|mut prep| run_prepared(&mut prep)).unwrap();
    let data = got.tensors()[0].data();
    assert!(data[5].is_nan(), "row with a NaN scale: {}", data[5]);
    assert_eq!(data.iter().filter(|x| x.is_nan()).count(), 1);
    let report = compare_outputs(&got, &p.run(&CpuBackend).unwrap(), Mode::BitExact);
    assert!(report.passed(), "{report}");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemm_bit_exact() {
    let b = gpu();
    // Every SPEC GEMM test shape but 2304x4608x7168, whose f64 CPU reference alone takes
    // minutes (its GPU time is checked by `gemm_fallback_large_shape_speed`).
    let shapes = test_shapes(ProblemKind::Gemm);
    for (i, shape) in shapes.iter().enumerate().filter(|(i, _)| *i != 5) {
        let p = generate(shape, 2000 + i as u64).unwrap();
        let layouts: &[ScaleLayout] = if i % 3 == 0 { &LAYOUTS } else { &LAYOUTS[..1] };
        for &layout in layouts {
            let t0 = Instant::now();
            let cfg = check(&b, &p.with_layout(layout), Mode::BitExact, 1, &format!("gemm {shape} {layout:?}"));
            println!("ok gemm {shape} {layout:?} ({:.0} ms incl. reference): {cfg}", t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    // Odd sizes: M, N not multiples of the tile, K % 32 == 16, L > 1.
    for (j, shape) in
        [Shape::Gemm { m: 1, n: 1, k: 16, l: 1 }, Shape::Gemm { m: 65, n: 3, k: 48, l: 3 }].iter().enumerate()
    {
        let p = generate(shape, 2100 + j as u64).unwrap();
        for layout in LAYOUTS {
            check(&b, &p.with_layout(layout), Mode::BitExact, 1, &format!("gemm {shape} {layout:?}"));
        }
    }
}

/// The largest SPEC GEMM test shape must run well under a second (the wgmma kernel where it
/// accepts the shape, else the fallback).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemm_large_shape_speed() {
    let b = gpu();
    let p = generate(&Shape::Gemm { m: 2304, n: 4608, k: 7168, l: 1 }, 5).unwrap();
    let mut prep = b.prepare(&p).unwrap();
    run_prepared(&mut prep); // warm-up
    let t0 = Instant::now();
    prep.launch().unwrap();
    prep.output().unwrap();
    let secs = t0.elapsed().as_secs_f64();
    println!("gemm 2304x4608x7168 ({}): {:.2} ms incl. download", prep.describe(), secs * 1e3);
    assert!(secs < 0.5, "GEMM took {secs:.3} s");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn dual_gemm_fallback_tolerance() {
    let b = gpu();
    // The SPEC dual GEMM test shapes whose CPU reference takes seconds, not minutes.
    let shapes = test_shapes(ProblemKind::DualGemm);
    for (i, shape) in shapes.iter().enumerate().filter(|(i, _)| ![4, 5].contains(i)) {
        let p = generate(shape, 3000 + i as u64).unwrap();
        let layout = LAYOUTS[i % 2];
        let cfg = check(&b, &p.with_layout(layout), Mode::Tolerance, 1, &format!("dual {shape} {layout:?}"));
        println!("ok dual {shape} {layout:?}: {cfg}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn grouped_gemm_fallback_bit_exact() {
    let b = gpu();
    for (i, shape) in test_shapes(ProblemKind::GroupedGemm).iter().enumerate() {
        let p = generate(shape, 4000 + i as u64).unwrap();
        let layout = LAYOUTS[i % 2];
        check(&b, &p.with_layout(layout), Mode::BitExact, 2, &format!("grouped {shape} {layout:?}"));
    }
    let p = generate(&bench_shapes(ProblemKind::GroupedGemm)[3], 4100).unwrap();
    let cfg = check(&b, &p, Mode::BitExact, 1, "grouped bench:3");
    println!("ok grouped bench:3: {cfg}");
}

// ---- timing probe ------------------------------------------------------------------------------

fn median(v: &mut [f32]) -> f32 {
    v.sort_by(f32::total_cmp);
    v[v.len() / 2]
}

/// Device-to-device copy bandwidth (bytes read + written per second), the GEMV's ceiling.
fn copy_bandwidth(b: &CudaBackend) -> f64 {
    let s = b.stream();
    let n = 1usize << 30;
    let src = s.alloc_zeros::<u8>(n).unwrap();
    let mut dst = s.alloc_zeros::<u8>(n).unwrap();
    let (e0, e1) = events(b);
    let mut ms = Vec::new();
    for i in 0..12 {
        e0.record(s).unwrap();
        s.memcpy_dtod(&src, &mut dst).unwrap();
        e1.record(s).unwrap();
        let t = e0.elapsed_ms(&e1).unwrap();
        if i >= 2 {
            ms.push(t);
        }
    }
    2.0 * n as f64 / (median(&mut ms) as f64 * 1e-3)
}

fn events(b: &CudaBackend) -> (cudarc::driver::CudaEvent, cudarc::driver::CudaEvent) {
    let ctx = b.stream().context();
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    (ctx.new_event(flags).unwrap(), ctx.new_event(flags).unwrap())
}

/// L2 size of the H100/H200 (50/60 MB): input sets rotate over more than 3x this.
const L2_BYTES: f64 = 60e6;

fn median_min(mut us: Vec<f32>) -> (f32, f32) {
    let min = us.iter().copied().fold(f32::INFINITY, f32::min);
    (median(&mut us), min)
}

/// µs of one launch per sample, L2 cold by rotation: `preps` hold identical problems in distinct
/// buffers totalling > 3x L2, launched round-robin, so no sample finds its inputs in L2 and no
/// dirty line of a flush is written back during the sample.
fn time_rotating(b: &CudaBackend, preps: &mut [Prepared], samples: usize) -> (f32, f32) {
    let s = b.stream();
    let (e0, e1) = events(b);
    for p in preps.iter_mut() {
        p.launch().unwrap();
    }
    let n = preps.len();
    let us = (0..samples)
        .map(|i| {
            e0.record(s).unwrap();
            preps[i % n].launch().unwrap();
            e1.record(s).unwrap();
            e0.elapsed_ms(&e1).unwrap() * 1e3
        })
        .collect();
    median_min(us)
}

/// µs of one launch per sample, L2 flushed by a 512 MB memset before each sample (SPEC §7's
/// "write larger than 2x L2"). NOTE: the memset leaves up to a whole L2 of dirty lines, whose
/// write-back lands inside the timed kernel: up to ~L2 bytes of extra DRAM traffic.
fn time_memset_flush(b: &CudaBackend, prep: &mut Prepared, samples: usize) -> (f32, f32) {
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

/// Times the GEMV benchmark shapes (both layouts) against the copy ceiling,
/// L2 cold by rotating input sets and, for comparison, by a memset flush. Each configuration is
/// checked bit-exactly before it is timed.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemv_timing() {
    let b = gpu();
    let bw = copy_bandwidth(&b);
    println!("device {} ({} SMs), copy bandwidth {:.3} TB/s", b.device_name(), b.sm_count(), bw / 1e12);
    let mut rows = Vec::new();
    for (i, shape) in bench_shapes(ProblemKind::Gemv).iter().enumerate() {
        let base = generate(shape, 500 + i as u64).unwrap();
        let reference = base.run(&CpuBackend).unwrap();
        for layout in LAYOUTS {
            let p = base.with_layout(layout);
            let bytes = p.bytes() as f64;
            let sets = (3.0 * L2_BYTES / bytes).ceil() as usize + 1;
            {
                let mut preps: Vec<Prepared> = (0..sets).map(|_| b.prepare(&p).unwrap()).collect();
                let report = compare_outputs(&run_prepared(&mut preps[0]), &reference, Mode::BitExact);
                assert!(report.passed(), "gemv {shape} {layout:?}: {report}");
                let (med, min) = time_rotating(&b, &mut preps, 60);
                let (fmed, _) = time_memset_flush(&b, &mut preps[0], 30);
                let floor = bytes / bw * 1e6;
                rows.push(format!(
                    "{:<14} {:<8} {:>7.2} us (min {:>6.2}) {:>6.3} TB/s {:>5.1}% of copy, floor {:>6.2} us | \
                     memset-flushed {:>6.2} us | {}",
                    shape.to_string(),
                    format!("{layout:?}"),
                    med,
                    min,
                    bytes / (med as f64 * 1e-6) / 1e12,
                    100.0 * floor / med as f64,
                    floor,
                    fmed,
                    preps[0].describe()
                ));
                println!("{}", rows.last().unwrap());
            }
        }
    }
    println!("\nGEMV timing summary (L2 cold by rotating input sets, median of 60; copy {:.3} TB/s):", bw / 1e12);
    for r in rows {
        println!("{r}");
    }
}

/// Launches each GEMV benchmark shape a few times behind an L2 flush, nothing else: a target for
/// `ncu -k regex:gemv gpu-bin/test-cuda --ignored gemv_profile_target`.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemv_profile_target() {
    let b = gpu();
    let s = b.stream();
    let mut flush = s.alloc_zeros::<u8>(512 << 20).unwrap();
    for (i, shape) in bench_shapes(ProblemKind::Gemv).iter().enumerate() {
        let mut prep = b.prepare(&generate(shape, 600 + i as u64).unwrap()).unwrap();
        println!("{shape}: {}", prep.describe());
        for _ in 0..3 {
            s.memset_zeros(&mut flush).unwrap();
            prep.launch().unwrap();
        }
        prep.output().unwrap();
    }
}
