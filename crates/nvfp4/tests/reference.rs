//! The CPU reference backend against a naive implementation written here (own decoders, own
//! scale addressing, own f64 -> f16 rounding), hand-worked examples, and the SPEC §4 checker.

use half::f16;
use nvfp4::check::{compare, compare_outputs, element_passes, Mode};
use nvfp4::problem::Rng;
use nvfp4::{
    Backend, CpuBackend, DualGemm, F16Tensor, Gemm, Gemv, GroupedGemm, Nvfp4Tensor, Output, Problem, ScaleLayout,
};

// ---------------------------------------------------------------------------------------------
// The naive reference.

fn e2m1(code: u8) -> f64 {
    let m = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][(code & 7) as usize];
    if code & 8 != 0 {
        -m
    } else {
        m
    }
}

fn e4m3(code: u8) -> f64 {
    let e = ((code >> 3) & 0xF) as i32;
    let m = (code & 7) as f64;
    assert!(!(e == 15 && code & 7 == 7), "NaN scale {code:#04x} read");
    let mag = if e == 0 { m * 2f64.powi(-9) } else { (8.0 + m) * 2f64.powi(e - 10) };
    if code & 0x80 != 0 {
        -mag
    } else {
        mag
    }
}

/// Round to nearest even f16, once, from an f64 (SPEC §3), by integer arithmetic.
fn f16_rne(x: f64) -> f16 {
    if x.is_nan() {
        return f16::NAN;
    }
    let sign: u16 = if x.is_sign_negative() { 0x8000 } else { 0 };
    let a = x.abs();
    // 65504 is the largest f16; halfway to 65536 and beyond rounds to infinity.
    if a >= 65520.0 {
        return f16::from_bits(sign | 0x7C00);
    }
    let e = if a == 0.0 { -1023 } else { ((a.to_bits() >> 52) & 0x7FF) as i32 - 1023 };
    // Spacing of f16 values around a: 2^-24 below 2^-14 (subnormals), else 2^(e - 10).
    let qexp = if e < -14 { -24 } else { e - 10 };
    let q = a / 2f64.powi(qexp);
    let floor = q.floor();
    let frac = q - floor;
    let mut n = floor as u32;
    if frac > 0.5 || (frac == 0.5 && n % 2 == 1) {
        n += 1;
    }
    // Subnormal counts run straight into the normal encoding (n = 1024 is 2^-14), and a normal
    // mantissa that rounds up to 2048 carries into the exponent.
    let bits = if qexp == -24 { n } else { (((e + 15) as u32) << 10) + n - 1024 };
    f16::from_bits(sign | bits as u16)
}

/// Byte offset of scale (i, j, b) in either layout, from the SPEC §2 formulas.
fn scale_offset(layout: ScaleLayout, rows: usize, sf_cols: usize, i: usize, j: usize, b: usize) -> usize {
    match layout {
        ScaleLayout::Plain => (b * rows + i) * sf_cols + j,
        ScaleLayout::Blocked => {
            let (r, c) = (rows.div_ceil(128), sf_cols.div_ceil(4));
            b * r * c * 512 + (i / 128) * c * 512 + (j / 4) * 512 + (i % 32) * 16 + ((i % 128) / 32) * 4 + j % 4
        }
    }
}

/// Element (b, i, k) of a tensor, decoded from its raw buffers: e2m1 * e4m3 (no global scale).
fn element(t: &Nvfp4Tensor, b: usize, i: usize, k: usize) -> f64 {
    let kk = t.k();
    let byte = t.values()[(b * t.rows() + i) * (kk / 2) + k / 2];
    let code = if k.is_multiple_of(2) { byte & 0xF } else { byte >> 4 };
    let s = t.scales()[scale_offset(t.layout(), t.rows(), kk / 16, i, k / 16, b)];
    e2m1(code) * e4m3(s)
}

/// Σ_k A[b, i, k] B[b, j, k] in f64 (exact for the data of these tests).
fn naive_dot(a: &Nvfp4Tensor, i: usize, bt: &Nvfp4Tensor, j: usize, b: usize) -> f64 {
    let mut acc = 0f64;
    for k in 0..a.k() {
        acc += element(a, b, i, k) * element(bt, b, j, k);
    }
    acc
}

fn alpha_of(alpha: Option<f32>, a: &Nvfp4Tensor, b: &Nvfp4Tensor) -> f64 {
    (alpha.unwrap_or(1.0) * a.global_scale() * b.global_scale()) as f64
}

fn naive_gemm(a: &Nvfp4Tensor, bt: &Nvfp4Tensor, alpha: Option<f32>) -> Vec<f16> {
    let al = alpha_of(alpha, a, bt);
    let mut out = Vec::new();
    for b in 0..a.l() {
        for i in 0..a.rows() {
            for j in 0..bt.rows() {
                out.push(f16_rne(naive_dot(a, i, bt, j, b) * al));
            }
        }
    }
    out
}

fn naive_silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn naive_dual(p: &DualGemm) -> Vec<f16> {
    let (a1, a2) = (alpha_of(p.alpha, &p.a, &p.b1), alpha_of(p.alpha, &p.a, &p.b2));
    let mut out = Vec::new();
    for b in 0..p.a.l() {
        for i in 0..p.a.rows() {
            for j in 0..p.b1.rows() {
                let x1 = (naive_dot(&p.a, i, &p.b1, j, b) * a1) as f32;
                let x2 = (naive_dot(&p.a, i, &p.b2, j, b) * a2) as f32;
                out.push(f16_rne((naive_silu(x1) * x2) as f64));
            }
        }
    }
    out
}

fn assert_bits_eq(got: &[f16], want: &[f16], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (idx, (g, w)) in got.iter().zip(want).enumerate() {
        let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
        assert!(same, "{what}: element {idx}: got {g} ({:#06x}), want {w} ({:#06x})", g.to_bits(), w.to_bits());
    }
}

// ---------------------------------------------------------------------------------------------
// Test data.

/// A random tensor: all 16 codes; scales of either sign from the subnormals up to 7.5 (codes
/// below 0x50), so products span about 2^-20 .. 2^11 and every f64 sum here is exact.
fn random_tensor(rng: &mut Rng, l: usize, rows: usize, k: usize, layout: ScaleLayout) -> Nvfp4Tensor {
    let values: Vec<u8> = (0..l * rows * k / 2).map(|_| rng.below(256) as u8).collect();
    let sf = k / 16;
    let plain: Vec<u8> = (0..l * rows * sf).map(|_| rng.below(0x50) as u8 | (rng.below(2) as u8 * 0x80)).collect();
    let scales = match layout {
        ScaleLayout::Plain => plain,
        ScaleLayout::Blocked => {
            // Padding is don't-care on input: fill it with NaN codes.
            let len = l * rows.div_ceil(128) * sf.div_ceil(4) * 512;
            let mut s = vec![0x7Fu8; len];
            for b in 0..l {
                for i in 0..rows {
                    for j in 0..sf {
                        s[scale_offset(layout, rows, sf, i, j, b)] = plain[(b * rows + i) * sf + j];
                    }
                }
            }
            s
        }
    };
    Nvfp4Tensor::new(l, rows, k, values, scales, layout).unwrap()
}

const LAYOUTS: [ScaleLayout; 2] = [ScaleLayout::Plain, ScaleLayout::Blocked];
/// (alpha, global_a, global_b): powers of two for the globals keep alpha*ga*gb order-free.
const SCALINGS: [(Option<f32>, f32, f32); 4] =
    [(None, 1.0, 1.0), (Some(0.3), 1.0, 1.0), (None, 0.5, 4.0), (Some(-1.7), 0.25, 0.125)];

// ---------------------------------------------------------------------------------------------
// Random shapes against the naive loop, bit for bit.

#[test]
fn gemv_matches_naive() {
    let mut rng = Rng::new(1);
    let cpu = CpuBackend;
    let mut checked = 0;
    for &(m, k, l) in &[(1, 16, 1), (7, 48, 3), (40, 16, 1), (130, 48, 3), (130, 256, 1), (1, 48, 3)] {
        for layout in LAYOUTS {
            for (alpha, ga, gb) in SCALINGS {
                let a = random_tensor(&mut rng, l, m, k, layout).with_global_scale(ga);
                let b = random_tensor(&mut rng, l, 1, k, layout).with_global_scale(gb);
                let p = Gemv::new(a, b, alpha).unwrap();
                let got = cpu.gemv(&p).unwrap();
                assert_eq!(got.shape(), [l, m, 1]);
                let want = naive_gemm(&p.a, &p.b, alpha);
                assert_bits_eq(got.data(), &want, &format!("gemv {m}x{k}x{l} {layout:?} {alpha:?} {ga} {gb}"));
                checked += want.len();
            }
        }
    }
    assert!(checked > 1000);
}

#[test]
fn gemm_matches_naive() {
    let mut rng = Rng::new(2);
    let cpu = CpuBackend;
    let dims = [(1, 1), (1, 130), (7, 40), (40, 7), (130, 1), (130, 130), (33, 17)];
    for &(m, n) in &dims {
        for &(k, l) in &[(16, 1), (48, 3)] {
            for layout in LAYOUTS {
                for (alpha, ga, gb) in SCALINGS {
                    let a = random_tensor(&mut rng, l, m, k, layout).with_global_scale(ga);
                    let b = random_tensor(&mut rng, l, n, k, layout).with_global_scale(gb);
                    let p = Gemm::new(a, b, alpha).unwrap();
                    let got = cpu.gemm(&p).unwrap();
                    assert_eq!(got.shape(), [l, m, n]);
                    let want = naive_gemm(&p.a, &p.b, alpha);
                    let what = format!("gemm {m}x{n}x{k}x{l} {layout:?} {alpha:?} {ga} {gb}");
                    assert_bits_eq(got.data(), &want, &what);
                }
            }
        }
    }
}

#[test]
fn gemm_mixed_layouts_match_naive() {
    // A plain, B blocked and the other way round.
    let mut rng = Rng::new(3);
    for (la, lb) in [(ScaleLayout::Plain, ScaleLayout::Blocked), (ScaleLayout::Blocked, ScaleLayout::Plain)] {
        let a = random_tensor(&mut rng, 2, 130, 80, la);
        let b = random_tensor(&mut rng, 2, 40, 80, lb);
        let p = Gemm::new(a, b, None).unwrap();
        let got = CpuBackend.gemm(&p).unwrap();
        assert_bits_eq(got.data(), &naive_gemm(&p.a, &p.b, None), &format!("{la:?} x {lb:?}"));
    }
}

#[test]
fn dual_gemm_matches_naive() {
    let mut rng = Rng::new(4);
    let cpu = CpuBackend;
    for &(m, n, k, l) in &[(1, 1, 16, 1), (7, 40, 48, 3), (40, 7, 16, 1), (130, 7, 48, 1), (1, 130, 16, 3)] {
        for layout in LAYOUTS {
            for (alpha, ga, gb) in SCALINGS {
                let a = random_tensor(&mut rng, l, m, k, layout).with_global_scale(ga);
                let b1 = random_tensor(&mut rng, l, n, k, layout).with_global_scale(gb);
                // b2 gets a different global scale from b1.
                let b2 = random_tensor(&mut rng, l, n, k, layout).with_global_scale(gb * 2.0);
                let p = DualGemm::new(a, b1, b2, alpha).unwrap();
                let got = cpu.dual_gemm(&p).unwrap();
                assert_eq!(got.shape(), [l, m, n]);
                let what = format!("dual {m}x{n}x{k}x{l} {layout:?} {alpha:?} {ga} {gb}");
                assert_bits_eq(got.data(), &naive_dual(&p), &what);
            }
        }
    }
}

#[test]
fn grouped_gemm_matches_naive() {
    let mut rng = Rng::new(5);
    let dims = [(1, 7, 16), (40, 1, 48), (130, 40, 32), (7, 130, 80), (72, 56, 16)];
    for layout in LAYOUTS {
        let groups: Vec<Gemm> = dims
            .iter()
            .enumerate()
            .map(|(g, &(m, n, k))| {
                let a = random_tensor(&mut rng, 1, m, k, layout).with_global_scale(if g == 1 { 0.5 } else { 1.0 });
                let b = random_tensor(&mut rng, 1, n, k, layout);
                Gemm::new(a, b, if g == 2 { Some(0.75) } else { None }).unwrap()
            })
            .collect();
        let p = GroupedGemm::new(groups).unwrap();
        let got = CpuBackend.grouped_gemm(&p).unwrap();
        assert_eq!(got.len(), dims.len());
        for (g, (t, gm)) in got.iter().zip(&p.groups).enumerate() {
            let (m, n, _) = dims[g];
            assert_eq!(t.shape(), [1, m, n], "group {g}");
            assert_bits_eq(t.data(), &naive_gemm(&gm.a, &gm.b, gm.alpha), &format!("{layout:?} group {g}"));
        }
        // The same through Problem::run.
        let out = Problem::GroupedGemm(p.clone()).run(&CpuBackend).unwrap();
        assert_eq!(out, Output::Grouped(got));
    }
}

#[test]
fn problem_run_and_with_layout_agree() {
    let mut rng = Rng::new(6);
    let a = random_tensor(&mut rng, 2, 130, 48, ScaleLayout::Plain);
    let b = random_tensor(&mut rng, 2, 7, 48, ScaleLayout::Plain);
    let p = Problem::Gemm(Gemm::new(a, b, Some(2.0)).unwrap());
    let plain = p.run(&CpuBackend).unwrap();
    let blocked = p.with_layout(ScaleLayout::Blocked).run(&CpuBackend).unwrap();
    assert_eq!(plain, blocked);
    let Problem::Gemm(g) = &p else { unreachable!() };
    assert_eq!(plain, Output::Single(F16Tensor::new(2, 130, 7, naive_gemm(&g.a, &g.b, Some(2.0))).unwrap()));
}

// ---------------------------------------------------------------------------------------------
// Hand-worked examples.

/// One row of packed codes: `nz` lists (k, code); everything else code 0.
fn row(k: usize, nz: &[(usize, u8)]) -> Vec<u8> {
    let mut r = vec![0u8; k / 2];
    for &(kk, code) in nz {
        r[kk / 2] |= if kk.is_multiple_of(2) { code } else { code << 4 };
    }
    r
}

fn tensor(k: usize, rows: &[Vec<u8>], scales: &[&[u8]]) -> Nvfp4Tensor {
    let values: Vec<u8> = rows.concat();
    let s: Vec<u8> = scales.concat();
    Nvfp4Tensor::new(1, rows.len(), k, values, s, ScaleLayout::Plain).unwrap()
}

fn f16s(v: &[f32]) -> Vec<f16> {
    // Only values exactly representable in f16 are written here; no rounding happens.
    v.iter()
        .map(|&x| {
            let h = f16::from_f32(x);
            assert_eq!(h.to_f32(), x, "{x} is not an f16 value");
            h
        })
        .collect()
}

// E4M3 codes used below: 0x00 = 0, 0x01 = 2^-9, 0x30 = 0.5, 0x38 = 1, 0x40 = 2, 0x48 = 4,
// 0x58 = 16, 0x7E = 448, 0x28 = 0.25.

#[test]
fn hand_gemv() {
    let k = 16;
    // A row 0, scale 2: k0 = 4 (code 6), k1 = -0.5 (9), k2 = -0 (8), k3 = -6 (15).
    // A row 1, scale 448: every element 6 (code 7).
    let a = tensor(
        k,
        &[row(k, &[(0, 6), (1, 9), (2, 8), (3, 15)]), row(k, &(0..16).map(|i| (i, 7)).collect::<Vec<_>>())],
        &[&[0x40], &[0x7E]],
    );
    // B, scale 0.5: k0 = 1 (2), k1 = 1.5 (3), k2 = 6 (7), k3 = 0.5 (1).
    let b = tensor(k, &[row(k, &[(0, 2), (1, 3), (2, 7), (3, 1)])], &[&[0x30]]);
    // c0 = (2*0.5) * (4*1 - 0.5*1.5 - 0*6 - 6*0.5) = 4 - 0.75 - 3 = 0.25
    // c1 = (448*0.5) * 6 * (1 + 1.5 + 6 + 0.5) = 224 * 54 = 12096 (f16: 8-spaced there, exact)
    let p = Gemv::new(a, b, None).unwrap();
    let got = CpuBackend.gemv(&p).unwrap();
    assert_eq!(got.shape(), [1, 2, 1]);
    assert_bits_eq(got.data(), &f16s(&[0.25, 12096.0]), "hand gemv");
    // With alpha = -0.5: -0.125 and -6048.
    let p = Gemv::new(p.a, p.b, Some(-0.5)).unwrap();
    assert_bits_eq(CpuBackend.gemv(&p).unwrap().data(), &f16s(&[-0.125, -6048.0]), "hand gemv alpha");
}

#[test]
fn hand_gemm_with_ties_and_single_rounding() {
    let k = 48; // three scale blocks: k 0..16, 16..32, 32..48
                // A row 0: k0 = 4 (code 6) scale 16 | k16 = 1 (2) scale 1 | k32 = 0.5 (1) scale 2^-9
                // A row 1: k0 = -0.5 (9), k1 = -0 (8), k2 = 1.5 (3) scale 1 | k16 = 6 (7), k32 = 6 (7), scales 0
                // A row 2: k0 = 2 (4) scale 16 | k16 = 0.5 (1) scale 1 | k32 = 6 (7) scale 0
    let a = tensor(
        k,
        &[
            row(k, &[(0, 6), (16, 2), (32, 1)]),
            row(k, &[(0, 9), (1, 8), (2, 3), (16, 7), (32, 7)]),
            row(k, &[(0, 4), (16, 1), (32, 7)]),
        ],
        &[&[0x58, 0x38, 0x01], &[0x38, 0x00, 0x00], &[0x58, 0x38, 0x00]],
    );
    // B row 0: k0 = 4 (6) scale 16 | k16 = 2 (4) scale 1 | k32 = 0.5 (1) scale 2^-9
    // B row 1: k0 = -4 (14), k1 = -0 (8) scale 16 | k16 = 1 (2) scale 1 | nothing, scale 448
    let b = tensor(
        k,
        &[row(k, &[(0, 6), (16, 4), (32, 1)]), row(k, &[(0, 14), (1, 8), (16, 2)])],
        &[&[0x58, 0x38, 0x01], &[0x58, 0x38, 0x7E]],
    );
    // c[0,0] = 64*64 + 1*2 + 2^-10 * 2^-10 = 4098 + 2^-20. f16 values there are 4 apart; 4098 is
    //          the midpoint of 4096 and 4100 and the 2^-20 puts it above: 4100. (Rounding to f32
    //          first would land on the midpoint exactly and give 4096: the sum must round once.)
    // c[0,1] = 64*(-64) + 1*1 = -4095: midpoint of -4094 (odd mantissa) and -4096 -> -4096.
    // c[1,0] = (-0.5)*64 = -32 (the -0 and zero-scaled elements add nothing).
    // c[1,1] = (-0.5)*(-64) + (-0)*(-0) = 32.
    // c[2,0] = 32*64 + 0.5*2 = 2049: midpoint of 2048 (even) and 2050 -> 2048.
    // c[2,1] = 32*(-64) + 0.5*1 = -2047.5: midpoint of -2047 (odd) and -2048 -> -2048.
    let p = Gemm::new(a, b, None).unwrap();
    let got = CpuBackend.gemm(&p).unwrap();
    assert_eq!(got.shape(), [1, 3, 2]);
    assert_bits_eq(got.data(), &f16s(&[4100.0, -4096.0, -32.0, 32.0, 2048.0, -2048.0]), "hand gemm");
    // And the naive loop agrees with the hand values.
    assert_bits_eq(&naive_gemm(&p.a, &p.b, None), &f16s(&[4100.0, -4096.0, -32.0, 32.0, 2048.0, -2048.0]), "naive");
}

#[test]
fn hand_gemm_alpha_and_global_scales() {
    let k = 16;
    // A: k0 = 3 (code 5), scale 1; B: k0 = 1.5 (code 3), scale 2 -> sum 9.
    let a = tensor(k, &[row(k, &[(0, 5)])], &[&[0x38]]).with_global_scale(0.5);
    let b = tensor(k, &[row(k, &[(0, 3)])], &[&[0x40]]).with_global_scale(4.0);
    // 9 * alpha 0.75 * 0.5 * 4 = 13.5
    let p = Gemm::new(a, b, Some(0.75)).unwrap();
    assert_bits_eq(CpuBackend.gemm(&p).unwrap().data(), &f16s(&[13.5]), "alpha and globals");
    // Overflow: 9 * 8192 = 73728 > 65504 rounds to +inf.
    let p = Gemm::new(p.a.with_global_scale(1.0), p.b.with_global_scale(1.0), Some(8192.0)).unwrap();
    assert_bits_eq(CpuBackend.gemm(&p).unwrap().data(), &[f16::INFINITY], "overflow");
}

#[test]
fn hand_dual_gemm() {
    let k = 16;
    // A: k0 = 1 (code 2), k1 = 0.5 (code 1), scale 1.
    let a = tensor(k, &[row(k, &[(0, 2), (1, 1)])], &[&[0x38]]);
    // B1 row 0: k0 = 2 (4)        -> x1 = 2
    // B1 row 1: k0 = -1 (10)      -> x1 = -1
    let b1 = tensor(k, &[row(k, &[(0, 4)]), row(k, &[(0, 10)])], &[&[0x38], &[0x38]]);
    // B2 row 0: k0 = 3 (5), k1 = -0 (8)  -> x2 = 3
    // B2 row 1: k0 = -2 (12)             -> x2 = -2
    let b2 = tensor(k, &[row(k, &[(0, 5), (1, 8)]), row(k, &[(0, 12)])], &[&[0x38], &[0x38]]);
    // silu(2) * 3 = 3 * 2 / (1 + e^-2) = 5.2847825; f16 spacing 2^-8 there: 1352.90 steps ->
    //   1353 / 256 = 5.28515625.
    // silu(-1) * -2 = 2 / (1 + e) = 0.5378828; spacing 2^-11: 1101.58 steps -> 1102 / 2048
    //   = 0.5380859375.
    let p = DualGemm::new(a, b1, b2, None).unwrap();
    let got = CpuBackend.dual_gemm(&p).unwrap();
    assert_eq!(got.shape(), [1, 1, 2]);
    assert_bits_eq(got.data(), &f16s(&[1353.0 / 256.0, 1102.0 / 2048.0]), "hand dual");
    // The same through the test's own f32 gate.
    let own: Vec<f16> =
        [(2f32, 3f32), (-1.0, -2.0)].iter().map(|&(x1, x2)| f16_rne((naive_silu(x1) * x2) as f64)).collect();
    assert_bits_eq(got.data(), &own, "own f32 silu");
}

#[test]
fn hand_grouped_gemm() {
    // Group 0: M = N = 1, K = 16. A: all 1 (code 2) scale 2; B: all 1.5 (code 3) scale 0.5.
    //   c = 16 * (1*2) * (1.5*0.5) = 24.
    let all = |c: u8| row(16, &(0..16).map(|i| (i, c)).collect::<Vec<_>>());
    let g0 = Gemm::new(tensor(16, &[all(2)], &[&[0x40]]), tensor(16, &[all(3)], &[&[0x30]]), None).unwrap();
    // Group 1: M = 2, N = 1, K = 32.
    //   A row 0: k0 = -6 (15) scale 1 | k16 = 0.5 (1) scale 4
    //   A row 1: k0 = -0.5 (9) scale 1 | nothing, scale 0
    //   B: k0 = 6 (7) scale 1 | k16 = 4 (6) scale 0.25
    //   c0 = -36 + (0.5*4)*(4*0.25) = -34; c1 = -0.5 * 6 = -3.
    let a1 = tensor(32, &[row(32, &[(0, 15), (16, 1)]), row(32, &[(0, 9)])], &[&[0x38, 0x48], &[0x38, 0x00]]);
    let b1 = tensor(32, &[row(32, &[(0, 7), (16, 6)])], &[&[0x38, 0x28]]);
    let g1 = Gemm::new(a1, b1, None).unwrap();
    let got = CpuBackend.grouped_gemm(&GroupedGemm::new(vec![g0, g1]).unwrap()).unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].shape(), [1, 1, 1]);
    assert_eq!(got[1].shape(), [1, 2, 1]);
    assert_bits_eq(got[0].data(), &f16s(&[24.0]), "group 0");
    assert_bits_eq(got[1].data(), &f16s(&[-34.0, -3.0]), "group 1");
}

#[test]
fn naive_f16_rounding_self_check() {
    // Hand-checked values for the test's own rounding.
    let cases: [(f64, u16); 10] = [
        (1.0, 0x3C00),
        (-2.0, 0xC000),
        (65504.0, 0x7BFF),
        (65519.99, 0x7BFF),
        (65520.0, 0x7C00),
        (2049.0, 0x6800),               // tie -> 2048
        (2051.0, 0x6802),               // tie -> 2052
        (2f64.powi(-24), 0x0001),       // smallest subnormal
        (2f64.powi(-25), 0x0000),       // tie with 0 -> 0
        (3.0 * 2f64.powi(-25), 0x0002), // tie between 1 and 2 subnormal steps -> 2
    ];
    for (x, bits) in cases {
        assert_eq!(f16_rne(x).to_bits(), bits, "{x}");
    }
    assert_eq!(f16_rne(-0.0).to_bits(), 0x8000);
    // Every finite f16 value maps to itself, and every midpoint between neighbours to the even one.
    for b in 0u16..0x7BFF {
        let v = f16::from_bits(b).to_f64();
        assert_eq!(f16_rne(v).to_bits(), b);
        let next = f16::from_bits(b + 1).to_f64();
        let mid = (v + next) / 2.0;
        let even = if b.is_multiple_of(2) { b } else { b + 1 };
        assert_eq!(f16_rne(mid).to_bits(), even, "midpoint above {b:#06x}");
    }
}

// ---------------------------------------------------------------------------------------------
// The checker.

fn t(l: usize, r: usize, c: usize, v: Vec<f16>) -> F16Tensor {
    F16Tensor::new(l, r, c, v).unwrap()
}

fn ramp(n: usize) -> Vec<f16> {
    (0..n).map(|i| f16::from_f32(i as f32 * 0.75 - 7.0)).collect()
}

#[test]
fn checker_passes_identical_outputs() {
    let a = t(2, 3, 4, ramp(24));
    for mode in [Mode::BitExact, Mode::Tolerance] {
        let r = compare(&a, &a.clone(), mode);
        assert!(r.passed(), "{mode:?}: {r}");
        assert_eq!(r.elements, 24);
        assert_eq!(r.failures, 0);
        assert!(r.mismatches.is_empty());
    }
}

#[test]
fn checker_one_ulp_fails_bit_exact_only() {
    let want = t(2, 3, 4, ramp(24));
    let mut v = ramp(24);
    v[17] = f16::from_bits(v[17].to_bits() + 1);
    let got = t(2, 3, 4, v.clone());
    let r = compare(&got, &want, Mode::BitExact);
    assert!(!r.passed());
    assert_eq!(r.failures, 1);
    // Element 17 of [2, 3, 4] is [1, 1, 1].
    assert_eq!(r.mismatches[0].index, [1, 1, 1]);
    assert_eq!(r.mismatches[0].got.to_bits(), v[17].to_bits());
    assert_eq!(r.mismatches[0].expected.to_bits(), ramp(24)[17].to_bits());
    // One ulp of 5.75 is 2^-8, inside 1e-3 + 1e-3 * 5.75.
    assert!(compare(&got, &want, Mode::Tolerance).passed());
    // +0 and -0 differ in their bits.
    assert!(!element_passes(f16::NEG_ZERO, f16::ZERO, Mode::BitExact));
    assert!(element_passes(f16::NEG_ZERO, f16::ZERO, Mode::Tolerance));
}

#[test]
fn checker_tolerance_boundary() {
    // For each reference value, walk up in f16 steps: the last value with
    // |got - ref| <= 1e-3 + 1e-3 |ref| passes, the next fails (computed here in f64).
    for e in [0.0f32, 1.0, -1.0, 0.3, 7.0, 1000.0, -1000.0, 60000.0, 1e-4] {
        let ef = f16::from_f32(e);
        let ev = ef.to_f64();
        let tol = 1e-3 + 1e-3 * ev.abs();
        let step =
            |h: f16| if h.to_f64() >= 0.0 { f16::from_bits(h.to_bits() + 1) } else { f16::from_bits(h.to_bits() - 1) };
        let mut inside = if ev == 0.0 { f16::ZERO } else { ef };
        loop {
            let nx = step(inside);
            if (nx.to_f64() - ev).abs() > tol {
                break;
            }
            inside = nx;
        }
        let outside = step(inside);
        assert!(outside.is_finite(), "{e}");
        assert!(element_passes(inside, ef, Mode::Tolerance), "ref {e}: {inside} should pass");
        assert!(!element_passes(outside, ef, Mode::Tolerance), "ref {e}: {outside} should fail");
        // Mirror below the reference.
        let lo_in = f16::from_f64(2.0 * ev - inside.to_f64());
        if (lo_in.to_f64() - ev).abs() <= tol {
            assert!(element_passes(lo_in, ef, Mode::Tolerance), "ref {e}: {lo_in} should pass");
        }
        // Also through compare(), in the middle of a tensor.
        let mut v = vec![f16::ONE; 6];
        v[4] = ef;
        let want = t(1, 2, 3, v.clone());
        v[4] = inside;
        assert!(compare(&t(1, 2, 3, v.clone()), &want, Mode::Tolerance).passed());
        v[4] = outside;
        let r = compare(&t(1, 2, 3, v), &want, Mode::Tolerance);
        assert!(!r.passed());
        assert_eq!(r.mismatches[0].index, [0, 1, 1]);
    }
    // A hand case: ref 1.0, tolerance 0.002; f16 spacing above 1 is 2^-10 ~ 0.000977:
    // 1 + 2 ulps (0.00195) passes, 1 + 3 ulps (0.00293) fails.
    assert!(element_passes(f16::from_bits(0x3C02), f16::ONE, Mode::Tolerance));
    assert!(!element_passes(f16::from_bits(0x3C03), f16::ONE, Mode::Tolerance));
}

#[test]
fn checker_nan_and_inf_parity() {
    let nan = f16::NAN;
    for mode in [Mode::BitExact, Mode::Tolerance] {
        assert!(!element_passes(nan, f16::ONE, mode), "{mode:?} NaN vs 1");
        assert!(!element_passes(f16::ONE, nan, mode), "{mode:?} 1 vs NaN");
        assert!(element_passes(nan, nan, mode), "{mode:?} NaN vs NaN");
        assert!(element_passes(-nan, nan, mode), "{mode:?} -NaN vs NaN");
        assert!(!element_passes(f16::INFINITY, f16::NEG_INFINITY, mode), "{mode:?} +inf vs -inf");
        assert!(!element_passes(f16::NEG_INFINITY, f16::INFINITY, mode), "{mode:?} -inf vs +inf");
        assert!(element_passes(f16::INFINITY, f16::INFINITY, mode), "{mode:?} inf vs inf");
        assert!(!element_passes(f16::INFINITY, nan, mode), "{mode:?} inf vs NaN");
        assert!(!element_passes(f16::MAX, f16::INFINITY, mode), "{mode:?} max vs inf");
        assert!(!element_passes(f16::INFINITY, f16::MAX, mode), "{mode:?} inf vs max");
    }
    let want = t(1, 1, 3, vec![f16::ONE, f16::NAN, f16::INFINITY]);
    assert!(compare(&want.clone(), &want, Mode::Tolerance).passed());
    let got = t(1, 1, 3, vec![f16::ONE, f16::ONE, f16::INFINITY]);
    let r = compare(&got, &want, Mode::Tolerance);
    assert!(!r.passed());
    assert_eq!(r.mismatches[0].index, [0, 0, 1]);
}

#[test]
fn checker_report_names_first_mismatch() {
    let want = t(2, 3, 4, ramp(24));
    let mut v = ramp(24);
    v[23] = f16::from_f32(100.0); // [1, 2, 3], was 10.25
    v[6] = f16::from_f32(-3.0); // [0, 1, 2], was -2.5
    let r = compare(&t(2, 3, 4, v), &want, Mode::Tolerance);
    assert!(!r.passed());
    assert_eq!(r.failures, 2);
    assert_eq!(r.elements, 24);
    let m = &r.mismatches[0];
    assert_eq!((m.tensor, m.index), (0, [0, 1, 2]));
    assert_eq!((m.got.to_f32(), m.expected.to_f32()), (-3.0, -2.5));
    assert_eq!(r.mismatches[1].index, [1, 2, 3]);
    let text = r.to_string();
    assert!(text.contains("FAIL"), "{text}");
    assert!(text.contains("[0, 1, 2]") && text.contains("-3") && text.contains("-2.5"), "{text}");
    assert!(text.contains("[1, 2, 3]") && text.contains("100") && text.contains("10.25"), "{text}");
}

#[test]
fn checker_structure_mismatches_fail() {
    let a = t(1, 2, 3, ramp(6));
    let b = t(1, 3, 2, ramp(6));
    for mode in [Mode::BitExact, Mode::Tolerance] {
        let r = compare(&a, &b, mode);
        assert!(!r.passed(), "{mode:?}");
        assert!(r.structure.is_some());
        assert!(r.to_string().contains("FAIL"));
    }
    let b = t(2, 3, 1, ramp(6));
    assert!(!compare(&a, &b, Mode::Tolerance).passed());

    let one = Output::Grouped(vec![a.clone()]);
    let two = Output::Grouped(vec![a.clone(), a.clone()]);
    assert!(compare_outputs(&two, &two.clone(), Mode::BitExact).passed());
    assert!(!compare_outputs(&one, &two, Mode::BitExact).passed());
    assert!(!compare_outputs(&two, &one, Mode::Tolerance).passed());

    // A mismatch in the second group is reported with its group index.
    let mut v = ramp(6);
    v[0] = f16::from_f32(50.0);
    let bad = Output::Grouped(vec![a.clone(), t(1, 2, 3, v)]);
    let r = compare_outputs(&bad, &two, Mode::BitExact);
    assert!(!r.passed());
    assert_eq!((r.mismatches[0].tensor, r.mismatches[0].index), (1, [0, 0, 0]));
    // Groups of different shapes, same count.
    let other = Output::Grouped(vec![a.clone(), t(1, 1, 6, ramp(6))]);
    assert!(!compare_outputs(&other, &two, Mode::BitExact).passed());
}
