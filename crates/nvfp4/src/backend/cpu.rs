//! The CPU backend, which is also the oracle for every other backend: operands are decoded to f32
//! (exact), products summed in f64, the result scaled by alpha and rounded once to f16 or bf16
//! (RNE).

use rayon::prelude::*;

use crate::format::{OutTensor, OutputDtype};
use crate::memory::{checked_product, checked_sum, ensure_host};
use crate::ops::{
    check_product, effective_alpha, Activation, Backend, DualGemm, Gemm, Gemv, GroupedGemm, HostActivation, MoeGemm,
};
use crate::problem::cpu_working_bytes;
use crate::Result;

/// The exact, multi-threaded reference backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

/// Output tile processed by one task: `TILE_M` rows of A against `TILE_N` rows of B.
const TILE_M: usize = 32;
const TILE_N: usize = 16;

/// Dot product of two decoded rows. Each f32 product is exact (a few significant bits per
/// factor); the f64 sum is exact for the SPEC generators and far below f16 resolution otherwise.
fn dot(a: &[f32], b: &[f32]) -> f64 {
    let mut acc = [0f64; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += (x[i] * y[i]) as f64;
        }
    }
    let tail: f64 = ar.iter().zip(br).map(|(x, y)| (x * y) as f64).sum();
    acc.iter().sum::<f64>() + tail
}

/// `A[b] · B[b]ᵀ` for every batch b, in f64, `[L, M, N]`. Either operand NVFP4 or 16-bit (both
/// decode exactly to f32).
fn products(a: &impl HostActivation, b: &impl HostActivation) -> Vec<f64> {
    let (am, bm) = (a.act_meta(), b.act_meta());
    let (m, n, k) = (am.rows(), bm.rows(), am.k());
    let mut out = vec![0f64; am.l() * m * n];
    for batch in 0..am.l() {
        let da = a.decode_batch(batch);
        let db = b.decode_batch(batch);
        let (da, db) = (&da[..], &db[..]);
        let tiles: Vec<(usize, usize)> =
            (0..m.div_ceil(TILE_M)).flat_map(|i| (0..n.div_ceil(TILE_N)).map(move |j| (i, j))).collect();
        let results: Vec<Vec<f64>> = tiles
            .par_iter()
            .map(|&(ti, tj)| {
                let rows = ti * TILE_M..(ti * TILE_M + TILE_M).min(m);
                let cols = tj * TILE_N..(tj * TILE_N + TILE_N).min(n);
                rows.flat_map(|r| {
                    let ar = &da[r * k..(r + 1) * k];
                    cols.clone().map(move |c| dot(ar, &db[c * k..(c + 1) * k]))
                })
                .collect()
            })
            .collect();
        let base = &mut out[batch * m * n..(batch + 1) * m * n];
        for (&(ti, tj), vals) in tiles.iter().zip(results) {
            let width = (tj * TILE_N + TILE_N).min(n) - tj * TILE_N;
            for (idx, v) in vals.into_iter().enumerate() {
                base[(ti * TILE_M + idx / width) * n + tj * TILE_N + idx % width] = v;
            }
        }
    }
    out
}

/// `sums * alpha`, each rounded once to `dtype`.
fn round_to(sums: &[f64], alpha: f32, dtype: OutputDtype) -> Vec<u16> {
    sums.iter().map(|&s| dtype.round_f64(s * alpha as f64)).collect()
}

impl CpuBackend {
    /// Bytes an operation on `a` and `b` (B's rows are N) holds at once: the 16-bit output and the
    /// working buffers (`sums` f64 product sums, decoded operands; `problem::cpu_working_bytes`).
    fn footprint(a: &impl Activation, b: &impl Activation, sums: usize) -> Option<u64> {
        let (a, b) = (a.act_meta(), b.act_meta());
        let (l, m, n, k) = (a.l(), a.rows(), b.rows(), a.k());
        checked_sum([checked_product(&[l, m, n, 2]), cpu_working_bytes(l, m, n, k, sums)])
    }

    /// The operations' fields are public: their scalars are checked again here, so that a changed
    /// alpha or global scale cannot turn exact zeros into NaN.
    fn gemm_parts(
        a: &impl HostActivation,
        b: &impl HostActivation,
        alpha: Option<f32>,
        dtype: OutputDtype,
    ) -> Result<OutTensor> {
        check_product("gemm", alpha, a, b, "b")?;
        ensure_host("a CPU GEMM", Self::footprint(a, b, 1))?;
        let bits = round_to(&products(a, b), effective_alpha(alpha, a, b), dtype);
        let (am, bm) = (a.act_meta(), b.act_meta());
        OutTensor::new(dtype, [am.l(), am.rows(), bm.rows()], bits)
    }

    /// x1 and x2 scaled by alpha in f64 and rounded to f32, the gate in f32, one rounding to
    /// `dtype`.
    fn dual_parts<A: HostActivation>(p: &DualGemm<A>, dtype: OutputDtype) -> Result<OutTensor> {
        p.op().validate()?;
        ensure_host("a CPU dual GEMM", Self::footprint(&p.a, &p.b1, 2))?;
        let (alpha1, alpha2) = (effective_alpha(p.alpha, &p.a, &p.b1), effective_alpha(p.alpha, &p.a, &p.b2));
        let x1 = products(&p.a, &p.b1);
        let x2 = products(&p.a, &p.b2);
        let bits = x1
            .iter()
            .zip(&x2)
            .map(|(&s1, &s2)| {
                let g = (s1 * alpha1 as f64) as f32;
                let u = (s2 * alpha2 as f64) as f32;
                dtype.round_f32(silu(g) * u)
            })
            .collect();
        let (m, n, _, l) = p.mnkl();
        OutTensor::new(dtype, [l, m, n], bits)
    }

    /// Each expert with tokens as the GEMM of its slices, one expert at a time (its slices are
    /// dropped before the next is cut), written into one zeroed `[1, T, N]`.
    fn moe_parts<A: HostActivation>(p: &MoeGemm<A>, dtype: OutputDtype) -> Result<OutTensor> {
        // The expert outputs and the assembled output, each [1, T, N] 16-bit at most.
        let (_, t, n, _) = p.etnk();
        ensure_host("a CPU MoE GEMM", checked_product(&[2, t, n, 2]))?;
        let parts = p
            .routed_experts()?
            .into_iter()
            .map(|e| {
                let g = p.expert_gemm(e)?;
                Ok((e, Self::gemm_parts(&g.a, &g.b, g.alpha, dtype)?))
            })
            .collect::<Result<Vec<_>>>()?;
        p.assemble(dtype, parts)
    }
}

/// SiLU in FP32 as SPEC §3 states it: x / (1 + e^-x).
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn gemv_as(&self, p: &Gemv, dtype: OutputDtype) -> Result<OutTensor> {
        Self::gemm_parts(&p.a, &p.b, p.alpha, dtype)
    }

    fn gemm_as(&self, p: &Gemm, dtype: OutputDtype) -> Result<OutTensor> {
        Self::gemm_parts(&p.a, &p.b, p.alpha, dtype)
    }

    fn dual_gemm_as(&self, p: &DualGemm, dtype: OutputDtype) -> Result<OutTensor> {
        Self::dual_parts(p, dtype)
    }

    fn grouped_gemm_as(&self, p: &GroupedGemm, dtype: OutputDtype) -> Result<Vec<OutTensor>> {
        p.groups.iter().map(|g| Self::gemm_parts(&g.a, &g.b, g.alpha, dtype)).collect()
    }

    fn moe_gemm_as(&self, p: &MoeGemm, dtype: OutputDtype) -> Result<OutTensor> {
        Self::moe_parts(p, dtype)
    }

    fn gemv16_as(&self, p: &Gemv<OutTensor>, dtype: OutputDtype) -> Result<OutTensor> {
        Self::gemm_parts(&p.a, &p.b, p.alpha, dtype)
    }

    fn gemm16_as(&self, p: &Gemm<OutTensor>, dtype: OutputDtype) -> Result<OutTensor> {
        Self::gemm_parts(&p.a, &p.b, p.alpha, dtype)
    }

    fn dual_gemm16_as(&self, p: &DualGemm<OutTensor>, dtype: OutputDtype) -> Result<OutTensor> {
        Self::dual_parts(p, dtype)
    }

    fn grouped_gemm16_as(&self, p: &GroupedGemm<OutTensor>, dtype: OutputDtype) -> Result<Vec<OutTensor>> {
        p.groups.iter().map(|g| Self::gemm_parts(&g.a, &g.b, g.alpha, dtype)).collect()
    }

    fn moe_gemm16_as(&self, p: &MoeGemm<OutTensor>, dtype: OutputDtype) -> Result<OutTensor> {
        Self::moe_parts(p, dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{generate, Problem, Shape};

    /// The working-memory estimate reads the dimensions in order (L, M, N, K): distinct sizes,
    /// compared with the formula written out.
    #[test]
    fn footprint_counts_output_sums_and_decoded_operands() {
        let (m, n, k, l) = (3, 5, 48, 2);
        let Problem::DualGemm(d) = generate(&Shape::DualGemm { m, n, k, l }, 1).unwrap() else { unreachable!() };
        let want = (l * m * n * 2 + l * m * n * 8 * 2 + m * n * 8 + (m + n) * k * 4) as u64;
        assert_eq!(CpuBackend::footprint(&d.a, &d.b1, 2), Some(want));
        assert!(CpuBackend.dual_gemm(&d).is_ok());
    }
}
