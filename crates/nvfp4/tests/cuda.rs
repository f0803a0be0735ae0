//! CUDA backend tests. All but the first need an NVIDIA GPU and are `#[ignore]`d: run them with
//! `cargo test --release --test cuda -- --ignored` (or the binary that
//! scripts/build-gpu.sh copies to gpu-bin/).
//!
//! Tiers: exact (SPEC GEMV / GEMM / grouped data, bit-identical to the CPU reference, both scale
//! layouts, outputs poisoned first), random (extra shapes, signed data, alpha, NaN scales),
//! tolerance (dual GEMM). Timing diagnostics live in `examples/dev_gemv_diag.rs`, not here.

use std::time::Instant;

use nvfp4::backend::cuda::{self, CudaBackend};
use nvfp4::check::{compare_outputs, Mode};

mod common;
use common::{check, gpu, run_prepared};

use nvfp4::format::{Nvfp4Tensor, ScaleLayout};
use nvfp4::ops::{Gemm, Gemv};
use nvfp4::problem::Problem;
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
    // Every SPEC GEMM test shape but 2304x4608x7168, whose CPU reference is slow on small
    // machines (`nvfp4 check --backend cuda gemm` covers it).
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
    // Odd sizes: M, N not multiples of the tile, K % 32 == 16, L > 1; one activation row (the
    // GEMV kernel's Gemm form: split-K, the 8-byte chunks, batches, a decode projection).
    let odd = [
        Shape::Gemm { m: 1, n: 1, k: 16, l: 1 },
        Shape::Gemm { m: 65, n: 3, k: 48, l: 3 },
        Shape::Gemm { m: 1, n: 300, k: 4112, l: 2 },
        Shape::Gemm { m: 1, n: 7168, k: 2048, l: 1 },
        // 2 to 8 rows: the W4A16 GEMV's `_cols` kernels, the activation decoded as it is staged.
        Shape::Gemm { m: 3, n: 130, k: 48, l: 1 },
        Shape::Gemm { m: 4, n: 300, k: 4112, l: 2 },
        Shape::Gemm { m: 8, n: 7168, k: 2048, l: 1 },
    ];
    for (j, shape) in odd.iter().enumerate() {
        let p = generate(shape, 2100 + j as u64).unwrap();
        for layout in LAYOUTS {
            let cfg = check(&b, &p.with_layout(layout), Mode::BitExact, 1, &format!("gemm {shape} {layout:?}"));
            println!("ok gemm {shape} {layout:?}: {cfg}");
        }
    }
}

/// A W4A4 GEMM of 2 to 8 rows (the W4A16 GEMV's `_cols` kernels: the activation decoded as it is
/// staged): alpha and both global scales round once; a NaN activation scale poisons exactly its
/// row, a NaN weight scale exactly its column; blocked scales; mixed layouts go to another kernel
/// and still match.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn few_rows_gemm_alpha_nan_and_layouts() {
    let b = gpu();
    let (m, n, k, l) = (5, 300, 1024, 2);
    let Problem::Gemm(g) = generate(&Shape::Gemm { m, n, k, l }, 98).unwrap() else { unreachable!() };
    let scaled = Gemm::new(g.a.clone().with_global_scale(0.75), g.b.clone().with_global_scale(1.5), Some(0.3));
    let cfg = check(&b, &Problem::Gemm(scaled.unwrap()), Mode::BitExact, 2, "5-row gemm, alpha");
    assert!(cfg.starts_with("gemv16_nvfp4_sm90_nvfp4_plain_to_f16_cols"), "{cfg}");

    // Activation row 2 of batch 1, block 3; weight row 7 of batch 0, block 10.
    let (mut xs, mut ws) = (g.a.scales().to_vec(), g.b.scales().to_vec());
    xs[(m + 2) * (k / 16) + 3] = 0x7F;
    ws[7 * (k / 16) + 10] = 0x7F;
    let a = Nvfp4Tensor::new(l, m, k, g.a.values().to_vec(), xs, ScaleLayout::Plain).unwrap();
    let w = Nvfp4Tensor::new(l, n, k, g.b.values().to_vec(), ws, ScaleLayout::Plain).unwrap();
    let p = Problem::Gemm(Gemm::new(a, w, None).unwrap());
    let got = b.prepare(&p).map(|mut prep| run_prepared(&mut prep)).unwrap();
    for (i, v) in got.tensors()[0].data().iter().enumerate() {
        let (batch, row, col) = (i / (m * n), (i / n) % m, i % n);
        let nan = (batch == 1 && row == 2) || (batch == 0 && col == 7);
        assert_eq!(v.is_nan(), nan, "element {i} (batch {batch}, row {row}, column {col}): {v}");
    }
    let report = compare_outputs(&got, &p.run(&CpuBackend).unwrap(), Mode::BitExact);
    assert!(report.passed(), "{report}");

    let cfg = check(&b, &p.with_layout(ScaleLayout::Blocked), Mode::BitExact, 1, "5-row gemm, blocked");
    assert!(cfg.starts_with("gemv16_nvfp4_sm90_nvfp4_blocked_to_f16_cols"), "{cfg}");
    let Problem::Gemm(g) = &p else { unreachable!() };
    let mixed = Problem::Gemm(Gemm::new(g.a.to_layout(ScaleLayout::Blocked), g.b.clone(), None).unwrap());
    let cfg = check(&b, &mixed, Mode::BitExact, 1, "5-row gemm, mixed layouts");
    assert!(!cfg.contains("_cols"), "{cfg}");
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
fn grouped_gemm_bit_exact() {
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
