//! The W4A16 mma.sync fallback (issue 21): every W4A16 GEMM, dual GEMM and grouped GEMM (list and
//! MoE form) that the skeleton declines (K % 32 != 0 or K < 64, more than one activation row), and
//! the shapes it takes when forced off: K of one, three and 257 blocks (K % 32 == 16) and K = 32,
//! M and N of 1, 7, 40, 130, L > 1, both activation types, both output types, both scale layouts,
//! a NaN scale, the MoE form's rows past the last offset left unwritten. Exact data bit-identical
//! (the dual GEMM: the tolerance of its SiLU), outputs NaN-filled before every launch (`W16::run`).

use nvfp4::backend::cuda::sm90::Op;
use nvfp4::backend::cuda::CudaBackend;
use nvfp4::problem::{Rng, Shape};
use nvfp4::{MoeGemm, OutputDtype};

use super::{
    check, differences, exact_activation, exact_weights, gpu, plant_nan, with_forced, Data, Rule, LAYOUTS, TYPES, W16,
};

/// Shapes only the fallback takes in W4A16.
fn shapes() -> Vec<Shape> {
    let gemm = |m, n, k, l| Shape::Gemm { m, n, k, l };
    let dual = |m, n, k, l| Shape::DualGemm { m, n, k, l };
    vec![
        gemm(9, 130, 48, 3),
        gemm(130, 1, 16, 1),
        gemm(40, 7, 4112, 1),
        gemm(130, 40, 32, 2),
        dual(7, 130, 48, 2),
        dual(130, 7, 16, 1),
        dual(40, 40, 4112, 1),
        dual(130, 1, 32, 1),
        Shape::GroupedGemm { groups: vec![(40, 130, 48), (7, 1, 16), (130, 7, 4112), (1, 40, 32)] },
        Shape::GroupedGemm { groups: vec![(130, 130, 256), (7, 40, 48)] },
        Shape::Moe { n: 130, k: 48, counts: vec![40, 0, 7, 1, 130] },
        Shape::Moe { n: 7, k: 16, counts: vec![0, 130] },
        Shape::Moe { n: 40, k: 4112, counts: vec![7, 1, 0] },
        Shape::Moe { n: 1, k: 32, counts: vec![40, 130] },
    ]
}

/// [`check`] of `w` with outputs of `out`, asserting that the launch is the fallback's kernel of
/// `w`'s activation type.
fn check_fallback(
    b: &CudaBackend,
    w: &W16,
    act: OutputDtype,
    out: OutputDtype,
    rule: Rule,
    what: &str,
) -> Vec<nvfp4::OutTensor> {
    let (_, route) = w.run(b, out, None, false);
    // Kernel symbols name the type short (`bf16`, `f16`); OutputDtype displays as torch does.
    let short = if act == OutputDtype::Bf16 { "bf16" } else { "f16" };
    assert!(route.contains(&format!("_w4a16{short}_sm90_mma [")), "{what}: not the fallback: {route}");
    check(b, w, out, rule, what)
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn fallback_exact_data_is_bit_identical() {
    let b = gpu();
    for (i, shape) in shapes().iter().enumerate() {
        for act in TYPES {
            for layout in LAYOUTS {
                let w = W16::make(shape, act, layout, Data::Exact, 700 + i as u64);
                for out in TYPES {
                    check_fallback(
                        &b,
                        &w,
                        act,
                        out,
                        Rule::Exact,
                        &format!("fallback {shape} {act} -> {out} {layout:?}"),
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn fallback_random_data_is_within_tolerance() {
    let b = gpu();
    for (i, shape) in shapes().iter().enumerate() {
        for (act, layout) in [(TYPES[0], LAYOUTS[1]), (TYPES[1], LAYOUTS[0])] {
            let w = W16::make(shape, act, layout, Data::Random, 800 + i as u64);
            check_fallback(&b, &w, act, act, Rule::Tolerance, &format!("fallback random {shape} {act} {layout:?}"));
        }
    }
}

/// A NaN scale (fallback/stage.cuh keeps it NaN in both types) makes NaN exactly the outputs
/// whose sums read it.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn fallback_a_nan_scale_poisons_exactly_its_outputs() {
    let b = gpu();
    for (i, shape) in shapes().iter().enumerate() {
        for act in TYPES {
            for layout in LAYOUTS {
                let w = plant_nan(W16::make(shape, act, layout, Data::Exact, 900 + i as u64));
                let what = format!("fallback NaN scale {shape} {act} {layout:?}");
                let want = check_fallback(&b, &w, act, act, Rule::Tolerance, &what);
                let nans: usize = want.iter().map(|t| t.to_f32().iter().filter(|v| v.is_nan()).count()).sum();
                let all: usize = want.iter().map(|t| t.bits().len()).sum();
                let reads = !matches!(shape, Shape::Moe { counts, .. } if counts.last() == Some(&0));
                // With one weight row (N = 1) every output reads the NaN scale.
                let one_row = matches!(shape, Shape::Gemm { n: 1, .. } | Shape::DualGemm { n: 1, .. });
                assert!((nans > 0) == reads && (nans < all || one_row), "{what}: {nans} NaN of {all}");
            }
        }
    }
}

/// Shapes the skeleton takes, forced to the fallback: several K-tiles per launch with K a
/// multiple of 64, and the MoE form's larger counts.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn fallback_forced_off_is_bit_identical() {
    let b = gpu();
    let cases = [
        (Op::Gemm, Shape::Gemm { m: 200, n: 130, k: 1056, l: 1 }),
        (Op::Dual, Shape::DualGemm { m: 130, n: 72, k: 544, l: 2 }),
        (Op::Grouped, Shape::GroupedGemm { groups: vec![(40, 520, 544), (300, 130, 288)] }),
        (Op::Grouped, Shape::Moe { n: 200, k: 256, counts: vec![40, 0, 300, 9, 64, 65] }),
    ];
    for (op, shape) in cases {
        for (act, layout) in [(TYPES[0], LAYOUTS[1]), (TYPES[1], LAYOUTS[0])] {
            let w = W16::make(&shape, act, layout, Data::Exact, 11);
            let what = format!("{shape} {act} {layout:?} forced off");
            with_forced(&b, op, "off", |b| check_fallback(b, &w, act, act, Rule::Exact, &what));
        }
    }
}

/// The MoE form's tokens past the last offset belong to no expert: their output rows keep the
/// poison, every routed row matches the reference.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn fallback_moe_leaves_unrouted_rows_unwritten() {
    let b = gpu();
    let (t, n, k) = (150, 130, 48);
    for act in TYPES {
        let mut rng = Rng::new(21);
        let a = exact_activation(&mut rng, [1, t, k], act);
        let weights = exact_weights(&mut rng, [4, n, k], LAYOUTS[1]);
        let ends = vec![40, 40, 47, 120];
        let w = W16::Moe(MoeGemm::new(a, weights, ends, None).unwrap());
        let want = &w.reference(act)[0];
        let (got, route) = w.run(&b, act, None, false);
        assert!(route.contains("grouped_gemm_w4a16"), "{route}");
        for outs in got {
            let g = &outs[0];
            let routed = 120 * n;
            let bad: Vec<_> = differences(g, want, Rule::Exact).into_iter().filter(|&(i, _, _)| i < routed).collect();
            assert!(bad.is_empty(), "MoE {act} ({route}): {bad:?}");
            assert!(
                g.to_f32()[routed..].iter().all(|v| v.is_nan()),
                "MoE {act}: a row past the last offset was written"
            );
        }
    }
}
