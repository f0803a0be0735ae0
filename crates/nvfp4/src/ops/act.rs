//! The activation operand of an operation, in one of its two forms (SPEC §8): NVFP4 with its
//! scales (W4A4, what a Blackwell GPU computes) or a dense 16-bit tensor (W4A16, BF16 or FP16,
//! what Hopper serving stacks run). The weights are NVFP4 in both modes.
//!
//! Which operand is the activation: `a` of a GEMM, a dual GEMM, a group and the MoE form; the
//! vector `b` of a GEMV (whose matrix `a` is the weight).

use crate::format::{Nvfp4Meta, Nvfp4Tensor, OutTensor, OutputDtype};
use crate::{Error, Result};

use super::op::OutMeta;

/// An activation: NVFP4 `Q` or dense 16-bit `D` (host tensors, device views or their metadata).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act<Q, D> {
    /// NVFP4 values and scales (W4A4).
    Nvfp4(Q),
    /// A dense f16 or bf16 `[L, rows, K]` tensor, K-major (W4A16).
    Dense(D),
}

/// An activation's metadata: the NVFP4 operand's, or the dense tensor's shape `[L, rows, K]` and
/// element type.
pub type ActMeta = Act<Nvfp4Meta, OutMeta>;

impl ActMeta {
    /// Batch count L.
    pub fn l(&self) -> usize {
        match self {
            Act::Nvfp4(m) => m.l,
            Act::Dense(d) => d.shape[0],
        }
    }
    /// Rows per batch.
    pub fn rows(&self) -> usize {
        match self {
            Act::Nvfp4(m) => m.rows,
            Act::Dense(d) => d.shape[1],
        }
    }
    /// K in elements.
    pub fn k(&self) -> usize {
        match self {
            Act::Nvfp4(m) => m.k,
            Act::Dense(d) => d.shape[2],
        }
    }
    /// The per-tensor factor its values carry: the NVFP4 global scale, 1 for a dense tensor.
    pub fn global_scale(&self) -> f32 {
        match self {
            Act::Nvfp4(m) => m.global_scale,
            Act::Dense(_) => 1.0,
        }
    }
    /// The dense element type (W4A16), or `None` for NVFP4.
    pub fn dense_dtype(&self) -> Option<OutputDtype> {
        match self {
            Act::Nvfp4(_) => None,
            Act::Dense(d) => Some(d.dtype),
        }
    }
    /// The NVFP4 metadata, when it is NVFP4.
    pub fn nvfp4(&self) -> Option<&Nvfp4Meta> {
        match self {
            Act::Nvfp4(m) => Some(m),
            Act::Dense(_) => None,
        }
    }
    /// "W4A4" or "W4A16 (bf16)": the mode in messages.
    pub fn mode(&self) -> String {
        match self {
            Act::Nvfp4(_) => "W4A4".into(),
            Act::Dense(d) => format!("W4A16 ({})", d.dtype),
        }
    }
}

/// An activation operand whose metadata is known (host tensors, device views, metadata).
pub trait Activation {
    /// Its form, shape and scalars.
    fn act_meta(&self) -> ActMeta;
}

impl Activation for ActMeta {
    fn act_meta(&self) -> ActMeta {
        *self
    }
}
impl Activation for Nvfp4Meta {
    fn act_meta(&self) -> ActMeta {
        Act::Nvfp4(*self)
    }
}
impl Activation for Nvfp4Tensor {
    fn act_meta(&self) -> ActMeta {
        Act::Nvfp4(self.meta())
    }
}
impl Activation for OutTensor {
    fn act_meta(&self) -> ActMeta {
        Act::Dense(OutMeta { shape: self.shape(), dtype: self.dtype() })
    }
}
impl<T: Activation + ?Sized> Activation for &T {
    fn act_meta(&self) -> ActMeta {
        (**self).act_meta()
    }
}
impl<Q: Activation, D: Activation> Activation for Act<Q, D> {
    fn act_meta(&self) -> ActMeta {
        match self {
            Act::Nvfp4(q) => q.act_meta(),
            Act::Dense(d) => d.act_meta(),
        }
    }
}

/// A host activation the CPU reference can decode: an NVFP4 tensor (W4A4) or a 16-bit tensor
/// (W4A16), both exact in f32.
pub trait HostActivation: Activation + Clone + Send + Sync {
    /// Batch `b` as f32 `[rows, K]`, exactly (NVFP4: e2m1 × e4m3, without the global scale).
    fn decode_batch(&self, b: usize) -> Vec<f32>;
    /// Rows `rows` of batch `batch` as a `[1, rows.len(), K]` tensor of the same form.
    fn slice_rows(&self, batch: usize, rows: std::ops::Range<usize>) -> Result<Self>;
}

impl HostActivation for Nvfp4Tensor {
    fn decode_batch(&self, b: usize) -> Vec<f32> {
        Nvfp4Tensor::decode_batch(self, b)
    }
    fn slice_rows(&self, batch: usize, rows: std::ops::Range<usize>) -> Result<Self> {
        Nvfp4Tensor::slice_rows(self, batch, rows)
    }
}

impl HostActivation for OutTensor {
    fn decode_batch(&self, b: usize) -> Vec<f32> {
        let [_, rows, k] = self.shape();
        let n = rows * k;
        self.bits()[b * n..(b + 1) * n].iter().map(|&x| self.dtype().to_f32(x)).collect()
    }
    fn slice_rows(&self, batch: usize, rows: std::ops::Range<usize>) -> Result<Self> {
        let [l, r, k] = self.shape();
        if batch >= l || rows.start > rows.end || rows.end > r {
            return Err(Error::Shape(format!(
                "rows {rows:?} of batch {batch} of a {} tensor {:?}",
                self.dtype(),
                self.shape()
            )));
        }
        let start = (batch * r + rows.start) * k;
        let bits = self.bits()[start..start + rows.len() * k].to_vec();
        OutTensor::new(self.dtype(), [1, rows.len(), k], bits)
    }
}
