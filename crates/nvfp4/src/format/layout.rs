//! Scale-factor layouts. Plain: K-major `[L, rows, K/16]`. Blocked: the cuBLAS "128x4" tile that
//! Blackwell tensor cores read, `[L, R, C, 512]` with R = ceil(rows/128), C = ceil((K/16)/4).

use crate::memory::checked_product;

/// Which of the two scale layouts a buffer is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleLayout {
    /// `[L, rows, K/16]`, row-major.
    Plain,
    /// `[L, ceil(rows/128), ceil(K/64), 512]`, the 128x4 tile layout (SPEC §2).
    Blocked,
}

impl ScaleLayout {
    /// Number of scale bytes a tensor of this shape holds in this layout.
    pub fn len(self, l: usize, rows: usize, k: usize) -> usize {
        match self {
            ScaleLayout::Plain => l * rows * (k / 16),
            ScaleLayout::Blocked => {
                let (r, c) = blocked_dims(rows, k / 16);
                l * r * c * 512
            }
        }
    }

    /// [`Self::len`] computed without overflow: `None` when it does not fit in 64 bits.
    pub fn checked_len(self, l: usize, rows: usize, k: usize) -> Option<u64> {
        match self {
            ScaleLayout::Plain => checked_product(&[l, rows, k / 16]),
            ScaleLayout::Blocked => {
                let (r, c) = blocked_dims(rows, k / 16);
                checked_product(&[l, r, c, 512])
            }
        }
    }

    /// Byte offset of the scale of row `i`, scale column `j` (= k/16), batch `b`.
    #[inline]
    pub fn offset(self, rows: usize, sf_cols: usize, i: usize, j: usize, b: usize) -> usize {
        match self {
            ScaleLayout::Plain => (b * rows + i) * sf_cols + j,
            ScaleLayout::Blocked => blocked_offset(rows, sf_cols, i, j, b),
        }
    }
}

/// (R, C): 128-row tiles and 4-column tiles covering `rows` x `sf_cols` scales.
#[inline]
pub fn blocked_dims(rows: usize, sf_cols: usize) -> (usize, usize) {
    (rows.div_ceil(128), sf_cols.div_ceil(4))
}

/// SPEC §2: off(i, j, b) = b*(R*C*512) + (i/128)*(C*512) + (j/4)*512 + (i%32)*16 + ((i%128)/32)*4 + (j%4).
#[inline]
pub fn blocked_offset(rows: usize, sf_cols: usize, i: usize, j: usize, b: usize) -> usize {
    let (r, c) = blocked_dims(rows, sf_cols);
    b * (r * c * 512) + (i / 128) * (c * 512) + (j / 4) * 512 + (i % 32) * 16 + ((i % 128) / 32) * 4 + (j % 4)
}

/// Plain `[l, rows, sf_cols]` scales to the blocked layout; padding entries are zero.
pub fn plain_to_blocked(plain: &[u8], l: usize, rows: usize, sf_cols: usize) -> Vec<u8> {
    let mut out = vec![0u8; ScaleLayout::Blocked.len(l, rows, sf_cols * 16)];
    for b in 0..l {
        for i in 0..rows {
            for j in 0..sf_cols {
                out[blocked_offset(rows, sf_cols, i, j, b)] = plain[(b * rows + i) * sf_cols + j];
            }
        }
    }
    out
}

/// Blocked scales back to plain `[l, rows, sf_cols]`; padding entries are dropped.
pub fn blocked_to_plain(blocked: &[u8], l: usize, rows: usize, sf_cols: usize) -> Vec<u8> {
    let mut out = vec![0u8; l * rows * sf_cols];
    for b in 0..l {
        for i in 0..rows {
            for j in 0..sf_cols {
                out[(b * rows + i) * sf_cols + j] = blocked[blocked_offset(rows, sf_cols, i, j, b)];
            }
        }
    }
    out
}
