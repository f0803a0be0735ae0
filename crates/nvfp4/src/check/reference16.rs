//! The W4A16 check's own reference (SPEC §8), written apart from the CPU backend so that
//! `nvfp4 check --backend cpu` tests that backend rather than comparing it with itself: its own
//! E2M1 table and E4M3 decoding, its own scale addressing (plain layout), its own MoE routing, f64
//! sums, and one rounding to the output type by its own arithmetic. The activation's bits are
//! read through the `half` crate.
//!
//! Every product of a 16-bit activation and a decoded weight is exact in f64 (at most 11 + 6
//! significant bits, and no exponent range to leave), and the sum is in f64: exact for the exact
//! tier's data, within K × 2^-53 relative otherwise, far below any output type's resolution.

use std::ops::Range;

use half::{bf16, f16};
use rayon::prelude::*;

use crate::format::{Nvfp4Tensor, OutTensor, OutputDtype, ScaleLayout};
use crate::ops::DualGemm;
use crate::problem::Problem16;
use crate::{Error, Result};

/// E2M1 magnitudes by code (SPEC §1); bit 3 is the sign.
const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

fn e2m1(code: u8) -> f32 {
    let v = E2M1[(code & 7) as usize];
    if code & 8 == 0 {
        v
    } else {
        -v
    }
}

/// E4M3 (`float8_e4m3fn`): 0x7F and 0xFF are NaN, exponent field 0 is subnormal (m/8 × 2^-6).
fn e4m3(code: u8) -> f32 {
    let (exp, man) = ((code >> 3) & 0xF, code & 7);
    let mag = if exp == 0xF && man == 7 {
        f32::NAN
    } else if exp == 0 {
        man as f32 / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + man as f32 / 8.0) * 2f32.powi(exp as i32 - 7)
    };
    if code & 0x80 == 0 {
        mag
    } else {
        -mag
    }
}

/// Batch `b` of an NVFP4 weight as f32 rows `[R, K]` (R its rows), e2m1 × e4m3 (exact in f32)
/// without the global scale, read from the plain layout: the scale of row r, block j at
/// `(b·R + r)·K/16 + j`, the two codes of a byte low nibble first.
fn weight_rows(t: &Nvfp4Tensor, b: usize) -> Vec<f32> {
    let (rows, k) = (t.rows(), t.k());
    let (values, scales) = (t.values(), t.scales());
    let mut out = Vec::with_capacity(rows * k);
    for row in b * rows..(b + 1) * rows {
        for j in 0..k / 16 {
            let s = e4m3(scales[row * (k / 16) + j]);
            for &byte in &values[(row * k + j * 16) / 2..(row * k + j * 16 + 16) / 2] {
                out.push(e2m1(byte & 0xF) * s);
                out.push(e2m1(byte >> 4) * s);
            }
        }
    }
    out
}

/// Rows `rows` of batch `b` of a 16-bit tensor as f32 `[rows.len(), K]` (exact).
fn dense_rows(t: &OutTensor, b: usize, rows: Range<usize>) -> Vec<f32> {
    let [_, r_all, k] = t.shape();
    let bits = &t.bits()[(b * r_all + rows.start) * k..(b * r_all + rows.end) * k];
    match t.dtype() {
        OutputDtype::F16 => bits.iter().map(|&x| f16::from_bits(x).to_f32()).collect(),
        OutputDtype::Bf16 => bits.iter().map(|&x| bf16::from_bits(x).to_f32()).collect(),
    }
}

/// One task's tile: activation rows by weight rows.
const TILE: (usize, usize) = (32, 16);

/// `Σ_k x[i,k]·w[j,k]` for every row i of `x` and j of `w` (both `[·, K]` f32), `[rows(x),
/// rows(w)]` f64, tile by tile in parallel.
fn sums(x: &[f32], w: &[f32], k: usize) -> Vec<f64> {
    let (m, n) = (x.len() / k, w.len() / k);
    let (tm, tn) = TILE;
    let tiles: Vec<(usize, usize)> =
        (0..m.div_ceil(tm)).flat_map(|i| (0..n.div_ceil(tn)).map(move |j| (i, j))).collect();
    let done: Vec<Vec<f64>> = tiles
        .par_iter()
        .map(|&(i, j)| {
            let (rows, cols) = (i * tm..(i * tm + tm).min(m), j * tn..(j * tn + tn).min(n));
            rows.flat_map(|r| cols.clone().map(move |c| dot(&x[r * k..(r + 1) * k], &w[c * k..(c + 1) * k]))).collect()
        })
        .collect();
    let mut out = vec![0f64; m * n];
    for (&(i, j), vals) in tiles.iter().zip(done) {
        let width = (j * tn + tn).min(n) - j * tn;
        for (idx, v) in vals.into_iter().enumerate() {
            out[(i * tm + idx / width) * n + j * tn + idx % width] = v;
        }
    }
    out
}

/// One dot product: each product formed in f64 (exact: at most 11 + 6 significant bits, and no
/// exponent range to leave, which f32 has for extreme bf16 values), eight f64 lanes; K is a
/// multiple of 16, so the lanes take whole chunks.
fn dot(x: &[f32], w: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    for (xc, wc) in x.chunks_exact(8).zip(w.chunks_exact(8)) {
        for t in 0..8 {
            lanes[t] += xc[t] as f64 * wc[t] as f64;
        }
    }
    lanes.iter().sum()
}

/// `x · wᵀ` per batch, `[L, rows(x), rows(w)]` f64 (x dense `[L, M, K]`, w NVFP4 `[L, N, K]`
/// read in the plain layout).
fn products(x: &OutTensor, w: &Nvfp4Tensor) -> Vec<f64> {
    let [l, m, k] = x.shape();
    let w = w.to_layout(ScaleLayout::Plain);
    (0..l).flat_map(|b| sums(&dense_rows(x, b, 0..m), &weight_rows(&w, b), k)).collect()
}

/// `x` rounded to nearest even in `dtype`, once, as bits: `x / 2^q` rounded to an integer with
/// q the quantum of x's binade (the subnormal quantum below the smallest normal), then scaled
/// back, which is exact in f64; past the largest finite value it is an infinity.
pub(crate) fn round_once(x: f64, dtype: OutputDtype) -> u16 {
    // Significant bits, smallest normal exponent, largest finite value.
    let (p, emin, max) = match dtype {
        OutputDtype::F16 => (11, -14, 65504.0),
        OutputDtype::Bf16 => (8, -126, (2.0 - 2f64.powi(-7)) * 2f64.powi(127)),
    };
    let r = if x.is_nan() || x == 0.0 || x.is_infinite() {
        x
    } else {
        let e = ((x.abs().to_bits() >> 52) & 0x7FF) as i32 - 1023;
        let q = e.max(emin) - (p - 1);
        let v = (x * 2f64.powi(-q)).round_ties_even() * 2f64.powi(q);
        if v.abs() > max {
            v.signum() * f64::INFINITY
        } else {
            v
        }
    };
    // r is representable in `dtype` (or NaN, ±0, ±inf), so these conversions are exact.
    match dtype {
        OutputDtype::F16 => f16::from_f64(r).to_bits(),
        OutputDtype::Bf16 => bf16::from_f64(r).to_bits(),
    }
}

/// The factor of SPEC §8: the user alpha (1 when absent) times the weight's global scale, in f32.
fn factor(alpha: Option<f32>, w: &Nvfp4Tensor) -> f64 {
    (alpha.unwrap_or(1.0) * w.global_scale()) as f64
}

fn finish(dtype: OutputDtype, shape: [usize; 3], sums: &[f64], f: f64) -> Result<OutTensor> {
    OutTensor::new(dtype, shape, sums.iter().map(|&s| round_once(s * f, dtype)).collect())
}

/// The result of `p` with outputs in `dtype` (one tensor, or one per group), computed as the
/// module docs say. The operation's rules are checked first.
pub fn reference16(p: &Problem16, dtype: OutputDtype) -> Result<Vec<OutTensor>> {
    p.validate()?;
    Ok(match p {
        Problem16::Gemv(g) => {
            // Each batch's vector against the matrix rows: [L, 1, M], the memory of [L, M, 1].
            let [l, m, _] = [g.a.l(), g.a.rows(), g.a.k()];
            vec![finish(dtype, [l, m, 1], &products(&g.b, &g.a), factor(g.alpha, &g.a))?]
        }
        Problem16::Gemm(g) => {
            let (m, n, _, l) = g.mnkl();
            vec![finish(dtype, [l, m, n], &products(&g.a, &g.b), factor(g.alpha, &g.b))?]
        }
        Problem16::DualGemm(d) => {
            let (x1, x2) = dual_products(d);
            vec![gate(d, &x1, &x2, dtype)?]
        }
        Problem16::GroupedGemm(g) => g
            .groups
            .iter()
            .map(|x| {
                let (m, n, _, _) = x.mnkl();
                finish(dtype, [1, m, n], &products(&x.a, &x.b), factor(x.alpha, &x.b))
            })
            .collect::<Result<_>>()?,
        Problem16::Moe(moe) => vec![moe_reference(moe, dtype)?],
    })
}

/// The dual GEMM's two products before the gate, each scaled by its factor in f64: x1 = f1 ·
/// A·B1ᵀ and x2 = f2 · A·B2ᵀ, `[L, M, N]` each.
pub fn dual_products(d: &DualGemm<OutTensor>) -> (Vec<f64>, Vec<f64>) {
    let x1 = products(&d.a, &d.b1).into_iter().map(|s| s * factor(d.alpha, &d.b1)).collect();
    let x2 = products(&d.a, &d.b2).into_iter().map(|s| s * factor(d.alpha, &d.b2)).collect();
    (x1, x2)
}

/// The dual GEMM's sums of absolute products, `|f1| · Σ_k |A·B1|` and `|f2| · Σ_k |A·B2|`
/// (`[L, M, N]` each): [`products`] of the operands with their sign bits cleared (every term is
/// then the absolute value of the signed one, exactly). They bound every partial sum of x1 and
/// x2, whatever the order (`gate_slack`).
pub fn dual_abs_products(d: &DualGemm<OutTensor>) -> Result<(Vec<f64>, Vec<f64>)> {
    let a = OutTensor::new(d.a.dtype(), d.a.shape(), d.a.bits().iter().map(|&b| b & 0x7FFF).collect())?;
    let abs = |w: &Nvfp4Tensor| -> Result<Vec<f64>> {
        // Both nibbles' sign bits (bit 3 of each code) and the E4M3 scales' sign bits cleared.
        let values = w.values().iter().map(|&b| b & 0x77).collect();
        let scales = w.scales().iter().map(|&s| s & 0x7F).collect();
        let w =
            Nvfp4Tensor::new(w.l(), w.rows(), w.k(), values, scales, w.layout())?.with_global_scale(w.global_scale());
        let f = factor(d.alpha, &w).abs();
        Ok(products(&a, &w).into_iter().map(|s| s * f).collect())
    };
    Ok((abs(&d.b1)?, abs(&d.b2)?))
}

/// The gate of SPEC §3 on [`dual_products`]' x1 and x2: each rounded to f32, silu(x1) · x2 in
/// f32, one rounding to `dtype`.
pub fn gate(d: &DualGemm<OutTensor>, x1: &[f64], x2: &[f64], dtype: OutputDtype) -> Result<OutTensor> {
    let (m, n, _, l) = d.mnkl();
    let gated: Vec<u16> = x1
        .iter()
        .zip(x2)
        .map(|(&x1, &x2)| {
            let (g, u) = (x1 as f32, x2 as f32);
            let silu = g / (1.0 + (-g).exp());
            round_once((silu * u) as f64, dtype)
        })
        .collect();
    OutTensor::new(dtype, [l, m, n], gated)
}

/// The MoE form: expert e's rows `offsets[e-1]..offsets[e]` of the tokens against batch e of
/// the weights, scaled by the expert's alpha; rows past the last offset stay zero.
fn moe_reference(p: &crate::MoeGemm<OutTensor>, dtype: OutputDtype) -> Result<OutTensor> {
    let [_, t, k] = p.a.shape();
    let n = p.b.rows();
    let w = p.b.to_layout(ScaleLayout::Plain);
    let mut bits = vec![0u16; t * n];
    let mut start = 0usize;
    for (e, &end) in p.offsets.iter().enumerate() {
        let end = usize::try_from(end)
            .ok()
            .filter(|&v| v >= start && v <= t)
            .ok_or_else(|| Error::Shape(format!("moe reference: offset {e} = {end} is outside {start}..={t}")))?;
        if end > start {
            let f = factor(p.alpha.of_expert(e)?, &p.b);
            let s = sums(&dense_rows(&p.a, 0, start..end), &weight_rows(&w, e), k);
            for (o, &v) in bits[start * n..end * n].iter_mut().zip(&s) {
                *o = round_once(v * f, dtype);
            }
        }
        start = end;
    }
    OutTensor::new(dtype, [1, t, n], bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoders_agree_with_the_format_tables() {
        for code in 0..16u8 {
            assert_eq!(e2m1(code).to_bits(), crate::format::e2m1_to_f32(code).to_bits(), "e2m1 {code}");
        }
        for code in 0..=255u8 {
            let (mine, lib) = (e4m3(code), crate::format::e4m3_to_f32(code));
            assert!(mine.to_bits() == lib.to_bits() || (mine.is_nan() && lib.is_nan()), "e4m3 {code:#04x}");
        }
        assert!(e4m3(0x7F).is_nan() && e4m3(0xFF).is_nan());
        assert_eq!((e4m3(0x01), e4m3(0x7E), e4m3(0xB8)), (2f32.powi(-9), 448.0, -1.0));
    }

    #[test]
    fn one_rounding_from_f64() {
        let (h, b) = (OutputDtype::F16, OutputDtype::Bf16);
        // Ties to even, and a hair above a tie goes up (the cases a rounding through f32 loses).
        assert_eq!(round_once(4098.0, h), f16::from_f32(4096.0).to_bits());
        assert_eq!(round_once(4098.0 + 2f64.powi(-20), h), f16::from_f32(4100.0).to_bits());
        assert_eq!(round_once(-(1.0 + 2f64.powi(-8)), b), bf16::from_f32(-1.0).to_bits());
        assert_eq!(round_once(1.0 + 2f64.powi(-8) + 2f64.powi(-40), b), bf16::from_f32(1.0 + 2f32.powi(-7)).to_bits());
        // Subnormals: f16's quantum is 2^-24 (a tie at 1.5 quanta goes to 2), bf16's 2^-133.
        assert_eq!(round_once(1.5 * 2f64.powi(-24), h), 2);
        assert_eq!(round_once(0.5 * 2f64.powi(-24), h), 0);
        assert_eq!(round_once(2f64.powi(-133), b), 1);
        // Overflow: 65520 is the tie between 65504 and 2^16, and goes to infinity.
        assert_eq!(round_once(65519.0, h), f16::from_f32(65504.0).to_bits());
        assert_eq!(round_once(65520.0, h), f16::INFINITY.to_bits());
        assert_eq!(round_once(-1e300, b), bf16::NEG_INFINITY.to_bits());
        assert_eq!(round_once(70000.0, b), bf16::from_f32(70144.0).to_bits());
        assert_eq!(round_once(-0.0, h), f16::NEG_ZERO.to_bits());
        assert!(f16::from_bits(round_once(f64::NAN, h)).is_nan());
    }
}
