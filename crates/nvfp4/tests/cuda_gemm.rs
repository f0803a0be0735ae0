//! GPU tests of the wgmma GEMM (kernels/gemm_sm90.cu on the skeleton kernels/sm90/). They need an NVIDIA Hopper GPU and are
//! `#[ignore]`d: `cargo test --release --test cuda_gemm -- --ignored`.
//!
//! Tiers: exact (SPEC GEMM data, bit-identical to the CPU reference, both scale layouts, outputs
//! poisoned first, repeated launches so split-K counters must reset), every variant and split
//! forced on edge shapes (ragged M/N, L > 1, K tails), random signed data with NaN scales and
//! alpha (tolerance), and the small sweep the sanitizer runs (`gemm_sm90_sanitizer_sweep`).

use nvfp4::backend::cuda::sm90::{
    self, Forced, Op,
    Schedule::{Split, SplitInCluster, StreamK},
    VARIANTS,
};
use nvfp4::backend::cuda::CudaBackend;
use nvfp4::check::Mode;
use nvfp4::format::ScaleLayout;
use nvfp4::ops::Gemm;
use nvfp4::problem::Problem;
use nvfp4::problem::{generate, test_shapes, ProblemKind, Shape};
use nvfp4::CpuBackend;

mod common;
use common::{check, check_against, gpu, spread_scales};

const LAYOUTS: [ScaleLayout; 2] = [ScaleLayout::Plain, ScaleLayout::Blocked];

fn gemm_problem(m: usize, n: usize, k: usize, l: usize, seed: u64) -> Problem {
    generate(&Shape::Gemm { m, n, k, l }, seed).unwrap()
}

/// `b` with `NVFP4_GEMM_SM90`'s forced choice `value`, for `f`.
fn with_forced<T>(b: &CudaBackend, value: &str, f: impl FnOnce(&CudaBackend) -> T) -> T {
    common::with_forced(b, Op::Gemm, value, f)
}

/// Whether the skeleton takes `p` on `b` (under its overrides).
fn takes(b: &CudaBackend, p: &Problem) -> bool {
    let Problem::Gemm(g) = p else { unreachable!() };
    sm90::rejects(Op::Gemm, g.mnkl(), b.overrides().gemm).is_none()
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemm_sm90_spec_tests_bit_exact() {
    let b = gpu();
    // On the skeleton even where the small kernel would be chosen (tests/cuda_small.rs has it).
    with_forced(&b, "sm90", |b| {
        for (i, shape) in test_shapes(ProblemKind::Gemm).iter().enumerate() {
            let p = generate(shape, 2000 + i as u64).unwrap();
            assert!(takes(b, &p), "{shape}: the SPEC shapes must run on the wgmma kernel");
            let reference = p.run(&CpuBackend).unwrap();
            for layout in LAYOUTS {
                let what = format!("gemm {shape} {layout:?}");
                let cfg = check_against(b, &p.with_layout(layout), &reference, Mode::BitExact, 2, &what);
                assert!(cfg.starts_with("gemm_nvfp4_sm90_ws_"), "{cfg}");
                println!("ok {shape} {layout:?}: {cfg}");
            }
        }
    });
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemm_sm90_check_cases_bit_exact() {
    // The `nvfp4 check` cases: SPEC shapes and the extra edge shapes (forced onto the wgmma
    // kernel, which takes those with K % 32 == 0; the general kernel the rest), layouts
    // alternating, some alpha.
    let b = gpu();
    let mut on_sm90 = 0;
    with_forced(&b, "sm90", |b| {
        for spec in nvfp4::check::cases(ProblemKind::Gemm, 77) {
            let p = nvfp4::check::case_problem(&spec).unwrap();
            let what = format!("{} {}", spec.label, spec.shape);
            let cfg = check(b, &p.with_layout(spec.layout), Mode::BitExact, 1, &what);
            let want = if takes(b, &p) { "gemm_nvfp4_sm90_ws_" } else { "gemm_nvfp4_sm90_mma" };
            assert!(cfg.starts_with(want), "{what}: {cfg}");
            on_sm90 += usize::from(takes(b, &p));
            if spec.label.ends_with(":0") || spec.label.ends_with('7') {
                println!("ok {what}: {cfg}");
            }
        }
    });
    assert!(on_sm90 > 0);
}

/// The mma.sync fallback forced onto every GEMM (`NVFP4_GEMM_SM90=off`): K-tiles fewer than,
/// equal to and not a multiple of the prefetch depth, K tails of 16 and 48, L > 1, ragged M and
/// N, both layouts, alpha; bit-exact, two poisoned launches each (the one-problem launch passes
/// its problem by value).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemm_fallback_forced_bit_exact() {
    let b = gpu();
    let shapes =
        [(1, 1, 16, 1), (65, 70, 80, 2), (64, 64, 256, 1), (130, 7, 272, 1), (33, 129, 4112, 1), (5, 300, 1008, 3)];
    with_forced(&b, "off", |b| {
        for (i, &(m, n, k, l)) in shapes.iter().enumerate() {
            let Problem::Gemm(g) = gemm_problem(m, n, k, l, 8100 + i as u64) else { unreachable!() };
            let alpha = [None, Some(0.375)][i % 2];
            let p = Problem::Gemm(Gemm::new(g.a, g.b, alpha).unwrap()).with_layout(LAYOUTS[i % 2]);
            let cfg = check(b, &p, Mode::BitExact, 2, &format!("fallback {m}x{n}x{k}x{l}"));
            assert!(cfg.starts_with("gemm_nvfp4_sm90_mma"), "{cfg}");
            println!("ok fallback {m}x{n}x{k}x{l}: {cfg}");
        }
    });
}

/// Every variant, with automatic and forced splits, stream-K and CTA pairs, on shapes with ragged tiles in W and X,
/// L = 3, K not a multiple of the 64-element stage, and both orientations.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemm_sm90_every_variant_and_split() {
    let b = gpu();
    let shapes = [(40, 300, 224, 3), (130, 72, 1056, 1), (257, 263, 96, 2), (7, 520, 4096, 1), (300, 17, 512, 1)];
    for (si, &(m, n, k, l)) in shapes.iter().enumerate() {
        let p = gemm_problem(m, n, k, l, 300 + si as u64);
        let reference = p.run(&CpuBackend).unwrap();
        for v in VARIANTS {
            let configs = [
                (None, None),
                (None, Some(Split(1))),
                (None, Some(Split(3))),
                (None, Some(SplitInCluster(2))),
                (None, Some(Split(7))),
                (Some(1), Some(StreamK)),
                (Some(2), None),
                (Some(2), Some(Split(3))),
                (Some(2), Some(StreamK)),
            ];
            for (j, (cluster, schedule)) in configs.into_iter().enumerate() {
                let c = cluster.map_or(String::new(), |c| format!("c{c}"));
                let name = match schedule {
                    Some(Split(s)) => format!("m{}n{}{c}s{s}", v.bm, v.bn),
                    Some(SplitInCluster(s)) => format!("m{}n{}{c}s{s}d", v.bm, v.bn),
                    Some(StreamK) => format!("m{}n{}{c}sk", v.bm, v.bn),
                    None => format!("m{}n{}{c}", v.bm, v.bn),
                };
                assert_eq!(Forced::parse(&name), Some(Forced::Config(v, cluster, schedule)));
                let layout = LAYOUTS[(si + j) % 2];
                let what = format!("{m}x{n}x{k}x{l} {name} {layout:?}");
                let cfg = with_forced(&b, &name, |b| {
                    check_against(b, &p.with_layout(layout), &reference, Mode::BitExact, 2, &what)
                });
                if schedule.is_none() || schedule == Some(StreamK) || cluster == Some(2) {
                    println!("ok {what}: {cfg}");
                }
            }
        }
    }
}

/// Split-K summed in clusters (`s2d`: the pieces of a tile in one cluster, summed in the first
/// CTA's shared memory) and the same splits summed through the workspace (`s2`): 2, 3 and 4
/// pieces, ragged W and X tiles, L = 3, a K tail inside the last piece, both layouts, repeated
/// launches; the plan must say which sum it runs.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemm_sm90_cluster_sum_of_k_pieces() {
    let b = gpu();
    let shapes = [(128, 7168, 2048, 1), (7, 520, 4096, 1), (40, 300, 1056, 3), (130, 1000, 512, 1)];
    let mut clustered_runs = 0;
    for (si, &(m, n, k, l)) in shapes.iter().enumerate() {
        let p = gemm_problem(m, n, k, l, 500 + si as u64);
        let reference = p.run(&CpuBackend).unwrap();
        for (j, v) in ["m128n128", "m256n64", "m256n16"].into_iter().enumerate() {
            for s in 2..=4 {
                for d in ["d", ""] {
                    let name = format!("{v}s{s}{d}");
                    let layout = LAYOUTS[(si + j + s) % 2];
                    let what = format!("{m}x{n}x{k}x{l} {name} {layout:?}");
                    let cfg = with_forced(&b, &name, |b| {
                        check_against(b, &p.with_layout(layout), &reference, Mode::BitExact, 3, &what)
                    });
                    let clustered = cfg.contains("summed in clusters");
                    assert!(!(clustered && d.is_empty()), "{what}: the workspace sum unless forced: {cfg}");
                    clustered_runs += usize::from(clustered);
                    println!("ok {what}: {cfg}");
                }
            }
        }
    }
    assert!(clustered_runs >= 20, "only {clustered_runs} runs summed in clusters");
}

/// Launches chained by programmatic dependent launch (as in a CUDA graph of back-to-back
/// launches): two problems alternating on one stream, each launch's pre-pass starting while the
/// previous GEMM runs, both outputs bit-identical, on split-K (clusters and workspace), stream-K
/// and no split.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemm_sm90_chained_launches() {
    let b = gpu();
    let problems = [gemm_problem(128, 7168, 2048, 1, 61), gemm_problem(128, 4096, 1536, 1, 62)];
    let references: Vec<_> = problems.iter().map(|p| p.run(&CpuBackend).unwrap()).collect();
    for cfg in ["auto", "m128n128s2d", "m128n128s2", "m128n128sk", "m128n128s1"] {
        let mut preps: Vec<_> = problems
            .iter()
            .map(
                |p| if cfg == "auto" { b.prepare(p).unwrap() } else { with_forced(&b, cfg, |b| b.prepare(p).unwrap()) },
            )
            .collect();
        for prep in preps.iter_mut() {
            assert!(prep.chains(), "{cfg}: the skeleton GEMM supports chained launches");
            prep.poison().unwrap();
        }
        for _ in 0..5 {
            for prep in preps.iter_mut() {
                prep.launch_chained().unwrap();
            }
        }
        for (prep, r) in preps.iter().zip(&references) {
            let report = nvfp4::check::compare_outputs(&prep.output().unwrap(), r, Mode::BitExact);
            assert!(report.passed(), "{cfg} chained {}: {report}", prep.describe());
        }
        println!("ok chained {cfg}: {}", preps[0].describe());
    }
}

/// Random signed data (all 16 codes, scales spread over 1/8 .. 15 with all mantissas), alpha,
/// and a NaN scale in each operand: tolerance mode (f32 sums are no longer exact; the spread is
/// kept moderate so that f32 cancellation stays far below the tolerance), NaN must propagate.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemm_sm90_random_data_alpha_and_nan() {
    let b = gpu();
    for (i, &(m, n, k, l)) in [(128, 512, 1024, 1), (384, 200, 512, 2)].iter().enumerate() {
        let Problem::Gemm(g) = gemm_problem(m, n, k, l, 40 + i as u64) else { unreachable!() };
        // e4m3 codes 0x20..0x57 (0.125 .. 15).
        let a = spread_scales(&g.a, 1, 0x20..0x58, 5 * g.a.sf_cols() + 3);
        let bt = spread_scales(&g.b, 2, 0x20..0x58, 17 * g.b.sf_cols());
        let p = Problem::Gemm(Gemm::new(a, bt, Some(0.375)).unwrap());
        for layout in LAYOUTS {
            let cfg =
                check(&b, &p.with_layout(layout), Mode::Tolerance, 1, &format!("random {m}x{n}x{k}x{l} {layout:?}"));
            println!("ok random {m}x{n}x{k}x{l} {layout:?}: {cfg}");
        }
    }
}

/// One small case on six configurations (split-K summed in clusters of 2 and 3 and through the
/// workspace, stream-K with one k-step per CTA, CTA pairs with a split, N = 256 in pairs): for
/// racecheck, which is too slow for the whole sweep.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemm_sm90_racecheck_case() {
    let b = gpu();
    let p = gemm_problem(72, 300, 192, 1, 950);
    // Split-K summed in clusters (s2, s3) and through the workspace (c1s2), stream-K, pairs.
    for name in ["m256n64s2d", "m128n128s3d", "m256n64s2", "m128n128sk", "m128n128c2s2", "m128n256c2"] {
        with_forced(&b, name, |b| check(b, &p, Mode::BitExact, 1, &format!("72x300x192 {name}")));
    }
}

/// Small shapes over every variant with a split and with stream-K in CTA pairs, for
/// compute-sanitizer memcheck.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemm_sm90_sanitizer_sweep() {
    let b = gpu();
    for (si, &(m, n, k, l)) in [(1, 7, 64, 1), (72, 40, 160, 2), (130, 257, 256, 1)].iter().enumerate() {
        let p = gemm_problem(m, n, k, l, 900 + si as u64);
        for (v, schedule) in VARIANTS.into_iter().flat_map(|v| [(v, "s2"), (v, "c2sk")]) {
            let name = format!("m{}n{}{schedule}", v.bm, v.bn);
            let layout = LAYOUTS[si % 2];
            with_forced(&b, &name, |b| {
                check(b, &p.with_layout(layout), Mode::BitExact, 2, &format!("{m}x{n}x{k}x{l} {name}"))
            });
        }
    }
}
