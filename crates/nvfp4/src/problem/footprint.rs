//! What a problem occupies in host memory, computed from its shape with checked arithmetic, so
//! that generators and runs can refuse a shape before allocating anything for it.

use super::{Problem, Problem16, Shape};
use crate::format::{Nvfp4Tensor, ScaleLayout};
use crate::memory::{checked_product, checked_sum, ensure_host};
use crate::ops::{Backend, Gemm};
use crate::Result;

/// Bytes of an f16 tensor `[l, rows, cols]`, `None` on overflow.
fn f16_bytes([l, rows, cols]: [usize; 3]) -> Option<u64> {
    checked_product(&[l, rows, cols, 2])
}

/// T of a MoE shape; saturates instead of overflowing, so that the byte counts of an absurd
/// shape come out `None` rather than wrong.
fn tokens(counts: &[usize]) -> usize {
    counts.iter().fold(0usize, |t, &c| t.saturating_add(c))
}

impl Shape {
    /// The NVFP4 operands as `[L, rows, K]`, in the order the generator draws them (a, b; a, b1,
    /// b2; a_g0, b_g0, a_g1, ..).
    pub fn operands(&self) -> Vec<[usize; 3]> {
        match *self {
            Shape::Gemv { m, k, l } => vec![[l, m, k], [l, 1, k]],
            Shape::Gemm { m, n, k, l } => vec![[l, m, k], [l, n, k]],
            Shape::DualGemm { m, n, k, l } => vec![[l, m, k], [l, n, k], [l, n, k]],
            Shape::GroupedGemm { ref groups } => groups.iter().flat_map(|&(m, n, k)| [[1, m, k], [1, n, k]]).collect(),
            Shape::Moe { n, k, ref counts } => vec![[1, tokens(counts), k], [counts.len(), n, k]],
        }
    }

    /// The f16 outputs as `[L, rows, cols]` (one per group for the grouped GEMM).
    pub fn outputs(&self) -> Vec<[usize; 3]> {
        match *self {
            Shape::Gemv { m, l, .. } => vec![[l, m, 1]],
            Shape::Gemm { m, n, l, .. } | Shape::DualGemm { m, n, l, .. } => vec![[l, m, n]],
            Shape::GroupedGemm { ref groups } => groups.iter().map(|&(m, n, _)| [1, m, n]).collect(),
            Shape::Moe { n, ref counts, .. } => vec![[1, tokens(counts), n]],
        }
    }

    /// Bytes of the operands with their scales in `layout`; `None` when the count does not fit
    /// in 64 bits.
    pub fn input_bytes(&self, layout: ScaleLayout) -> Option<u64> {
        checked_sum(self.operands().into_iter().map(|[l, rows, k]| Nvfp4Tensor::bytes_for(l, rows, k, layout)))
    }

    /// Bytes of the scales alone in `layout`.
    pub fn scale_bytes(&self, layout: ScaleLayout) -> Option<u64> {
        checked_sum(self.operands().into_iter().map(|[l, rows, k]| layout.checked_len(l, rows, k)))
    }

    /// Bytes of the f16 outputs.
    pub fn output_bytes(&self) -> Option<u64> {
        checked_sum(self.outputs().into_iter().map(f16_bytes))
    }
}

/// Host bytes the CPU backend uses for one GEMM-shaped operation beside its f16 output: the f64
/// sums of every batch (`sums` products at once: 2 for the dual GEMM), the per-batch tile results
/// and one batch of both operands decoded to f32. Mirrors `backend/cpu.rs`; `None` on overflow.
pub fn cpu_working_bytes(l: usize, m: usize, n: usize, k: usize, sums: usize) -> Option<u64> {
    checked_sum([
        checked_product(&[l, m, n, 8, sums]),
        checked_product(&[m, n, 8]),
        checked_product(&[m.checked_add(n)?, k, 4]),
    ])
}

/// Host bytes the CPU backend's MoE GEMM uses beside its `output` bytes: the expert outputs (no
/// more than the output), and one expert at a time its slices (counted in the larger, blocked,
/// scale layout; a `dense` 16-bit activation slice at 2 bytes an element) and its GEMM working
/// set. Mirrors `backend/cpu.rs`; `None` on overflow.
fn moe_cpu_working_bytes(n: usize, k: usize, counts: &[usize], output: u64, dense: bool) -> Option<u64> {
    let expert = |m: usize| {
        checked_sum([
            if dense { checked_product(&[m, k, 2]) } else { Nvfp4Tensor::bytes_for(1, m, k, ScaleLayout::Blocked) },
            Nvfp4Tensor::bytes_for(1, n, k, ScaleLayout::Blocked),
            cpu_working_bytes(1, m, n, k, 1),
        ])
    };
    let largest = counts.iter().map(|&m| expert(m)).try_fold(0u64, |acc, w| Some(acc.max(w?)))?;
    output.checked_add(largest)
}

impl Problem {
    /// The dimensions of this problem.
    pub fn shape(&self) -> Shape {
        let group = |g: &Gemm| {
            let (m, n, k, _) = g.mnkl();
            (m, n, k)
        };
        match self {
            Problem::Gemv(p) => {
                let (m, k, l) = p.mkl();
                Shape::Gemv { m, k, l }
            }
            Problem::Gemm(p) => {
                let (m, n, k, l) = p.mnkl();
                Shape::Gemm { m, n, k, l }
            }
            Problem::DualGemm(p) => {
                let (m, n, k, l) = p.mnkl();
                Shape::DualGemm { m, n, k, l }
            }
            Problem::GroupedGemm(p) => Shape::GroupedGemm { groups: p.groups.iter().map(group).collect() },
            Problem::Moe(p) => {
                let (_, _, n, k) = p.etnk();
                let rows = p.expert_rows().unwrap_or_default();
                Shape::Moe { n, k, counts: rows.iter().map(|r| r.len()).collect() }
            }
        }
    }

    /// Host bytes that running this problem on `backend` allocates: the f16 output every backend
    /// returns, and for the CPU backend its f64 sums and decoded operands too. `None` when the
    /// count does not fit in 64 bits.
    pub fn run_host_bytes(&self, backend: &dyn Backend) -> Option<u64> {
        // A MoE problem's shape counts its routed rows only; its output has all T.
        let output = match self {
            Problem::Moe(p) => f16_bytes([1, p.tokens(), p.b.rows()])?,
            _ => self.shape().output_bytes()?,
        };
        run_bytes(&self.shape(), output, backend, false)
    }

    /// Refuses to run on `backend` when the host cannot hold what the run allocates.
    pub(crate) fn ensure_runnable(&self, backend: &dyn Backend) -> Result<()> {
        let what = format!("running {} {} on the {} backend", self.kind(), self.shape(), backend.name());
        ensure_host(&what, self.run_host_bytes(backend))
    }
}

impl Problem16 {
    /// Host bytes that running this problem on `backend` allocates, as for
    /// [`Problem::run_host_bytes`] (a 16-bit output of either type is as large as an f16 one).
    pub fn run_host_bytes(&self, backend: &dyn Backend) -> Option<u64> {
        let output = match self {
            Problem16::Moe(p) => f16_bytes([1, p.tokens(), p.b.rows()])?,
            _ => self.shape().output_bytes()?,
        };
        run_bytes(&self.shape(), output, backend, true)
    }
}

/// Host bytes a run of a `shape` problem allocates on `backend`: its `output` bytes, and on the
/// CPU backend the working set too (`dense`: the activation is 16-bit).
fn run_bytes(shape: &Shape, output: u64, backend: &dyn Backend, dense: bool) -> Option<u64> {
    if backend.name() != crate::CpuBackend.name() {
        return Some(output);
    }
    let working = match *shape {
        Shape::Gemv { m, k, l } => cpu_working_bytes(l, m, 1, k, 1),
        Shape::Gemm { m, n, k, l } => cpu_working_bytes(l, m, n, k, 1),
        Shape::DualGemm { m, n, k, l } => cpu_working_bytes(l, m, n, k, 2),
        // Groups run one after the other: the largest group's working set at once.
        Shape::GroupedGemm { ref groups } => {
            groups.iter().map(|&(m, n, k)| cpu_working_bytes(1, m, n, k, 1)).try_fold(0u64, |acc, w| Some(acc.max(w?)))
        }
        Shape::Moe { n, k, ref counts } => moe_cpu_working_bytes(n, k, counts, output, dense),
    };
    output.checked_add(working?)
}
