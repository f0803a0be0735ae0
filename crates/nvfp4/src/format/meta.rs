//! What the kernels and the router need to know of an NVFP4 tensor without its data: shape,
//! scale layout, global scale.

use super::layout::ScaleLayout;
use super::tensor::Nvfp4Tensor;

/// Shape, scale layout and global scale of an NVFP4 tensor `[L, rows, K]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Nvfp4Meta {
    /// Batch count L.
    pub l: usize,
    /// Rows per batch.
    pub rows: usize,
    /// K in elements (a multiple of 16).
    pub k: usize,
    /// Layout of the scales.
    pub layout: ScaleLayout,
    /// Per-tensor FP32 global scale (1.0 when none).
    pub global_scale: f32,
}

impl Nvfp4Meta {
    /// Bytes of the packed values, `[L, rows, K/2]`.
    pub fn value_bytes(&self) -> usize {
        self.l * self.rows * (self.k / 2)
    }
    /// Bytes of the scales in their layout.
    pub fn scale_bytes(&self) -> usize {
        self.layout.len(self.l, self.rows, self.k)
    }
}

impl Nvfp4Tensor {
    /// Its shape, layout and global scale.
    pub fn meta(&self) -> Nvfp4Meta {
        Nvfp4Meta {
            l: self.l(),
            rows: self.rows(),
            k: self.k(),
            layout: self.layout(),
            global_scale: self.global_scale(),
        }
    }
}
