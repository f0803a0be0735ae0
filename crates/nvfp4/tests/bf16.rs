//! bf16 output on the CPU reference: every operation's bf16 result is its f64 (or, for the dual
//! GEMM, f32) value rounded once to bf16, checked against `half`'s f32 -> bf16 rounding (on sums
//! that f32 holds exactly) or a nearest-neighbour search (where it does not); the cases where f16
//! would overflow, and where rounding through f16 first would give another bf16.

use half::{bf16, f16};
use nvfp4::format::{f32_to_e2m1, f32_to_e4m3, pack_nibbles};
use nvfp4::problem::{generate, Problem, Shape};
use nvfp4::{Backend, CpuBackend, Gemm, MoeGemm, Nvfp4Tensor, OutTensor, OutputDtype, ScaleLayout};

const BF16: OutputDtype = OutputDtype::Bf16;

/// A plain-scale tensor `[1, rows, K]` from element values and one scale per 16 elements, each
/// exactly representable (asserted).
fn tensor(rows: usize, values: &[f32], scales: &[f32]) -> Nvfp4Tensor {
    let k = values.len() / rows;
    let codes: Vec<u8> = values.iter().map(|&v| f32_to_e2m1(v)).collect();
    let sf: Vec<u8> = scales.iter().map(|&s| f32_to_e4m3(s)).collect();
    let t = Nvfp4Tensor::new(1, rows, k, pack_nibbles(&codes), sf, ScaleLayout::Plain).unwrap();
    let want: Vec<f32> = values.iter().enumerate().map(|(i, &v)| v * scales[i / 16]).collect();
    assert_eq!(t.dequantize(), want, "values or scales not representable");
    t
}

/// `A · Bᵀ` of every batch in f64 from the exact f32 decodes, times alpha and the global scales.
fn exact_products(a: &Nvfp4Tensor, b: &Nvfp4Tensor, alpha: Option<f32>) -> Vec<f64> {
    let (m, n, k) = (a.rows(), b.rows(), a.k());
    let s = (alpha.unwrap_or(1.0) * a.global_scale() * b.global_scale()) as f64;
    let mut out = Vec::with_capacity(a.l() * m * n);
    for l in 0..a.l() {
        let (da, db) = (a.decode_batch(l), b.decode_batch(l));
        for i in 0..m {
            for j in 0..n {
                let dot: f64 = (0..k).map(|t| da[i * k + t] as f64 * db[j * k + t] as f64).sum();
                out.push(dot * s);
            }
        }
    }
    out
}

/// `half`'s bf16 rounding of values that f32 holds exactly (asserted): then one rounding.
fn bf16_of_exact(v: &[f64]) -> Vec<u16> {
    v.iter()
        .map(|&x| {
            assert_eq!(x as f32 as f64, x, "{x} is not exact in f32");
            bf16::from_f32(x as f32).to_bits()
        })
        .collect()
}

/// The nearest bf16 to `x` (ties to even), by comparing the neighbours of a truncated guess in
/// f64 (exact: the candidates lie within a factor of two of x).
fn nearest_bf16(x: f64) -> u16 {
    let guess = bf16::from_f64(x).to_bits();
    let mut best = guess;
    for c in [guess.wrapping_sub(1), guess.wrapping_add(1)] {
        let (dc, db) = ((bf16::from_bits(c).to_f64() - x).abs(), (bf16::from_bits(best).to_f64() - x).abs());
        if dc < db || (dc == db && c % 2 == 0) {
            best = c;
        }
    }
    best
}

fn gemm(p: &Problem) -> &Gemm {
    match p {
        Problem::Gemm(g) => g,
        _ => unreachable!(),
    }
}

#[test]
fn gemv_gemm_grouped_round_the_exact_sum_once() {
    for (shape, alpha) in [
        (Shape::Gemv { m: 130, k: 512, l: 2 }, None),
        (Shape::Gemm { m: 40, n: 72, k: 256, l: 2 }, Some(0.5)),
        (Shape::Gemm { m: 7, n: 130, k: 2048, l: 1 }, None),
    ] {
        let p = generate(&shape, 3).unwrap();
        let (got, want) = match &p {
            Problem::Gemv(g) => {
                let g = nvfp4::Gemv::new(g.a.clone(), g.b.clone(), alpha).unwrap();
                (CpuBackend.gemv_as(&g, BF16).unwrap(), exact_products(&g.a, &g.b, alpha))
            }
            _ => {
                let g = Gemm::new(gemm(&p).a.clone(), gemm(&p).b.clone(), alpha).unwrap();
                (CpuBackend.gemm_as(&g, BF16).unwrap(), exact_products(&g.a, &g.b, alpha))
            }
        };
        assert_eq!(got.dtype(), BF16);
        assert_eq!(got.bits(), bf16_of_exact(&want), "{shape}");
    }
    let Problem::GroupedGemm(gg) =
        generate(&Shape::GroupedGemm { groups: vec![(40, 128, 256), (72, 64, 512)] }, 5).unwrap()
    else {
        unreachable!()
    };
    let got = CpuBackend.grouped_gemm_as(&gg, BF16).unwrap();
    for (out, g) in got.iter().zip(&gg.groups) {
        assert_eq!(out.shape(), [1, g.a.rows(), g.b.rows()]);
        assert_eq!(out.bits(), bf16_of_exact(&exact_products(&g.a, &g.b, g.alpha)));
    }
}

/// Any alpha: sum * alpha in f64 is not exact in f32; the result is still the nearest bf16.
#[test]
fn any_alpha_rounds_once_from_f64() {
    let p = generate(&Shape::Gemm { m: 33, n: 40, k: 512, l: 1 }, 9).unwrap();
    let g = Gemm::new(gemm(&p).a.clone(), gemm(&p).b.clone(), Some(1.0 / 3.0)).unwrap();
    let got = CpuBackend.gemm_as(&g, BF16).unwrap();
    let want: Vec<u16> = exact_products(&g.a, &g.b, g.alpha).into_iter().map(nearest_bf16).collect();
    assert_eq!(got.bits(), want);
}

/// 16 products of 6 * 448 per operand: 16 * 2688^2 = 2^18 * 441, far beyond f16's 65504; bf16
/// holds it as 2^18 * 440 (441 is a tie between 440 and 442: to even).
#[test]
fn bf16_holds_what_f16_overflows() {
    let a = tensor(1, &[6.0; 16], &[448.0]);
    let b = tensor(1, &[-6.0; 16], &[448.0]);
    let g = Gemm::new(a, b, None).unwrap();
    assert_eq!(CpuBackend.gemm(&g).unwrap().data()[0], f16::NEG_INFINITY);
    let got = CpuBackend.gemm_as(&g, BF16).unwrap();
    assert_eq!(got.bits(), [bf16::from_f32(-(2f32.powi(18) * 440.0)).to_bits()]);
    assert_eq!(bf16::from_f32(-(2f32.powi(18) * 441.0)), bf16::from_f32(-(2f32.powi(18) * 440.0)));
}

/// Row 0 sums 256 + 1 + 1/16, times alpha 2^-8: 1 + 2^-8 + 2^-12, just above the tie between 1 and
/// 1 + 2^-7, so bf16 rounds up; through f16 first (1 + 2^-8, then a tie to even) it would give 1.
/// Row 1 is its negative.
#[test]
fn bf16_is_not_f16_rounded_again() {
    let mut values = vec![0f32; 2 * 48];
    for (row, sign) in [(0, 1.0), (1, -1.0)] {
        values[row * 48] = 4.0 * sign; // scale 64: 256
        values[row * 48 + 16] = sign; // scale 1: 1
        values[row * 48 + 32] = 0.5 * sign; // scale 1/8: 1/16
    }
    let scales = [64.0, 1.0, 0.125, 64.0, 1.0, 0.125];
    let a = tensor(2, &values, &scales);
    let b = tensor(1, &[1.0; 48], &[1.0; 3]);
    let g = Gemm::new(a, b, Some(2f32.powi(-8))).unwrap();
    let x = 1.0 + 2f32.powi(-8) + 2f32.powi(-12);
    let via_f16 = bf16::from_f32(f16::from_f32(x).to_f32());
    assert_eq!(via_f16, bf16::ONE, "the case must tell the two apart");
    let got = CpuBackend.gemm_as(&g, BF16).unwrap();
    assert_eq!(got.bits(), [bf16::from_f32(x).to_bits(), bf16::from_f32(-x).to_bits()]);
    assert_eq!(bf16::from_f32(x).to_f32(), 1.0 + 2f32.powi(-7));
}

/// The gate in f32 (x1 and x2 scaled by alpha and rounded to f32 first), then one rounding.
#[test]
fn dual_gemm_rounds_the_f32_gate_once() {
    let Problem::DualGemm(d) = generate(&Shape::DualGemm { m: 24, n: 40, k: 256, l: 2 }, 4).unwrap() else {
        unreachable!()
    };
    let d = nvfp4::DualGemm::new(d.a, d.b1, d.b2, Some(0.75)).unwrap();
    let (x1, x2) = (exact_products(&d.a, &d.b1, d.alpha), exact_products(&d.a, &d.b2, d.alpha));
    let want: Vec<u16> = x1
        .iter()
        .zip(&x2)
        .map(|(&g, &u)| bf16::from_f32(nvfp4::backend::cpu::silu(g as f32) * u as f32).to_bits())
        .collect();
    let got = CpuBackend.dual_gemm_as(&d, BF16).unwrap();
    assert_eq!((got.shape(), got.bits()), ([2, 24, 40], &want[..]));
}

/// Each expert's rows are its GEMM's bf16 rows; rows past the last offset stay zero.
#[test]
fn moe_form_assembles_bf16_experts() {
    let Problem::Moe(m) = generate(&Shape::Moe { n: 48, k: 128, counts: vec![5, 0, 17] }, 8).unwrap() else {
        unreachable!()
    };
    let p = MoeGemm::new(m.a.clone(), m.b.clone(), vec![5, 5, 22], Some(2.0)).unwrap();
    let got = CpuBackend.moe_gemm_as(&p, BF16).unwrap();
    assert_eq!((got.dtype(), got.shape()), (BF16, [1, p.tokens(), 48]));
    for (e, rows) in p.expert_rows().unwrap().into_iter().enumerate().filter(|(_, r)| !r.is_empty()) {
        let part = CpuBackend.gemm_as(&p.expert_gemm(e).unwrap(), BF16).unwrap();
        assert_eq!(&got.bits()[rows.start * 48..rows.end * 48], part.bits(), "expert {e}");
    }
    assert!(got.bits()[22 * 48..].iter().all(|&b| b == 0));
}

/// f16 stays the default: the plain methods equal the `*_as(F16)` ones.
#[test]
fn f16_is_the_default() {
    let p = generate(&Shape::Gemm { m: 9, n: 17, k: 64, l: 1 }, 2).unwrap();
    let f16_out = OutTensor::from(CpuBackend.gemm(gemm(&p)).unwrap());
    assert_eq!(f16_out, CpuBackend.gemm_as(gemm(&p), OutputDtype::F16).unwrap());
    assert_eq!(OutputDtype::default(), OutputDtype::F16);
}
