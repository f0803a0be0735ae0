//! The grouped GEMM's MoE form on the CUDA backend against the CPU reference, bit-identical:
//! every MoE case of `nvfp4 check grouped-gemm` (both scale layouts, alpha), rows past the last
//! offset, every expert empty, per-expert alphas (distinct, empty experts among them; on the
//! skeleton, the experts as a list, and rewritten on the device between launches). Needs an
//! NVIDIA GPU: run with `cargo test --release --test cuda_moe -- --ignored`.
//!
//! Where the backend can prepare a MoE problem, its output is poisoned before each launch (an
//! unwritten routed row fails); until then each case runs through `Backend::moe_gemm`, whose
//! output starts as zeros.

use nvfp4::backend::cuda::sm90::Op;
use nvfp4::backend::cuda::DeviceOp;
use nvfp4::check::{case_problem, cases, compare, compare_outputs, Mode};
use nvfp4::ops::Act;
use nvfp4::problem::{generate, ProblemKind, Shape};
use nvfp4::{Backend, CpuBackend, Error, F16Tensor, MoeAlpha, MoeGemm, Problem, ScaleLayout};

mod common;
use common::{check_against, gpu, WAVE_COUNTS, WAVE_NK};

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn every_moe_check_case_is_bit_exact() {
    let b = gpu();
    let specs: Vec<_> =
        cases(ProblemKind::GroupedGemm, 1).into_iter().filter(|c| matches!(c.shape, Shape::Moe { .. })).collect();
    assert!(!specs.is_empty());
    for spec in specs {
        let what = format!("moe {} {} {:?} alpha {:?}", spec.label, spec.shape, spec.layout, spec.alpha);
        let p = case_problem(&spec).unwrap();
        let reference = p.run(&CpuBackend).unwrap();
        let p = p.into_layout(spec.layout);
        match b.prepare(&p) {
            Ok(_) => {
                let cfg = check_against(&b, &p, &reference, Mode::BitExact, 2, &what);
                println!("ok {what} (poisoned, prepared): {cfg}");
            }
            Err(Error::Unsupported { .. }) => {
                let got = p.run(&b).unwrap_or_else(|e| panic!("{what}: {e}"));
                let report = compare_outputs(&got, &reference, Mode::BitExact);
                assert!(report.passed(), "{what}: {report}");
                println!("ok {what} (Backend::moe_gemm)");
            }
            Err(e) => panic!("{what}: prepare: {e}"),
        }
    }
}

/// Rows past the last offset stay as the fresh output has them (zero, as the reference), and an
/// all-empty routing writes nothing.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn rows_past_the_last_offset_and_empty_routings() {
    let b = gpu();
    let Problem::Moe(full) = generate(&Shape::Moe { n: 130, k: 256, counts: vec![0, 40, 0, 72, 20] }, 11).unwrap()
    else {
        unreachable!()
    };
    for (offsets, alpha) in [(vec![0, 40, 40, 100, 100], Some(0.5)), (vec![0, 0, 0, 0, 0], None)] {
        for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
            let p = MoeGemm::new(full.a.to_layout(layout), full.b.to_layout(layout), offsets.clone(), alpha).unwrap();
            let (got, want) = (b.moe_gemm(&p).unwrap(), CpuBackend.moe_gemm(&p).unwrap());
            let report = compare(&got, &want, Mode::BitExact);
            assert!(report.passed(), "offsets {offsets:?} {layout:?}: {report}");
            assert!(want.data()[100 * 130..].iter().all(|v| v.to_bits() == 0));
        }
    }
}

/// A prefill-sized launch of a real model's expert projection (Qwen3-30B-A3B's gate/up: 128
/// experts of N = 1536, K = 2048, 16384 routed rows, a few experts empty), once refused by a
/// false 32-bit limit: one launch, and the rows of a few experts (the first, the last, one after
/// an empty one) bit-identical to the CPU reference of that expert's GEMM.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn moe_prefill_of_a_real_model_is_bit_exact() {
    let b = gpu();
    let counts: Vec<usize> = (0..128).map(|e| if e % 31 == 5 { 0 } else { 64 + (e * 37) % 129 }).collect();
    let t: usize = counts.iter().sum();
    let Problem::Moe(p) = generate(&Shape::Moe { n: 1536, k: 2048, counts: counts.clone() }, 12).unwrap() else {
        unreachable!()
    };
    let got = b.moe_gemm(&p).unwrap();
    assert_eq!(got.shape(), [1, t, 1536]);
    let rows = p.expert_rows().unwrap();
    for e in [0, 6, 127] {
        assert!(counts[e] > 0 && (e != 6 || counts[5] == 0));
        let want = CpuBackend.gemm(&p.expert_gemm(e).unwrap()).unwrap();
        let n = 1536;
        let part =
            F16Tensor::new(1, rows[e].len(), n, got.data()[rows[e].start * n..rows[e].end * n].to_vec()).unwrap();
        let report = compare(&part, &want, Mode::BitExact);
        assert!(report.passed(), "expert {e}: {report}");
    }
}

/// A MoE launch of more than two waves of tile groups on the GPU's SMs: the table deals whole
/// waves round robin and shares the rest as stream-K pieces (sm90/grouped.cuh). Every routed row
/// bit-identical (poisoned output, two launches), both scale layouts.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn moe_launch_of_whole_waves_is_bit_exact() {
    let b = gpu();
    let (n, k) = WAVE_NK;
    let x_tiles: usize = WAVE_COUNTS.iter().map(|c| c.div_ceil(128)).sum();
    assert!(n.div_ceil(256) * x_tiles >= 3 * 132, "at least two whole waves and a stream-K remainder");
    let p = generate(&Shape::Moe { n, k, counts: WAVE_COUNTS.to_vec() }, 13).unwrap();
    let reference = p.run(&CpuBackend).unwrap();
    for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
        let what = format!("moe n={n} k={k} {WAVE_COUNTS:?} {layout:?}");
        let cfg = check_against(&b, &p.clone().into_layout(layout), &reference, Mode::BitExact, 2, &what);
        assert!(cfg.contains("m256n128") && cfg.contains("whole waves dealt"), "{what}: {cfg}");
        println!("ok {what}: {cfg}");
    }
}

/// Tokens per expert for the per-expert alpha cases: empty experts first, in the middle and last.
const COUNTS: [usize; 7] = [0, 40, 0, 72, 129, 1, 0];
/// One distinct factor per expert of [`COUNTS`]: both signs, 0, one power of two.
const ALPHAS: [f32; 7] = [0.8125, -1.3, 2.0, 3.1e-3, 0.0, -0.71, 5.5];
const OTHER_ALPHAS: [f32; 7] = [1.0, 0.37, -4.0, -2.25, 1.1, 6.0e-2, 0.0];

/// A MoE problem of [`COUNTS`] with non-trivial global scales (the factor's order matters:
/// (alpha_e × global(A)) × global(B) in f32) and the per-expert factors `alphas`.
fn per_expert(n: usize, k: usize, seed: u64, alphas: &[f32]) -> MoeGemm {
    let Problem::Moe(m) = generate(&Shape::Moe { n, k, counts: COUNTS.to_vec() }, seed).unwrap() else {
        unreachable!()
    };
    MoeGemm::new(m.a.with_global_scale(0.75), m.b.with_global_scale(1.5), m.offsets, alphas.to_vec()).unwrap()
}

/// Per-expert alphas on the skeleton's grouped launch (prepared: outputs poisoned before each
/// launch, offsets and alphas uploaded), both scale layouts and output types, bit-identical to
/// the CPU reference (which gives expert e's rows the scalar path's with alpha_e); the W4A4
/// shapes no launch takes (K = 48) and the skeleton forced off run the experts as a list of host
/// slices, each with its own alpha.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn per_expert_alphas_are_bit_exact() {
    let b = gpu();
    for (i, (n, k)) in [(130, 256), (384, 512), (72, 1024)].into_iter().enumerate() {
        let m = per_expert(n, k, 40 + i as u64, &ALPHAS);
        for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
            let what = format!("per-expert alphas N={n} K={k} {layout:?}");
            let p = Problem::Moe(m.clone()).into_layout(layout);
            let cfg = common::check(&b, &p, Mode::BitExact, 2, &what);
            assert!(cfg.starts_with("grouped_gemm_nvfp4_sm90_ws"), "{what}: {cfg}");
            let Problem::Moe(q) = &p else { unreachable!() };
            let bf16 = nvfp4::OutputDtype::Bf16;
            let (got, want) = (b.moe_gemm_as(q, bf16).unwrap(), CpuBackend.moe_gemm_as(q, bf16).unwrap());
            assert_eq!(got.bits(), want.bits(), "{what} bf16");
            println!("ok {what}: {cfg}");
        }
    }
    let k48 = per_expert(40, 48, 50, &ALPHAS);
    let (got, want) = (b.moe_gemm(&k48).unwrap(), CpuBackend.moe_gemm(&k48).unwrap());
    let report = compare(&got, &want, Mode::BitExact);
    assert!(report.passed(), "K = 48 (experts as a list): {report}");
    let m = per_expert(130, 256, 51, &ALPHAS);
    let got = common::with_forced(&b, Op::Grouped, "off", |b| b.moe_gemm(&m).unwrap());
    let report = compare(&got, &CpuBackend.moe_gemm(&m).unwrap(), Mode::BitExact);
    assert!(report.passed(), "skeleton forced off (experts as a list): {report}");
}

/// The per-expert alphas live on the device and are read by every launch: one bound operation,
/// its factors rewritten between two launches, gives each launch its factors' result; one alpha
/// for all (the scalar path) on the same operands still gives its own.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn per_expert_alphas_rewritten_on_the_device_between_launches() {
    let b = gpu();
    let m = per_expert(256, 512, 60, &ALPHAS);
    let other = MoeGemm { alpha: OTHER_ALPHAS.to_vec().into(), ..m.clone() };
    let one = MoeGemm { alpha: Some(-0.6f32).into(), ..m.clone() };
    let (da, dw, off) = (b.upload(&m.a).unwrap(), b.upload(&m.b).unwrap(), b.upload_i32(&m.offsets).unwrap());
    let alphas = b.upload_f32(&ALPHAS).unwrap();
    let t = m.tokens();
    let c = b.alloc_output([1, t, 256]).unwrap();
    let bind = |alpha| {
        let op = DeviceOp::MoeGemm { a: Act::Nvfp4(&da.view()), b: &dw.view(), offsets: &off, alpha, c: &c.view() };
        b.bind(op).unwrap()
    };
    let per = bind(MoeAlpha::PerExpert(&alphas));
    let scalar = bind(MoeAlpha::One(Some(-0.6)));
    let launch = |op: &nvfp4::backend::cuda::BoundOp| {
        b.poison(&c).unwrap();
        op.launch().unwrap();
        b.download(&c).unwrap()
    };
    for (round, (op, p)) in [(&per, &m), (&scalar, &one)].into_iter().enumerate() {
        let report = compare(&launch(op), &CpuBackend.moe_gemm(p).unwrap(), Mode::BitExact);
        assert!(report.passed(), "launch {round}: {report}");
    }
    b.write_values(&alphas, &OTHER_ALPHAS).unwrap();
    let report = compare(&launch(&per), &CpuBackend.moe_gemm(&other).unwrap(), Mode::BitExact);
    assert!(report.passed(), "after the rewrite: {report}");
    assert!(b.write_values(&alphas, &ALPHAS[..3]).is_err(), "3 values for a view of 7");
    // A wrong count on the device is refused at bind.
    let short = b.upload_f32(&ALPHAS[..6]).unwrap();
    let op = DeviceOp::MoeGemm {
        a: Act::Nvfp4(&da.view()),
        b: &dw.view(),
        offsets: &off,
        alpha: MoeAlpha::PerExpert(&short),
        c: &c.view(),
    };
    let err = b.bind(op).err().expect("6 alphas for 7 experts");
    assert!(err.to_string().contains("6 alphas for E = 7 experts"), "{err}");
}
