//! Tensor types that carry their shape and refuse buffers that do not match it.

use std::ops::Range;

use half::f16;

use super::e2m1::e2m1_to_f32;
use super::e4m3::e4m3_to_f32;
use super::layout::{blocked_to_plain, plain_to_blocked, ScaleLayout};
use crate::memory::{checked_product, ensure_within};
use crate::{Error, Result};

/// An NVFP4 tensor of logical shape `[L, rows, K]` (K in elements), K-major:
/// packed E2M1 values `[L, rows, K/2]` plus one E4M3 scale per 16 elements, in either layout,
/// and a per-tensor FP32 global scale (1.0 when the tensor has none).
#[derive(Clone, Debug, PartialEq)]
pub struct Nvfp4Tensor {
    l: usize,
    rows: usize,
    k: usize,
    values: Vec<u8>,
    scales: Vec<u8>,
    layout: ScaleLayout,
    global_scale: f32,
}

impl Nvfp4Tensor {
    /// Builds a tensor after checking that every buffer matches the shape.
    pub fn new(l: usize, rows: usize, k: usize, values: Vec<u8>, scales: Vec<u8>, layout: ScaleLayout) -> Result<Self> {
        check_dims(l, rows, k)?;
        let what = format!("packed values of [{l}, {rows}, {k}]");
        check_len(&what, packed_len(l, rows, k), values.len())?;
        let what = format!("{layout:?} scales of [{l}, {rows}, {k}]");
        check_len(&what, layout.checked_len(l, rows, k), scales.len())?;
        Ok(Self { l, rows, k, values, scales, layout, global_scale: 1.0 })
    }

    /// Bytes of a tensor of this shape with scales in `layout` (packed values plus scales),
    /// computed without overflow: `None` when the count does not fit in 64 bits.
    pub fn bytes_for(l: usize, rows: usize, k: usize, layout: ScaleLayout) -> Option<u64> {
        packed_len(l, rows, k)?.checked_add(layout.checked_len(l, rows, k)?)
    }

    /// The same tensor with a per-tensor global scale (ModelOpt `weight_scale_2`).
    pub fn with_global_scale(mut self, global_scale: f32) -> Self {
        self.global_scale = global_scale;
        self
    }

    /// Batch count L.
    pub fn l(&self) -> usize {
        self.l
    }
    /// Rows per batch (M for A, N for B).
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Reduction length K in elements.
    pub fn k(&self) -> usize {
        self.k
    }
    /// Scale columns per row, K/16.
    pub fn sf_cols(&self) -> usize {
        self.k / 16
    }
    /// Packed values, `[L, rows, K/2]` u8.
    pub fn values(&self) -> &[u8] {
        &self.values
    }
    /// Scales in [`Self::layout`].
    pub fn scales(&self) -> &[u8] {
        &self.scales
    }
    /// Layout of [`Self::scales`].
    pub fn layout(&self) -> ScaleLayout {
        self.layout
    }
    /// Per-tensor global scale (1.0 if none).
    pub fn global_scale(&self) -> f32 {
        self.global_scale
    }
    /// Bytes this tensor occupies: packed values plus scales in its layout.
    pub fn nbytes(&self) -> usize {
        self.values.len() + self.scales.len()
    }

    /// Scale byte of row `row`, scale column `j`, batch `b`, whatever the layout.
    #[inline]
    pub fn scale(&self, b: usize, row: usize, j: usize) -> u8 {
        self.scales[self.layout.offset(self.rows, self.sf_cols(), row, j, b)]
    }

    /// Packed bytes of one row, `[K/2]`.
    #[inline]
    pub fn row_values(&self, b: usize, row: usize) -> &[u8] {
        let w = self.k / 2;
        let start = (b * self.rows + row) * w;
        &self.values[start..start + w]
    }

    /// The scales converted to `layout`.
    fn scales_in(&self, layout: ScaleLayout) -> Vec<u8> {
        match (self.layout, layout) {
            (a, b) if a == b => self.scales.clone(),
            (ScaleLayout::Plain, ScaleLayout::Blocked) => {
                plain_to_blocked(&self.scales, self.l, self.rows, self.sf_cols())
            }
            (ScaleLayout::Blocked, ScaleLayout::Plain) => {
                blocked_to_plain(&self.scales, self.l, self.rows, self.sf_cols())
            }
            _ => unreachable!("two layouts only"),
        }
    }

    /// The same tensor with its scales converted to `layout`.
    pub fn to_layout(&self, layout: ScaleLayout) -> Self {
        Self { scales: self.scales_in(layout), layout, values: self.values.clone(), ..*self }
    }

    /// [`Self::to_layout`], consuming the tensor: the packed values move instead of being copied.
    pub fn into_layout(self, layout: ScaleLayout) -> Self {
        Self { scales: self.scales_in(layout), layout, ..self }
    }

    /// Rows `rows` of batch `batch` as a tensor `[1, rows.len(), K]` with the same scale layout
    /// and global scale (the rows of one MoE expert, or one expert's weight batch). An empty or
    /// out-of-range selection is a shape error.
    pub fn slice_rows(&self, batch: usize, rows: Range<usize>) -> Result<Self> {
        if batch >= self.l || rows.is_empty() || rows.end > self.rows {
            return Err(Error::Shape(format!(
                "rows {rows:?} of batch {batch}: outside [L={}, rows={}] or empty",
                self.l, self.rows
            )));
        }
        let (w, base) = (self.k / 2, batch * self.rows);
        let values = self.values[(base + rows.start) * w..(base + rows.end) * w].to_vec();
        // Plain scales of the selected rows, read through the layout; converted back below.
        let sf = self.sf_cols();
        let scales = rows.clone().flat_map(|r| (0..sf).map(move |j| self.scale(batch, r, j))).collect();
        let plain = Self::new(1, rows.len(), self.k, values, scales, ScaleLayout::Plain)?;
        Ok(plain.into_layout(self.layout).with_global_scale(self.global_scale))
    }

    /// Decodes one row into `out` (`[K]` f32) as e2m1 * e4m3, without the global scale: exact in
    /// f32 (a few significant bits per product).
    pub fn decode_row_into(&self, b: usize, row: usize, out: &mut [f32]) {
        let vals = self.row_values(b, row);
        for j in 0..self.sf_cols() {
            let s = e4m3_to_f32(self.scale(b, row, j));
            for (t, &byte) in vals[j * 8..j * 8 + 8].iter().enumerate() {
                out[j * 16 + 2 * t] = e2m1_to_f32(byte & 0xF) * s;
                out[j * 16 + 2 * t + 1] = e2m1_to_f32(byte >> 4) * s;
            }
        }
    }

    /// Decodes all rows of batch `b` without the global scale, `[rows, K]` f32.
    pub fn decode_batch(&self, b: usize) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.k];
        for (row, chunk) in out.chunks_exact_mut(self.k).enumerate() {
            self.decode_row_into(b, row, chunk);
        }
        out
    }

    /// Dequantizes the whole tensor to f32, `[L, rows, K]`: e2m1 * e4m3 * global.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.l * self.rows * self.k);
        for b in 0..self.l {
            out.extend(self.decode_batch(b).into_iter().map(|v| v * self.global_scale));
        }
        out
    }
}

/// Bytes of the packed values of `[l, rows, k]`, `None` on overflow.
fn packed_len(l: usize, rows: usize, k: usize) -> Option<u64> {
    checked_product(&[l, rows, k / 2])
}

/// A buffer of `got` bytes against the `expected` count of its shape (`None`: beyond 64 bits, so
/// no buffer can match).
pub(crate) fn check_len(what: &str, expected: Option<u64>, got: usize) -> Result<()> {
    match expected {
        Some(e) if e == got as u64 => Ok(()),
        Some(e) => Err(Error::BufferSize { what: what.to_string(), expected: e as usize, got }),
        None => ensure_within(what, None, got as u64),
    }
}

pub(crate) fn check_dims(l: usize, rows: usize, k: usize) -> Result<()> {
    if l == 0 || rows == 0 || k == 0 {
        return Err(Error::Shape(format!("every dimension must be >= 1, got [L={l}, rows={rows}, K={k}]")));
    }
    if !k.is_multiple_of(16) {
        return Err(Error::KNotMultipleOf16 { k });
    }
    Ok(())
}

/// A dense f16 tensor `[L, rows, cols]`, row-major: the output of every operation.
#[derive(Clone, Debug, PartialEq)]
pub struct F16Tensor {
    l: usize,
    rows: usize,
    cols: usize,
    data: Vec<f16>,
}

impl F16Tensor {
    /// Wraps `data` after checking its length.
    pub fn new(l: usize, rows: usize, cols: usize, data: Vec<f16>) -> Result<Self> {
        let what = format!("f16 tensor [{l}, {rows}, {cols}]");
        check_len(&what, checked_product(&[l, rows, cols, 2]), data.len() * 2)?;
        Ok(Self { l, rows, cols, data })
    }
    /// Batch count.
    pub fn l(&self) -> usize {
        self.l
    }
    /// Rows (M).
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Columns (N; 1 for GEMV).
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Shape as `[L, rows, cols]`.
    pub fn shape(&self) -> [usize; 3] {
        [self.l, self.rows, self.cols]
    }
    /// Elements, row-major.
    pub fn data(&self) -> &[f16] {
        &self.data
    }
    /// Consumes the tensor, returning its elements.
    pub fn into_data(self) -> Vec<f16> {
        self.data
    }
}
