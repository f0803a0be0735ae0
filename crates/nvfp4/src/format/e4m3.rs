//! E4M3 (`float8_e4m3fn`): 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits.
//! Max finite 448 (0x7E); 0x7F and 0xFF are NaN; no inf; subnormals are m/8 * 2^-6.

use std::sync::OnceLock;

/// Largest finite E4M3 magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// Decodes one E4M3 byte.
#[inline]
pub fn e4m3_to_f32(code: u8) -> f32 {
    let exp = ((code >> 3) & 0xF) as i32;
    let man = (code & 7) as f32;
    let mag = if exp == 0xF && code & 7 == 7 {
        f32::NAN
    } else if exp == 0 {
        man / 8.0 * (2.0f32).powi(-6)
    } else {
        (1.0 + man / 8.0) * (2.0f32).powi(exp - 7)
    };
    if code & 0x80 != 0 {
        -mag
    } else {
        mag
    }
}

/// Ascending magnitudes of the 127 finite non-negative codes 0x00..=0x7E.
fn positive_values() -> &'static [f32; 127] {
    static TABLE: OnceLock<[f32; 127]> = OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|c| e4m3_to_f32(c as u8)))
}

/// Encodes `x`, rounding to nearest with ties to even and saturating to ±448 (infinities too).
/// NaN encodes as 0x7F. The sign of zero is kept.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    sign | super::e2m1::nearest_code(positive_values(), x.abs())
}

/// True for the two NaN encodings.
#[inline]
pub fn e4m3_is_nan(code: u8) -> bool {
    code & 0x7F == 0x7F
}
