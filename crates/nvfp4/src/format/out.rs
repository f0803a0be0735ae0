//! The output element type of every operation, f16 (the default, SPEC §3) or bf16, with the one
//! rounding from the accumulator to it, and [`OutTensor`], an output of either type.

use std::fmt;

use half::{bf16, f16};

use super::tensor::{check_len, F16Tensor};
use crate::memory::checked_product;
use crate::{Error, Result};

/// The element type an operation rounds its result to, once, to nearest even.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OutputDtype {
    /// IEEE half precision (SPEC §3): overflows to ±inf beyond 65504.
    #[default]
    F16,
    /// bfloat16: f32's range with 8 significant bits.
    Bf16,
}

impl fmt::Display for OutputDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OutputDtype::F16 => "float16",
            OutputDtype::Bf16 => "bfloat16",
        })
    }
}

impl OutputDtype {
    /// An f32 rounded once to this type, as bits.
    pub fn round_f32(self, x: f32) -> u16 {
        match self {
            OutputDtype::F16 => f16::from_f32(x).to_bits(),
            OutputDtype::Bf16 => bf16::from_f32(x).to_bits(),
        }
    }

    /// An f64 rounded once to this type, as bits.
    // NOTE: `half`'s `from_f64` is not a single rounding: f16's converts through f32 with F16C
    // (RNE twice) and both software paths drop the low 32 mantissa bits, so 4098 + 2^-20 would
    // give 4096 in f16 and 1 + 2^-8 + 2^-40 would give 1 in bf16. Rounding to f32 *to odd* first
    // keeps the sticky information (f32 has more than 2 bits to spare over either type), so the
    // final f32 rounding decides as a direct rounding would.
    pub fn round_f64(self, x: f64) -> u16 {
        self.round_f32(f64_to_f32_odd(x))
    }

    /// The value of `bits` of this type, exactly, as f32.
    pub fn to_f32(self, bits: u16) -> f32 {
        match self {
            OutputDtype::F16 => f16::from_bits(bits).to_f32(),
            OutputDtype::Bf16 => bf16::from_bits(bits).to_f32(),
        }
    }

    /// A quiet NaN of this type: what tests fill outputs with, so that an unwritten element fails.
    pub fn nan_bits(self) -> u16 {
        match self {
            OutputDtype::F16 => 0x7E00,
            OutputDtype::Bf16 => 0x7FC0,
        }
    }
}

/// `x` as f32, rounded to odd: truncated toward zero, the last bit set when that was inexact.
fn f64_to_f32_odd(x: f64) -> f32 {
    let y = x as f32;
    if !y.is_finite() || y as f64 == x {
        return y;
    }
    // Step back one ulp if RNE went away from zero, then set the last bit.
    let t = if (y as f64).abs() > x.abs() { y.to_bits() - 1 } else { y.to_bits() };
    f32::from_bits(t | 1)
}

/// An operation's output `[L, rows, cols]`, row-major, in either [`OutputDtype`], as bits.
#[derive(Clone, Debug, PartialEq)]
pub struct OutTensor {
    dtype: OutputDtype,
    shape: [usize; 3],
    bits: Vec<u16>,
}

impl OutTensor {
    /// Wraps `bits` of `dtype` after checking their count.
    pub fn new(dtype: OutputDtype, shape: [usize; 3], bits: Vec<u16>) -> Result<Self> {
        let [l, rows, cols] = shape;
        let what = format!("{dtype} tensor [{l}, {rows}, {cols}]");
        check_len(&what, checked_product(&[l, rows, cols, 2]), bits.len() * 2)?;
        Ok(Self { dtype, shape, bits })
    }
    /// Its element type.
    pub fn dtype(&self) -> OutputDtype {
        self.dtype
    }
    /// `[L, rows, cols]`.
    pub fn shape(&self) -> [usize; 3] {
        self.shape
    }
    /// The elements' bits, row-major.
    pub fn bits(&self) -> &[u16] {
        &self.bits
    }
    /// The elements as f32 (exact for both types).
    pub fn to_f32(&self) -> Vec<f32> {
        self.bits.iter().map(|&b| self.dtype.to_f32(b)).collect()
    }
    /// The elements' bytes, little-endian.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        self.bits.iter().flat_map(|b| b.to_le_bytes()).collect()
    }
    /// The f16 tensor, when this is one (a bf16 tensor is an error: no second rounding).
    pub fn into_f16(self) -> Result<F16Tensor> {
        if self.dtype != OutputDtype::F16 {
            return Err(Error::Invalid(format!("a {} output is not an f16 tensor", self.dtype)));
        }
        let [l, rows, cols] = self.shape;
        F16Tensor::new(l, rows, cols, self.bits.into_iter().map(f16::from_bits).collect())
    }
}

impl From<F16Tensor> for OutTensor {
    fn from(t: F16Tensor) -> Self {
        let shape = t.shape();
        Self { dtype: OutputDtype::F16, shape, bits: t.into_data().into_iter().map(f16::to_bits).collect() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f64_rounds_once() {
        let (f, b) = (OutputDtype::F16, OutputDtype::Bf16);
        // f16: ulp 4 at 4096; 4098 is a tie (to 4096, even), a hair above goes to 4100.
        assert_eq!(f.round_f64(4098.0), f16::from_f32(4096.0).to_bits());
        assert_eq!(f.round_f64(4098.0 + 2f64.powi(-20)), f16::from_f32(4100.0).to_bits());
        // bf16: ulp 2^-7 at 1; 1 + 2^-8 is a tie (to 1), 2^-40 above it goes up.
        assert_eq!(b.round_f64(1.0 + 2f64.powi(-8)), bf16::ONE.to_bits());
        assert_eq!(b.round_f64(1.0 + 2f64.powi(-8) + 2f64.powi(-40)), bf16::from_f32(1.0 + 2f32.powi(-7)).to_bits());
        assert_eq!(
            b.round_f64(-(1.0 + 2f64.powi(-8) + 2f64.powi(-40))),
            bf16::from_f32(-1.0 - 2f32.powi(-7)).to_bits()
        );
        // Beyond f16's range bf16 stays finite; beyond f32's both overflow.
        assert_eq!(f.round_f64(70000.0), f16::INFINITY.to_bits());
        assert_eq!(b.round_f64(70000.0), bf16::from_f32(70144.0).to_bits());
        assert_eq!(b.round_f64(1e300), bf16::INFINITY.to_bits());
        assert!(bf16::from_bits(b.round_f64(f64::NAN)).is_nan());
        assert!(f16::from_bits(f.nan_bits()).is_nan() && bf16::from_bits(b.nan_bits()).is_nan());
    }

    #[test]
    fn tensors_check_their_length_and_convert() {
        assert!(OutTensor::new(OutputDtype::Bf16, [1, 2, 3], vec![0; 5]).is_err());
        let t = OutTensor::new(OutputDtype::Bf16, [1, 1, 2], vec![0x3F80, 0xC000]).unwrap();
        assert_eq!(t.to_f32(), [1.0, -2.0]);
        assert_eq!(t.to_le_bytes(), [0x80, 0x3F, 0x00, 0xC0]);
        assert!(t.into_f16().is_err());
        let h = F16Tensor::new(1, 1, 1, vec![f16::from_f32(1.5)]).unwrap();
        assert_eq!(OutTensor::from(h.clone()).into_f16().unwrap(), h);
    }
}
