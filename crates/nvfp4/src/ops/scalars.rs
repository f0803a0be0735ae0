//! The rules for an operation's FP32 scalars, written once: every reader and constructor (case
//! files, checkpoints, the operations' constructors, `Problem::set_alpha`, the CLI, Python) goes
//! through them.
//!
//! - A **global scale** is finite and > 0 (ModelOpt's and compressed-tensors' are; a zero one
//!   would erase the tensor, a negative one flip it, and neither comes from a quantizer).
//! - **alpha** is finite; any sign and 0 are allowed. A value given wider than f32 (a Python
//!   float, a decimal on the command line) must not overflow f32 or, unless it is 0, round to 0.
//! - The **factor** applied before the final rounding, `alpha × global(A) × global(B)` in f32 in
//!   that order (the reference's and every kernel's), must be finite: an infinite factor turns an
//!   output whose exact value is 0 into NaN (0 × inf). It must not round to 0 either unless one of
//!   the three is 0: every output would silently be 0.

use super::act::Activation;
use crate::{Error, Result};

/// Why `g` cannot be a global scale (`must be ..`, for the caller to say whose), if it cannot.
pub(crate) fn global_scale_rule(g: f32) -> std::result::Result<f32, String> {
    if g.is_finite() && g > 0.0 {
        Ok(g)
    } else {
        Err(format!("must be finite and > 0, found {g:?}"))
    }
}

/// `g` when it is a valid global scale (finite and > 0).
pub fn check_global_scale(g: f32) -> Result<f32> {
    global_scale_rule(g).map_err(|e| Error::Invalid(format!("a global scale {e}")))
}

/// Why `alpha` cannot be an alpha, if it cannot.
pub(crate) fn alpha_rule(alpha: f32) -> std::result::Result<f32, String> {
    if alpha.is_finite() {
        Ok(alpha)
    } else {
        Err(format!("alpha must be finite, found {alpha:?}"))
    }
}

/// Refuses a non-finite alpha.
pub(crate) fn check_alpha(alpha: Option<f32>) -> Result<()> {
    alpha.map_or(Ok(()), |a| alpha_rule(a).map(drop).map_err(Error::Invalid))
}

/// An alpha given as an f64 (a Python float), as the f32 the kernels use: refused when it is not
/// finite, overflows f32, or is not 0 but rounds to 0 in f32.
pub fn alpha_from_f64(alpha: f64) -> Result<f32> {
    if !alpha.is_finite() {
        return Err(Error::Invalid(format!("alpha must be finite, found {alpha:?}")));
    }
    let narrow = alpha as f32;
    if narrow.is_infinite() {
        return Err(Error::Invalid(format!("alpha {alpha:e} overflows f32 (largest {:e})", f32::MAX)));
    }
    if narrow == 0.0 && alpha != 0.0 {
        return Err(Error::Invalid(format!(
            "alpha {alpha:e} rounds to 0 in f32 (smallest non-zero {:e}); give 0 if 0 is meant",
            f32::from_bits(1)
        )));
    }
    Ok(narrow)
}

/// An alpha written in decimal (`0.5`, `-1e-3`) under the rules of [`alpha_from_f64`]; a value
/// below even f64's range (`1e-400`) counts as rounding to 0 unless every digit is 0.
pub fn parse_alpha(s: &str) -> Result<f32> {
    let wide: f64 = s.trim().parse().map_err(|e| Error::Invalid(format!("`{s}` is not a number: {e}")))?;
    let mantissa = s.split(['e', 'E']).next().unwrap_or_default();
    if wide == 0.0 && mantissa.bytes().any(|c| (b'1'..=b'9').contains(&c)) {
        return Err(Error::Invalid(format!(
            "alpha {s} rounds to 0 in f32 (smallest non-zero {:e})",
            f32::from_bits(1)
        )));
    }
    alpha_from_f64(wide)
}

/// The factor `alpha × global(a) × global(b)` (alpha 1 when absent), in f32 and in this order.
/// A dense (W4A16) activation's factor is 1.
pub fn effective_alpha(alpha: Option<f32>, a: &impl Activation, b: &impl Activation) -> f32 {
    alpha.unwrap_or(1.0) * a.act_meta().global_scale() * b.act_meta().global_scale()
}

/// Checks the global scales of one product `a · bᵀ` of the operation `what` (finite and > 0; a
/// dense activation's is 1) and returns them: the rules that hold whatever the alpha (the MoE
/// form's per-expert alphas on the device are the kernels' to read).
pub(crate) fn check_globals(what: &str, a: &impl Activation, b: &impl Activation, b_name: &str) -> Result<(f32, f32)> {
    let (ga, gb) = (a.act_meta().global_scale(), b.act_meta().global_scale());
    for (name, g) in [("a", ga), (b_name, gb)] {
        global_scale_rule(g).map_err(|e| Error::Invalid(format!("{what}: the global scale of {name} {e}")))?;
    }
    Ok((ga, gb))
}

/// Checks every scalar of one product `a · bᵀ` of the operation `what` (`b` is named `b_name`):
/// alpha, both global scales and their factor (see the module docs). On the operands' metadata,
/// so that host tensors and device views follow the same rules ([`Op::validate`](super::Op)).
/// A dense (W4A16) activation carries no global scale: its factor is 1.
pub(crate) fn check_product(
    what: &str,
    alpha: Option<f32>,
    a: &impl Activation,
    b: &impl Activation,
    b_name: &str,
) -> Result<()> {
    check_alpha(alpha)?;
    let (ga, gb) = check_globals(what, a, b, b_name)?;
    let factor = alpha.unwrap_or(1.0) * ga * gb;
    let terms = format!("alpha × global(a) × global({b_name}) = {:?} × {ga:?} × {gb:?}", alpha.unwrap_or(1.0));
    if factor.is_infinite() {
        return Err(Error::Invalid(format!(
            "{what}: {terms} overflows f32: an output whose exact value is 0 would be NaN (0 × inf); \
             make alpha or a global scale smaller"
        )));
    }
    if factor == 0.0 && alpha != Some(0.0) {
        return Err(Error::Invalid(format!(
            "{what}: {terms} rounds to 0 in f32: every output would be 0; make alpha or a global scale larger"
        )));
    }
    Ok(())
}
