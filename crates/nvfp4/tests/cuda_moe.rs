//! The grouped GEMM's MoE form on the CUDA backend against the CPU reference, bit-identical:
//! every MoE case of `nvfp4 check grouped-gemm` (both scale layouts, alpha), rows past the last
//! offset, every expert empty. Needs an NVIDIA GPU: run with
//! `cargo test --release --test cuda_moe -- --ignored`.
//!
//! Where the backend can prepare a MoE problem, its output is poisoned before each launch (an
//! unwritten routed row fails); until then each case runs through `Backend::moe_gemm`, whose
//! output starts as zeros.

use nvfp4::check::{case_problem, cases, compare, compare_outputs, Mode};
use nvfp4::problem::{generate, ProblemKind, Shape};
use nvfp4::{Backend, CpuBackend, Error, F16Tensor, MoeGemm, Problem, ScaleLayout};

mod common;
use common::{check_against, gpu};

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
