//! NVFP4 block quantization in the NVIDIA ModelOpt convention (SPEC §1):
//! global = amax(tensor) / (6 * 448); per 16-block: scale = e4m3(amax(block) / 6 / global);
//! q = e2m1(x / (scale * global)), nearest even, saturating at ±6.

use super::e2m1::{f32_to_e2m1, E2M1_MAX};
use super::e4m3::{e4m3_to_f32, f32_to_e4m3, E4M3_MAX};
use super::layout::ScaleLayout;
use super::pack::pack_nibbles;
use super::tensor::{check_dims, Nvfp4Tensor};
use crate::{Error, Result};

/// How the per-tensor FP32 global scale is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GlobalScale {
    /// No global scale (1.0): block scales alone must cover the range (max 6 * 448).
    None,
    /// ModelOpt: amax(tensor) / (6 * 448), so the largest block scale lands near 448.
    Auto,
    /// A given value.
    Fixed(f32),
}

/// The ModelOpt global scale of `data`: amax / (6 * 448), or 1.0 for an all-zero tensor.
pub fn modelopt_global_scale(data: &[f32]) -> f32 {
    let amax = data.iter().fold(0f32, |m, x| m.max(x.abs()));
    if amax > 0.0 && amax.is_finite() {
        amax / (E2M1_MAX * E4M3_MAX)
    } else {
        1.0
    }
}

/// Quantizes `[l, rows, k]` values (f32, f16 or bf16: anything that widens to f32 exactly) to
/// NVFP4 with plain-layout scales.
pub fn quantize<T: Copy + Into<f32>>(
    data: &[T],
    l: usize,
    rows: usize,
    k: usize,
    global: GlobalScale,
) -> Result<Nvfp4Tensor> {
    check_dims(l, rows, k)?;
    if data.len() != l * rows * k {
        return Err(Error::BufferSize {
            what: format!("dense input [{l}, {rows}, {k}] (elements)"),
            expected: l * rows * k,
            got: data.len(),
        });
    }
    let x: Vec<f32> = data.iter().map(|&v| v.into()).collect();
    let g = match global {
        GlobalScale::None => 1.0,
        GlobalScale::Auto => modelopt_global_scale(&x),
        GlobalScale::Fixed(g) if g > 0.0 && g.is_finite() => g,
        GlobalScale::Fixed(g) => return Err(Error::Invalid(format!("global scale must be finite and > 0, got {g}"))),
    };
    let mut codes = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(x.len() / 16);
    for block in x.chunks_exact(16) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s_code = f32_to_e4m3(amax / E2M1_MAX / g);
        let s = e4m3_to_f32(s_code) * g;
        scales.push(s_code);
        for &v in block {
            codes.push(if s > 0.0 && s.is_finite() { f32_to_e2m1(v / s) } else { 0 });
        }
    }
    let t = Nvfp4Tensor::new(l, rows, k, pack_nibbles(&codes), scales, ScaleLayout::Plain)?;
    Ok(t.with_global_scale(g))
}
