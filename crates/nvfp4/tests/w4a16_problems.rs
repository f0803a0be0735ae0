//! W4A16 problems and their generators (SPEC §8): what each tier draws, that the exact tier's
//! FP32 sums are exact in any order (so a kernel must be bit-identical), that the random tier's
//! weights carry a non-trivial global scale, the exact tier's K bound, determinism, a marked NaN
//! scale reaching exactly the outputs that use it, and the problem's layout, alpha and run.

use nvfp4::format::{e4m3_to_f32, NAN_SCALE};
use nvfp4::ops::HostActivation;
use nvfp4::problem::{generate16, Problem16, Shape, Tier, EXACT_MAX_K};
use nvfp4::{Backend, CpuBackend, Error, Nvfp4Tensor, OutTensor, OutputDtype, ScaleLayout};

const BF16: OutputDtype = OutputDtype::Bf16;
const F16: OutputDtype = OutputDtype::F16;

fn shapes() -> Vec<Shape> {
    vec![
        Shape::Gemv { m: 40, k: 4112, l: 2 },
        Shape::Gemm { m: 9, n: 17, k: 2048, l: 2 },
        Shape::DualGemm { m: 7, n: 12, k: 1552, l: 1 },
        Shape::GroupedGemm { groups: vec![(5, 8, 512), (3, 16, 48)] },
        Shape::Moe { n: 24, k: 256, counts: vec![6, 0, 11] },
    ]
}

/// Every weight of `p` (the GEMV's matrix; b, b1, b2, each group's b).
fn weights(p: &Problem16) -> Vec<&Nvfp4Tensor> {
    match p {
        Problem16::Gemv(g) => vec![&g.a],
        Problem16::Gemm(g) => vec![&g.b],
        Problem16::DualGemm(d) => vec![&d.b1, &d.b2],
        Problem16::GroupedGemm(g) => g.groups.iter().map(|x| &x.b).collect(),
        Problem16::Moe(m) => vec![&m.b],
    }
}

/// (activation, weight) pairs whose products the operation sums (per group, per expert batch:
/// the check below sums every activation row against every weight row of the same batch).
fn pairs(p: &Problem16) -> Vec<(&OutTensor, &Nvfp4Tensor)> {
    match p {
        Problem16::Gemv(g) => vec![(&g.b, &g.a)],
        Problem16::Gemm(g) => vec![(&g.a, &g.b)],
        Problem16::DualGemm(d) => vec![(&d.a, &d.b1), (&d.a, &d.b2)],
        Problem16::GroupedGemm(g) => g.groups.iter().map(|x| (&x.a, &x.b)).collect(),
        Problem16::Moe(m) => vec![(&m.a, &m.b)],
    }
}

fn is_pow2(x: f32) -> bool {
    x > 0.0 && x.is_finite() && (x.to_bits() & 0x007F_FFFF) == 0
}

#[test]
fn the_exact_tier_draws_its_documented_sets() {
    for shape in shapes() {
        for act in [BF16, F16] {
            let p = generate16(&shape, act, Tier::Exact, 3).unwrap();
            assert_eq!(p.act_dtype(), act);
            for x in p.activations() {
                // One power of two s per tensor: every value / s is one of 0, ±0.5, ±1, ±1.5, ±2.
                let v = x.to_f32();
                let on_set = |s: f32| v.iter().all(|x| (x / s * 2.0).fract() == 0.0 && (x / s).abs() <= 2.0);
                assert!((-2..=2).any(|e| on_set(2f32.powi(e))), "{shape} {act}: activations off the set");
                let mut mags: Vec<u32> = v.iter().map(|x| x.abs().to_bits()).collect();
                mags.sort_unstable();
                mags.dedup();
                assert_eq!(mags.len(), 5, "{shape} {act}: 0 and four magnitudes");
            }
            for w in weights(&p) {
                assert!(is_pow2(w.global_scale()) && (0.25..=2.0).contains(&w.global_scale()), "{shape}");
                let scales: Vec<f32> = w.scales().iter().map(|&s| e4m3_to_f32(s)).collect();
                assert!(scales.iter().all(|s| s.fract() == 0.0 && *s <= 3.0), "{shape}: integer scales {scales:?}");
                if matches!(shape, Shape::DualGemm { .. }) {
                    assert!(scales.iter().all(|s| [1.0, 2.0].contains(s)), "dual weights: scales in {{1, 2}}");
                }
            }
        }
    }
}

/// The sum of x·w in f32, forward and backward, and in f64: all three equal on exact data.
fn orders(x: &[f32], w: &[f32]) -> (f32, f32, f64) {
    let fwd = x.iter().zip(w).fold(0f32, |s, (a, b)| s + a * b);
    let bwd = x.iter().zip(w).rev().fold(0f32, |s, (a, b)| s + a * b);
    let exact = x.iter().zip(w).map(|(a, b)| (a * b) as f64).sum();
    (fwd, bwd, exact)
}

#[test]
fn exact_tier_sums_are_exact_in_fp32_in_any_order_and_random_ones_are_not() {
    let mut inexact = 0;
    for shape in shapes() {
        for tier in Tier::ALL {
            let p = generate16(&shape, BF16, tier, 11).unwrap();
            for (x, w) in pairs(&p) {
                let [l, rows, k] = x.shape();
                for b in 0..l.min(w.l()) {
                    let (dx, dw) = (x.decode_batch(b), w.decode_batch(b));
                    for r in 0..rows.min(4) {
                        for n in 0..w.rows().min(4) {
                            let (f, bw, e) = orders(&dx[r * k..(r + 1) * k], &dw[n * k..(n + 1) * k]);
                            if tier == Tier::Exact {
                                assert_eq!((f as f64, bw as f64), (e, e), "{shape} row {r} col {n}");
                            } else if f as f64 != e || bw as f64 != e {
                                inexact += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(inexact > 0, "the random tier should not make FP32 sums exact");
    // The bound: 144 units per product (|w| <= 36 halves, |a| <= 4 halves), K products.
    const { assert!(144 * EXACT_MAX_K <= 1 << 24 && 144 * (EXACT_MAX_K + 16) > 1 << 24) };
    const { assert!(EXACT_MAX_K.is_multiple_of(16)) };
}

#[test]
fn the_exact_tiers_bound_holds_at_the_largest_magnitudes() {
    // K = EXACT_MAX_K products of the largest weight (6 × 3 = 18) and activation (2): every
    // partial sum of the same sign stays exact in f32; 2^24 / 4 + 0.25 would not be.
    let k = EXACT_MAX_K;
    let (x, w) = (vec![2f32; k], vec![18f32; k]);
    let (f, b, e) = orders(&x, &w);
    assert_eq!((f as f64, b as f64), (e, e));
    assert_eq!(e, 36.0 * k as f64);
    assert_ne!((4_194_304f32 + 0.25) as f64, 4_194_304.25);
}

#[test]
fn the_random_tier_quantizes_with_a_nontrivial_global_scale() {
    for shape in shapes() {
        let p = generate16(&shape, F16, Tier::Random, 5).unwrap();
        for w in weights(&p) {
            assert!(!is_pow2(w.global_scale()), "{shape}: global {}", w.global_scale());
            // Block scales near the top of E4M3's range (ModelOpt), of several exponents.
            let mut exps: Vec<i32> = w.scales().iter().map(|&s| (s >> 3) as i32).collect();
            exps.sort_unstable();
            exps.dedup();
            assert!(exps.len() >= 2, "{shape}: one scale exponent only");
        }
        for x in p.activations() {
            let v = x.to_f32();
            let mean = v.iter().map(|&a| a as f64).sum::<f64>() / v.len() as f64;
            let var = v.iter().map(|&a| (a as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
            assert!(mean.abs() < 0.2 && (0.6..1.4).contains(&var), "{shape}: mean {mean}, variance {var}");
            assert!(v.iter().any(|a| (a * 4.0).fract() != 0.0), "{shape}: values off the exact set");
        }
    }
}

#[test]
fn the_exact_tier_refuses_a_k_it_cannot_make_exact() {
    let too_long = Shape::Gemm { m: 1, n: 1, k: EXACT_MAX_K + 16, l: 1 };
    assert!(matches!(generate16(&too_long, BF16, Tier::Exact, 1), Err(Error::Invalid(_))));
    assert!(generate16(&too_long, BF16, Tier::Random, 1).is_ok());
    assert!(generate16(&Shape::Gemm { m: 1, n: 1, k: EXACT_MAX_K, l: 1 }, BF16, Tier::Exact, 1).is_ok());
    assert!(generate16(&Shape::Gemm { m: 1, n: 1, k: 24, l: 1 }, BF16, Tier::Exact, 1).is_err());
}

#[test]
fn draws_are_deterministic_and_seeded() {
    for shape in shapes() {
        for tier in Tier::ALL {
            let p = generate16(&shape, BF16, tier, 7).unwrap();
            assert_eq!(p, generate16(&shape, BF16, tier, 7).unwrap(), "{shape} {tier}");
            assert_ne!(p, generate16(&shape, BF16, tier, 8).unwrap(), "{shape} {tier}");
            assert_eq!(p.shape(), shape);
        }
    }
    assert_eq!("random".parse::<Tier>().unwrap(), Tier::Random);
    assert!("fuzzy".parse::<Tier>().is_err());
}

#[test]
fn a_nan_scale_reaches_exactly_the_outputs_that_use_it() {
    let shape = Shape::Gemm { m: 5, n: 9, k: 64, l: 2 };
    let mut p = generate16(&shape, BF16, Tier::Exact, 2).unwrap();
    let (name, [b, n, j]) = p.mark_nan_scale(4).unwrap();
    assert_eq!(name, "b");
    let Problem16::Gemm(g) = &p else { unreachable!() };
    assert_eq!(g.b.scale(b, n, j), NAN_SCALE);
    let out = CpuBackend.gemm16_as(g, F16).unwrap().to_f32();
    for (i, v) in out.iter().enumerate() {
        let (batch, col) = (i / (5 * 9), i % 9);
        assert_eq!(v.is_nan(), batch == b && col == n, "element {i}");
    }
    // The GEMV marks its matrix: a row of the output.
    let mut v = generate16(&Shape::Gemv { m: 6, k: 32, l: 1 }, F16, Tier::Random, 1).unwrap();
    let (name, [_, row, _]) = v.mark_nan_scale(9).unwrap();
    assert_eq!(name, "a");
    let out = v.run_as(&CpuBackend, F16).unwrap()[0].to_f32();
    assert!(out.iter().enumerate().all(|(i, x)| x.is_nan() == (i == row)), "{out:?}");
}

#[test]
fn layouts_alpha_and_runs() {
    for shape in shapes() {
        let p = generate16(&shape, F16, Tier::Exact, 4).unwrap();
        let blocked = p.with_layout(ScaleLayout::Blocked);
        assert!(weights(&blocked).iter().all(|w| w.layout() == ScaleLayout::Blocked));
        assert_eq!(blocked.with_layout(ScaleLayout::Plain), p);
        for out in [F16, BF16] {
            let (a, b) = (p.run_as(&CpuBackend, out).unwrap(), blocked.run_as(&CpuBackend, out).unwrap());
            assert_eq!(a, b, "{shape}: blocked weights give the plain bits");
            assert!(a.iter().all(|t| t.dtype() == out));
        }
        let mut q = p.clone();
        q.set_alpha(Some(0.5)).unwrap();
        let (x, y) = (p.run_as(&CpuBackend, F16).unwrap(), q.run_as(&CpuBackend, F16).unwrap());
        // Alpha scales the sum (the dual GEMM's two sums, before the gate: not a halving).
        let halved = !matches!(shape, Shape::DualGemm { .. });
        assert!(halved || x != y, "{shape}: alpha changed nothing");
        for (tx, ty) in x.iter().zip(&y).filter(|_| halved) {
            for (a, b) in tx.to_f32().iter().zip(ty.to_f32()) {
                let overflowed = a.is_infinite() && b.abs() >= 32752.0;
                assert!(a.is_nan() || *a * 0.5 == b || a.abs() < 1e-4 || overflowed, "{shape}: {a} halves to {b}");
            }
        }
        // A refused alpha changes nothing.
        assert!(q.set_alpha(Some(f32::INFINITY)).is_err());
        assert_eq!(q.run_as(&CpuBackend, F16).unwrap(), y);
        assert!(p.run_host_bytes(&CpuBackend).is_some());
    }
}
