//! Sample statistics: median, min and the geometric mean. Pure arithmetic, no device.

use serde::Serialize;

use crate::{Error, Result};

/// The timed samples of one measurement, in microseconds, in the order they were taken.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Samples {
    us: Vec<f64>,
}

impl Samples {
    /// Wraps at least one finite, non-negative duration.
    pub fn new(us: Vec<f64>) -> Result<Self> {
        if us.is_empty() {
            return Err(Error::Invalid("a measurement needs at least one sample".into()));
        }
        if let Some(bad) = us.iter().find(|x| !x.is_finite() || **x < 0.0) {
            return Err(Error::Invalid(format!("sample {bad} µs is not a finite duration")));
        }
        Ok(Self { us })
    }

    /// The samples in the order they were taken.
    pub fn as_slice(&self) -> &[f64] {
        &self.us
    }

    /// How many samples there are (at least one).
    pub fn len(&self) -> usize {
        self.us.len()
    }

    /// Always false: [`Samples::new`] refuses an empty list.
    pub fn is_empty(&self) -> bool {
        self.us.is_empty()
    }

    /// The median; for an even count, the mean of the two middle samples.
    pub fn median(&self) -> f64 {
        let mut s = self.us.clone();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        if n % 2 == 1 {
            s[n / 2]
        } else {
            0.5 * (s[n / 2 - 1] + s[n / 2])
        }
    }

    /// The smallest sample.
    pub fn min(&self) -> f64 {
        self.us.iter().copied().fold(f64::INFINITY, f64::min)
    }

    /// The largest sample.
    pub fn max(&self) -> f64 {
        self.us.iter().copied().fold(f64::NEG_INFINITY, f64::max)
    }
}

/// Geometric mean of positive finite values; `None` for an empty list or any value that is not
/// positive and finite (a geometric mean over such a value means nothing).
pub fn geomean<I: IntoIterator<Item = f64>>(values: I) -> Option<f64> {
    let mut n = 0usize;
    let mut log_sum = 0.0;
    for v in values {
        if !(v.is_finite() && v > 0.0) {
            return None;
        }
        n += 1;
        log_sum += v.ln();
    }
    (n > 0).then(|| (log_sum / n as f64).exp())
}
