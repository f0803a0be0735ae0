//! One weight block scale set to the E4M3 NaN, for the check's NaN cases: the outputs whose sums
//! use that block must be NaN on every backend (docs/FORMAT.md §1), and no other.

use super::{Problem16, Rng};
use crate::format::{Nvfp4Tensor, ScaleLayout, NAN_SCALE};
use crate::Result;

/// `t` with the scale of row `row`, scale column `j` of batch `batch` set to the E4M3 NaN
/// (layout and global scale kept).
fn with_nan_scale(t: &Nvfp4Tensor, batch: usize, row: usize, j: usize) -> Result<Nvfp4Tensor> {
    let plain = t.to_layout(ScaleLayout::Plain);
    let mut scales = plain.scales().to_vec();
    scales[(batch * t.rows() + row) * t.sf_cols() + j] = NAN_SCALE;
    let marked = Nvfp4Tensor::new(t.l(), t.rows(), t.k(), plain.values().to_vec(), scales, ScaleLayout::Plain)?;
    Ok(marked.into_layout(t.layout()).with_global_scale(t.global_scale()))
}

impl Problem16 {
    /// Sets one block scale of one weight to the E4M3 NaN, chosen from `seed` (which weight of
    /// several, which batch, row and 16-block): the outputs whose sums use it must be NaN on
    /// every backend (docs/FORMAT.md §1). Returns `(weight, [batch, row, block])`, the weight
    /// named as in a case file (`a` for the GEMV's matrix, `b1`, `b_g2`, ..).
    pub fn mark_nan_scale(&mut self, seed: u64) -> Result<(String, [usize; 3])> {
        let mut rng = Rng::new(seed);
        let mut pick = |t: &Nvfp4Tensor| {
            let at = [
                rng.below(t.l() as u32) as usize,
                rng.below(t.rows() as u32) as usize,
                rng.below(t.sf_cols() as u32) as usize,
            ];
            with_nan_scale(t, at[0], at[1], at[2]).map(|t| (t, at))
        };
        let (name, at) = match self {
            Problem16::Gemv(p) => {
                let (t, at) = pick(&p.a)?;
                p.a = t;
                ("a".to_string(), at)
            }
            Problem16::Gemm(p) => {
                let (t, at) = pick(&p.b)?;
                p.b = t;
                ("b".to_string(), at)
            }
            Problem16::DualGemm(p) => {
                if seed.is_multiple_of(2) {
                    let (t, at) = pick(&p.b1)?;
                    p.b1 = t;
                    ("b1".to_string(), at)
                } else {
                    let (t, at) = pick(&p.b2)?;
                    p.b2 = t;
                    ("b2".to_string(), at)
                }
            }
            Problem16::GroupedGemm(p) => {
                let g = (seed % p.groups.len() as u64) as usize;
                let (t, at) = pick(&p.groups[g].b)?;
                p.groups[g].b = t;
                (format!("b_g{g}"), at)
            }
            Problem16::Moe(p) => {
                let (t, at) = pick(&p.b)?;
                p.b = t;
                ("b".to_string(), at)
            }
        };
        Ok((name, at))
    }
}
