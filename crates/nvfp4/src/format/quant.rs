//! NVFP4 block quantization in the NVIDIA ModelOpt convention (SPEC §1):
//! global = amax(tensor) / (6 * 448), at least [`MIN_GLOBAL_SCALE`]; per 16-block:
//! scale = e4m3(amax(block) / 6 / global); q = e2m1(x / (scale * global)), nearest even,
//! saturating at ±6.
//!
//! NaN and infinities have no NVFP4 encoding. [`quantize`] refuses them, naming the first.
//! [`quantize_nan_blocks`] is the GPU quantizer's rule, which cannot stop a launch to refuse
//! (kernels/quantize.cu): a block holding one gets the E4M3 NaN scale, so that NaN reaches
//! exactly the products that use that block, and the global scale ignores them.

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
    /// ModelOpt: amax(tensor) / (6 * 448), so the largest block scale lands near 448 (see
    /// [`modelopt_global_scale`]).
    Auto,
    /// A given value.
    Fixed(f32),
}

/// The smallest global scale [`GlobalScale::Auto`] gives: the smallest normal f32, 2^-126.
/// amax / 2688 of a tensor of tiny values underflows to a subnormal or to 0, and a checkpoint's
/// global scale must be finite and > 0 (its reciprocal finite too, for compressed-tensors).
pub const MIN_GLOBAL_SCALE: f32 = f32::MIN_POSITIVE;

/// The scale code of a block that held a NaN or an infinity under [`quantize_nan_blocks`]: the
/// E4M3 NaN (SPEC §1).
pub const NAN_SCALE: u8 = 0x7F;

/// The ModelOpt global scale of `data`: amax / (6 * 448) over its finite elements, at least
/// [`MIN_GLOBAL_SCALE`]; 1.0 when no finite element is nonzero.
pub fn modelopt_global_scale(data: &[f32]) -> f32 {
    let amax = data.iter().filter(|x| x.is_finite()).fold(0f32, |m, x| m.max(x.abs()));
    if amax > 0.0 {
        (amax / (E2M1_MAX * E4M3_MAX)).max(MIN_GLOBAL_SCALE)
    } else {
        1.0
    }
}

/// Quantizes `[l, rows, k]` values (f32, f16 or bf16: anything that widens to f32 exactly) to
/// NVFP4 with plain-layout scales. A NaN or an infinity is refused ([`Error::NonFinite`], naming
/// the first).
pub fn quantize<T: Copy + Into<f32>>(
    data: &[T],
    l: usize,
    rows: usize,
    k: usize,
    global: GlobalScale,
) -> Result<Nvfp4Tensor> {
    let x = widened(data, l, rows, k)?;
    if let Some(index) = x.iter().position(|v| !v.is_finite()) {
        return Err(non_finite(index, [l, rows, k], x[index]));
    }
    encode(&x, l, rows, k, global)
}

/// The error naming element `index` (row-major) of a dense `[l, rows, k]` input, `value`.
pub(crate) fn non_finite(index: usize, [_, rows, k]: [usize; 3], value: f32) -> Error {
    Error::NonFinite { index, at: [index / (rows * k), index / k % rows, index % k], value }
}

/// [`quantize`] under the GPU quantizer's rule for NaN and infinities: instead of an error,
/// every block holding one gets the scale [`NAN_SCALE`] and sixteen +0 codes, and
/// [`GlobalScale::Auto`] takes the amax over the finite elements only. Equal to [`quantize`] on
/// finite data; the exact model the GPU tests compare the kernels with.
pub fn quantize_nan_blocks<T: Copy + Into<f32>>(
    data: &[T],
    l: usize,
    rows: usize,
    k: usize,
    global: GlobalScale,
) -> Result<Nvfp4Tensor> {
    encode(&widened(data, l, rows, k)?, l, rows, k, global)
}

/// `data` as f32, after checking its dimensions and length.
fn widened<T: Copy + Into<f32>>(data: &[T], l: usize, rows: usize, k: usize) -> Result<Vec<f32>> {
    check_dims(l, rows, k)?;
    if data.len() != l * rows * k {
        return Err(Error::BufferSize {
            what: format!("dense input [{l}, {rows}, {k}] (elements)"),
            expected: l * rows * k,
            got: data.len(),
        });
    }
    Ok(data.iter().map(|&v| v.into()).collect())
}

fn encode(x: &[f32], l: usize, rows: usize, k: usize, global: GlobalScale) -> Result<Nvfp4Tensor> {
    let g = match global {
        GlobalScale::None => 1.0,
        GlobalScale::Auto => modelopt_global_scale(x),
        GlobalScale::Fixed(g) if g > 0.0 && g.is_finite() => g,
        GlobalScale::Fixed(g) => return Err(Error::Invalid(format!("global scale must be finite and > 0, got {g}"))),
    };
    let mut codes = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(x.len() / 16);
    for block in x.chunks_exact(16) {
        if block.iter().any(|v| !v.is_finite()) {
            scales.push(NAN_SCALE);
            codes.extend([0u8; 16]);
            continue;
        }
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
