//! GPU tests of the grouped GEMM on the skeleton (kernels/grouped_gemm_sm90.cu), both forms. They
//! need an NVIDIA Hopper GPU and are `#[ignore]`d: `cargo test --release --test cuda_grouped --
//! --ignored` (forced variants are the backend's
//! overrides, so the tests run on any number of threads).
//!
//! The grouped generator makes every f32 sum exact, so every check is bit-identical to the CPU
//! reference (SPEC §4). Tiers: the SPEC test groups and ragged random lists in both scale layouts,
//! outputs poisoned, launched twice (the table is rebuilt and the counters reset); every variant
//! forced on ragged groups (M or N of 1, 7, 130, K tails, groups whose W is A); the MoE form with
//! device offsets: one expert holding every token, empty experts first, in the middle and last,
//! rows past the last offset left unwritten, one alpha or one per expert (on the device too), and
//! two routings alternating on one workspace (the CPU backend's MoE form is the reference); the
//! small sweep the sanitizer runs.

use half::f16;
use nvfp4::backend::cuda::sm90::{Op, VARIANTS};
use nvfp4::backend::cuda::{CudaBackend, DeviceOp};
use nvfp4::check::{compare, Mode};
use nvfp4::format::{F16Tensor, Nvfp4Tensor, ScaleLayout};
use nvfp4::ops::{MoeAlpha, MoeGemm};
use nvfp4::problem::{generate, test_shapes, Problem, ProblemKind, Shape};
use nvfp4::{Backend, CpuBackend};

mod common;
use common::{check, gpu};

const LAYOUTS: [ScaleLayout; 2] = [ScaleLayout::Plain, ScaleLayout::Blocked];

fn grouped(groups: &[(usize, usize, usize)], seed: u64) -> Problem {
    generate(&Shape::GroupedGemm { groups: groups.to_vec() }, seed).unwrap()
}

/// Ragged lists: tiny and odd M and N (either operand may be W), K tails past 64, a long K.
fn ragged() -> Vec<Vec<(usize, usize, usize)>> {
    vec![
        vec![(1, 7, 64), (130, 257, 320), (7, 1, 4096)],
        vec![(257, 130, 256), (40, 512, 128), (72, 384, 1024), (1, 1, 64)],
        vec![(80, 4096, 512), (176, 4096, 512), (0x48, 4096, 512)],
    ]
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn grouped_sm90_spec_and_ragged_bit_exact() {
    let b = gpu();
    let mut cases: Vec<Problem> =
        test_shapes(ProblemKind::GroupedGemm).iter().map(|s| generate(s, 11).unwrap()).collect();
    cases.extend(ragged().iter().enumerate().map(|(i, g)| grouped(g, 20 + i as u64)));
    for (i, p) in cases.iter().enumerate() {
        for layout in LAYOUTS {
            let cfg =
                check(&b, &p.clone().with_layout(layout), Mode::BitExact, 2, &format!("grouped case {i} {layout:?}"));
            assert!(cfg.starts_with("grouped_gemm_nvfp4_sm90_ws_"), "case {i} did not take the skeleton: {cfg}");
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn grouped_sm90_every_variant() {
    let b = gpu();
    for v in VARIANTS {
        let name = format!("m{}n{}", v.bm, v.bn);
        common::with_forced(&b, Op::Grouped, &name, |b| {
            for (i, g) in ragged().iter().enumerate() {
                let p = grouped(g, 40 + i as u64).with_layout(LAYOUTS[i % 2]);
                let cfg = check(b, &p, Mode::BitExact, 2, &format!("{name} ragged {i}"));
                assert!(cfg.starts_with(&format!("grouped_gemm_nvfp4_sm90_ws_{name}")), "{cfg}");
            }
        });
    }
}

/// Random grouped-distribution NVFP4 data `[l, rows, K]` (SPEC §5: values {0, ±0.5, ±1, ±1.5},
/// scales {1, 2}), so every f32 sum is exact.
fn tensor(l: usize, rows: usize, k: usize, seed: u64) -> Nvfp4Tensor {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let values = (0..l * rows * k / 2).map(|_| (next() % 255) as u8 & 0xBB).collect();
    let scales = (0..l * rows * k / 16).map(|_| if next() % 2 == 0 { 0x38 } else { 0x40 }).collect();
    Nvfp4Tensor::new(l, rows, k, values, scales, ScaleLayout::Plain).unwrap()
}

/// The MoE form's reference: the CPU backend's, with NaN (the poison a kernel must leave) in the
/// rows past the last offset.
fn moe_reference(a: &Nvfp4Tensor, w: &Nvfp4Tensor, offsets: &[i32], alpha: impl Into<MoeAlpha>) -> F16Tensor {
    let p = MoeGemm::new(a.clone(), w.clone(), offsets.to_vec(), alpha).unwrap();
    let c = CpuBackend.moe_gemm(&p).unwrap();
    let routed = c.cols() * *offsets.last().unwrap() as usize;
    let data = c.data().iter().enumerate().map(|(i, &x)| if i < routed { x } else { f16::NAN }).collect();
    F16Tensor::new(1, c.rows(), c.cols(), data).unwrap()
}

/// Runs the MoE form on the device with offsets in device memory, output poisoned, twice; with
/// one alpha, or (`per_expert`) a distinct one per expert, also in device memory.
fn check_moe(b: &CudaBackend, counts: &[usize], n: usize, k: usize, layout: ScaleLayout, seed: u64, per_expert: bool) {
    let t: usize = counts.iter().sum::<usize>() + 5; // 5 rows past the last expert
    let a = tensor(1, t, k, seed).with_global_scale(0.5);
    let w = tensor(counts.len(), n, k, seed + 1).with_global_scale(2.0);
    let offsets: Vec<i32> = counts
        .iter()
        .scan(0, |s, &c| {
            *s += c as i32;
            Some(*s)
        })
        .collect();
    // Per expert: 0.25, -0.6, 1.35, ... (the last expert's the largest in magnitude).
    let alpha: MoeAlpha = if per_expert {
        (0..counts.len())
            .map(|e| (0.25 + 0.35 * e as f32) * if e % 2 == 0 { 1.0 } else { -1.0 })
            .collect::<Vec<_>>()
            .into()
    } else {
        Some(0.25).into()
    };
    let expected = moe_reference(&a, &w, &offsets, alpha.clone());
    let (da, dw) = (b.upload(&a.to_layout(layout)).unwrap(), b.upload(&w.to_layout(layout)).unwrap());
    let off = b.upload_i32(&offsets).unwrap();
    let alphas = alpha.as_ref().try_map(|v| b.upload_f32(v)).unwrap();
    let c = b.alloc_output([1, t, n]).unwrap();
    let op = DeviceOp::MoeGemm {
        a: nvfp4::ops::Act::Nvfp4(&da.view()),
        b: &dw.view(),
        offsets: &off,
        alpha: alphas.as_ref(),
        c: &c.view(),
    };
    let bound = b.bind(op).unwrap_or_else(|e| panic!("MoE {counts:?}: {e}"));
    for i in 0..2 {
        b.poison(&c).unwrap();
        bound.launch().unwrap();
        let got = b.download(&c).unwrap();
        let report = compare(&got, &expected, Mode::BitExact);
        let what = format!("MoE {counts:?} N={n} K={k} {layout:?} per-expert alphas {per_expert}");
        assert!(report.passed(), "{what} launch {i} ({}): {report}", bound.describe());
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn moe_device_offsets_bit_exact() {
    let b = gpu();
    let cases: Vec<(Vec<usize>, usize, usize)> = vec![
        (vec![300], 384, 512),                                 // E = 1
        (vec![0, 0, 257, 0], 256, 256),                        // one expert holds every token
        (vec![0, 40, 0, 0, 72, 1, 0], 130, 320),               // empty first, middle, last
        (vec![80, 176, 128, 72, 64, 248, 96, 160], 4096, 512), // the bench's routing, short K
        (vec![7, 0, 129, 1, 300, 16], 7, 1024),
    ];
    for (i, (counts, n, k)) in cases.iter().enumerate() {
        for per_expert in [false, true] {
            check_moe(&b, counts, *n, *k, LAYOUTS[i % 2], 100 + i as u64, per_expert);
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn moe_routings_alternate_on_one_workspace() {
    // Two bound launches with different offsets over the same tokens and weights: each launch's
    // pre-pass rebuilds the table that the other's main kernel read last.
    let b = gpu();
    let (t, n, k) = (512, 512, 256);
    let a = tensor(1, t, k, 7);
    let w = tensor(4, n, k, 8);
    let routings = [vec![128, 256, 384, 512], vec![0, 500, 501, 512]];
    let (da, dw) = (b.upload(&a).unwrap(), b.upload(&w).unwrap());
    let outs: Vec<_> = routings.iter().map(|_| b.alloc_output([1, t, n]).unwrap()).collect();
    let offs: Vec<_> = routings.iter().map(|r| b.upload_i32(r).unwrap()).collect();
    let bound: Vec<_> = (0..2)
        .map(|i| {
            let op = DeviceOp::MoeGemm {
                a: nvfp4::ops::Act::Nvfp4(&da.view()),
                b: &dw.view(),
                offsets: &offs[i],
                alpha: MoeAlpha::One(None),
                c: &outs[i].view(),
            };
            b.bind(op).unwrap()
        })
        .collect();
    for round in 0..3 {
        for i in 0..2 {
            b.poison(&outs[i]).unwrap();
            bound[i].launch().unwrap();
        }
        for i in 0..2 {
            let got = b.download(&outs[i]).unwrap();
            let report = compare(&got, &moe_reference(&a, &w, &routings[i], None), Mode::BitExact);
            assert!(report.passed(), "round {round}, routing {i}: {report}");
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn moe_rejects_mismatched_operands() {
    let b = gpu();
    let a = b.upload(&tensor(1, 64, 256, 1)).unwrap();
    let w = b.upload(&tensor(3, 64, 256, 2)).unwrap();
    let c = b.alloc_output([1, 64, 64]).unwrap();
    let two = b.upload_i32(&[10, 20]).unwrap();
    let op = DeviceOp::MoeGemm {
        a: nvfp4::ops::Act::Nvfp4(&a.view()),
        b: &w.view(),
        offsets: &two,
        alpha: MoeAlpha::One(None),
        c: &c.view(),
    };
    assert!(b.bind(op).is_err(), "2 offsets for 3 experts");
    let a48 = b.upload(&tensor(1, 64, 48, 3)).unwrap();
    let w48 = b.upload(&tensor(3, 64, 48, 4)).unwrap();
    let three = b.upload_i32(&[10, 20, 64]).unwrap();
    let op = DeviceOp::MoeGemm {
        a: nvfp4::ops::Act::Nvfp4(&a48.view()),
        b: &w48.view(),
        offsets: &three,
        alpha: MoeAlpha::One(None),
        c: &c.view(),
    };
    let err = b.bind(op).err().expect("K = 48 cannot take the TMA path");
    assert!(err.to_string().contains("K = 48"), "{err}");
}

/// The small sweep compute-sanitizer runs: ragged lists with tiny groups, and MoE launches with
/// empty experts (one alpha, and one per expert), in both layouts.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn grouped_sm90_sanitizer_sweep() {
    let b = gpu();
    for (i, g) in
        [vec![(1, 7, 64), (130, 1, 320)], vec![(7, 257, 64), (40, 130, 128), (257, 1, 256)]].iter().enumerate()
    {
        for layout in LAYOUTS {
            check(&b, &grouped(g, 60 + i as u64).with_layout(layout), Mode::BitExact, 1, &format!("sweep {i}"));
        }
    }
    for per_expert in [false, true] {
        check_moe(&b, &[0, 3, 0, 130, 0], 130, 320, ScaleLayout::Blocked, 70, per_expert);
        check_moe(&b, &[1, 0, 0], 7, 64, ScaleLayout::Plain, 71, per_expert);
    }
}
