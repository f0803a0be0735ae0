//! E2M1 (FP4): 1 sign bit, 2 exponent bits (bias 1), 1 mantissa bit. No inf, no NaN.

/// Magnitudes of codes 0..=7; codes 8..=15 are their negatives (8 is -0).
pub const E2M1_MAGNITUDES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Largest finite E2M1 magnitude.
pub const E2M1_MAX: f32 = 6.0;

/// Decodes the low 4 bits of `code`.
#[inline]
pub fn e2m1_to_f32(code: u8) -> f32 {
    let mag = E2M1_MAGNITUDES[(code & 7) as usize];
    if code & 8 != 0 {
        -mag
    } else {
        mag
    }
}

/// Encodes `x`, rounding to nearest with ties to the even code and saturating at ±6.
/// NaN encodes as +0 (E2M1 has no NaN); the sign of zero is kept.
pub fn f32_to_e2m1(x: f32) -> u8 {
    if x.is_nan() {
        return 0;
    }
    let sign = if x.is_sign_negative() { 8 } else { 0 };
    sign | nearest_code(&E2M1_MAGNITUDES, x.abs())
}

/// Index of the value nearest to `mag` in the ascending table `values`, ties to the even index,
/// values beyond the last entry saturating to it. Shared by the E2M1 and E4M3 encoders.
pub(crate) fn nearest_code(values: &[f32], mag: f32) -> u8 {
    let last = values.len() - 1;
    if mag >= values[last] {
        return last as u8;
    }
    // First index whose value exceeds mag; mag lies in [values[hi-1], values[hi]).
    let hi = values.partition_point(|&v| v <= mag);
    let lo = hi - 1;
    let (dl, dh) = (mag - values[lo], values[hi] - mag);
    let pick = if dl < dh {
        lo
    } else if dh < dl {
        hi
    } else if lo % 2 == 0 {
        lo
    } else {
        hi
    };
    pick as u8
}
