//! The peer of SPEC §7: cuBLASLt FP16 GEMMs (FP32 compute and accumulation) on operands
//! dequantized to f16 on the host and uploaded once, what a user with memory to spare runs.
//! e2m1 · e4m3 is exact in f16, so the peer multiplies exactly the same values as our kernels;
//! the global scales go into the GEMM's FP32 alpha.
//!
//! Row-major `C[L, M, N] = A[L, M, K] · B[L, N, K]ᵀ` is, column-major, `Cᵀ[N, M] = B · Aᵀ`: cuBLAS's
//! A is our B (stored `K x N`, used transposed), cuBLAS's B is our A (stored `K x M`, used as is),
//! C has leading dimension N: the "TN" GEMM. A GEMV (N = 1) may also put the weight on cuBLAS's M
//! side (`C[M, 1] = Aᵀ·b` with A stored `K x M`); both are built and the faster is kept.

use half::f16;
use rayon::prelude::*;

use super::lt::{DeviceF16, GemmSpec, Lt, LtPlan};
use super::timer::Timer;
use crate::backend::cpu::silu;
use crate::format::{F16Tensor, Nvfp4Tensor};
use crate::ops::{effective_alpha, Gemm};
use crate::problem::{Output, Problem};
use crate::{Error, Result};

/// Warm-up launches and samples used to choose between two peer layouts.
const PICK_WARMUP: usize = 3;
const PICK_SAMPLES: usize = 10;

/// Dequantizes `t` to f16 `[L, rows, K]` without its global scale: e2m1 · e4m3 has at most 5
/// significant bits and magnitude in [2^-10, 2688], so every value is exact in f16.
pub fn dequantize_f16(t: &Nvfp4Tensor) -> Vec<f16> {
    let (rows, k) = (t.rows(), t.k());
    let mut out = vec![f16::ZERO; t.l() * rows * k];
    out.par_chunks_mut(k).enumerate().for_each_init(
        || vec![0f32; k],
        |row, (i, chunk)| {
            t.decode_row_into(i / rows, i % rows, row);
            for (o, &v) in chunk.iter_mut().zip(row.iter()) {
                *o = f16::from_f32(v);
                debug_assert_eq!(o.to_f32(), v, "e2m1 * e4m3 must be exact in f16");
            }
        },
    );
    out
}

/// cuBLASLt form of row-major `C[L, M, N] = A · Bᵀ` (see the module note): launch with
/// (our B, our A, C).
pub(crate) fn abt_spec(m: usize, n: usize, k: usize, l: usize) -> GemmSpec {
    let (m, n, k) = (m as u64, n as u64, k as u64);
    GemmSpec {
        m: n,
        n: m,
        k,
        trans_a: true,
        trans_b: false,
        lda: k as i64,
        ldb: k as i64,
        ldc: n as i64,
        batch: l as i32,
        stride_a: (n * k) as i64,
        stride_b: (m * k) as i64,
        stride_c: (m * n) as i64,
    }
}

/// GEMV with the weight on cuBLAS's M side, column-major `c[M, 1] = Aᵀ[M, K] · b[K, 1]`:
/// launch with (our A, our b, c).
fn weight_m_spec(m: usize, k: usize, l: usize) -> GemmSpec {
    let (m, k) = (m as u64, k as u64);
    GemmSpec {
        m,
        n: 1,
        k,
        trans_a: true,
        trans_b: false,
        lda: k as i64,
        ldb: k as i64,
        ldc: m as i64,
        batch: l as i32,
        stride_a: (m * k) as i64,
        stride_b: k as i64,
        stride_c: m as i64,
    }
}

/// The GEMMs of one launch sequence, each field once when all agree, else as a list:
/// `TN m=4096 n=[80,176] k=7168 x2`.
fn describe_specs(specs: &[GemmSpec]) -> String {
    let field = |name: &str, f: &dyn Fn(&GemmSpec) -> String| {
        let vals: Vec<String> = specs.iter().map(f).collect();
        if vals.iter().all(|v| *v == vals[0]) {
            format!("{name}{}", vals[0])
        } else {
            format!("{name}[{}]", vals.join(","))
        }
    };
    let t = |x: bool| if x { 'T' } else { 'N' };
    let mut s = [
        field("", &|s| format!("{}{}", t(s.trans_a), t(s.trans_b))),
        field("m=", &|s| s.m.to_string()),
        field("n=", &|s| s.n.to_string()),
        field("k=", &|s| s.k.to_string()),
    ]
    .join(" ");
    if specs.iter().any(|s| s.batch > 1) {
        s += &format!(" {}", field("batch=", &|s| s.batch.to_string()));
    }
    if specs.len() > 1 {
        s += &format!(" x{}", specs.len());
    }
    s
}

/// One cuBLASLt GEMM over buffers of the peer, by index.
struct Op {
    plan: LtPlan,
    a: usize,
    b: usize,
    c: usize,
}

/// How the downloaded buffers become an [`Output`].
enum Assemble {
    /// One `[L, M, N]` output in buffer `c`.
    Single { l: usize, m: usize, n: usize, c: usize },
    /// `silu(x1) · x2` on the host, computed in FP32 from the two f16 products.
    Dual { l: usize, m: usize, n: usize, c1: usize, c2: usize },
    /// One `[1, M_g, N_g]` output per group.
    Grouped(Vec<(usize, usize, usize)>),
}

/// The cuBLASLt FP16 peer of one problem, operands resident on the device.
pub struct Peer<'a> {
    lt: &'a Lt,
    bufs: Vec<DeviceF16>,
    // Candidate launch sequences (two layouts for a GEMV), the chosen one at `chosen`.
    candidates: Vec<Vec<Op>>,
    chosen: usize,
    assemble: Assemble,
}

impl<'a> Peer<'a> {
    /// Dequantizes and uploads the operands of `problem`, allocates the outputs and plans the
    /// GEMMs: a GEMV and a GEMM are one (batched) GEMM, a dual GEMM two GEMMs back to back, a
    /// grouped GEMM one GEMM per group back to back.
    pub fn new(lt: &'a Lt, problem: &Problem) -> Result<Self> {
        let stream = lt.stream();
        let mut bufs = Vec::new();
        let mut push = |b: DeviceF16| {
            bufs.push(b);
            bufs.len() - 1
        };
        let upload = |t: &Nvfp4Tensor| DeviceF16::upload(stream, &dequantize_f16(t));
        let gemm_op = |g: &Gemm, a: usize, b: usize, c: usize| -> Result<Op> {
            let (m, n, k, l) = g.mnkl();
            let plan = LtPlan::new(lt, abt_spec(m, n, k, l), effective_alpha(g.alpha, &g.a, &g.b))?;
            Ok(Op { plan, a: b, b: a, c })
        };
        let (candidates, assemble) = match problem {
            Problem::Gemv(p) => {
                let (m, k, l) = p.mkl();
                let (a, b) = (push(upload(&p.a)?), push(upload(&p.b)?));
                let c = push(DeviceF16::zeros(stream, l * m)?);
                let alpha = effective_alpha(p.alpha, &p.a, &p.b);
                let layouts = [(weight_m_spec(m, k, l), a, b), (abt_spec(m, 1, k, l), b, a)];
                let mut candidates = Vec::new();
                let mut last_err = None;
                for (spec, x, y) in layouts {
                    match LtPlan::new(lt, spec, alpha) {
                        Ok(plan) => candidates.push(vec![Op { plan, a: x, b: y, c }]),
                        Err(e) => last_err = Some(e),
                    }
                }
                if candidates.is_empty() {
                    return Err(last_err.unwrap_or_else(|| Error::Cuda("no cuBLASLt GEMV plan".into())));
                }
                (candidates, Assemble::Single { l, m, n: 1, c })
            }
            Problem::Gemm(p) => {
                let (m, n, _, l) = p.mnkl();
                let (a, b) = (push(upload(&p.a)?), push(upload(&p.b)?));
                let c = push(DeviceF16::zeros(stream, l * m * n)?);
                (vec![vec![gemm_op(p, a, b, c)?]], Assemble::Single { l, m, n, c })
            }
            Problem::DualGemm(p) => {
                let (m, n, _, l) = p.mnkl();
                let a = push(upload(&p.a)?);
                let (b1, b2) = (push(upload(&p.b1)?), push(upload(&p.b2)?));
                let c1 = push(DeviceF16::zeros(stream, l * m * n)?);
                let c2 = push(DeviceF16::zeros(stream, l * m * n)?);
                let g1 = Gemm { a: p.a.clone(), b: p.b1.clone(), alpha: p.alpha };
                let g2 = Gemm { a: p.a.clone(), b: p.b2.clone(), alpha: p.alpha };
                let ops = vec![gemm_op(&g1, a, b1, c1)?, gemm_op(&g2, a, b2, c2)?];
                (vec![ops], Assemble::Dual { l, m, n, c1, c2 })
            }
            Problem::GroupedGemm(p) => {
                let mut ops = Vec::with_capacity(p.groups.len());
                let mut outs = Vec::with_capacity(p.groups.len());
                for g in &p.groups {
                    let (m, n, _, _) = g.mnkl();
                    let (a, b) = (push(upload(&g.a)?), push(upload(&g.b)?));
                    let c = push(DeviceF16::zeros(stream, m * n)?);
                    ops.push(gemm_op(g, a, b, c)?);
                    outs.push((m, n, c));
                }
                (vec![ops], Assemble::Grouped(outs))
            }
            Problem::Moe(_) => {
                return Err(Error::Unsupported {
                    backend: "the benchmark's cuBLASLt peer".into(),
                    what: "the MoE form (it is not benched)".into(),
                })
            }
        };
        Ok(Self { lt, bufs, candidates, chosen: 0, assemble })
    }

    /// With more than one candidate layout, times each (L2 cold, short) and chooses the fastest.
    pub fn pick_fastest(&mut self, timer: &Timer) -> Result<()> {
        if self.candidates.len() < 2 {
            return Ok(());
        }
        let mut best = (f64::INFINITY, 0);
        for i in 0..self.candidates.len() {
            self.chosen = i;
            let us = timer.time_us(|| self.launch(), PICK_WARMUP, PICK_SAMPLES)?.median();
            if us < best.0 {
                best = (us, i);
            }
        }
        self.chosen = best.1;
        Ok(())
    }

    /// Chooses the layout `other` chose (a peer of the same problem: another input set).
    pub fn follow(&mut self, other: &Peer<'_>) {
        if other.chosen < self.candidates.len() {
            self.chosen = other.chosen;
        }
    }

    /// Bytes of the f16 operands one launch reads (every buffer but the outputs).
    pub fn operand_bytes(&self) -> u64 {
        let outputs: Vec<usize> = self.candidates.iter().flatten().map(|op| op.c).collect();
        let elements: usize =
            self.bufs.iter().enumerate().filter(|(i, _)| !outputs.contains(i)).map(|(_, b)| b.len()).sum();
        2 * elements as u64
    }

    /// Enqueues every GEMM of the chosen sequence on the handle's stream.
    pub fn launch(&self) -> Result<()> {
        for op in &self.candidates[self.chosen] {
            op.plan.launch(self.lt, &self.bufs[op.a], &self.bufs[op.b], &self.bufs[op.c])?;
        }
        Ok(())
    }

    /// Waits for the stream, downloads the products and assembles the operation's output.
    pub fn output(&self) -> Result<Output> {
        let stream = self.lt.stream();
        let get = |i: usize| self.bufs[i].download(stream);
        Ok(match &self.assemble {
            &Assemble::Single { l, m, n, c } => Output::Single(F16Tensor::new(l, m, n, get(c)?)?),
            &Assemble::Dual { l, m, n, c1, c2 } => {
                let (x1, x2) = (get(c1)?, get(c2)?);
                let data = x1.iter().zip(&x2).map(|(g, u)| f16::from_f32(silu(g.to_f32()) * u.to_f32())).collect();
                Output::Single(F16Tensor::new(l, m, n, data)?)
            }
            Assemble::Grouped(outs) => {
                Output::Grouped(outs.iter().map(|&(m, n, c)| F16Tensor::new(1, m, n, get(c)?)).collect::<Result<_>>()?)
            }
        })
    }

    /// The GEMMs the peer launches, e.g. `cublasLt f16 TN m=4096 n=[80,176] k=7168 x2`.
    pub fn describe(&self) -> String {
        let specs: Vec<GemmSpec> = self.candidates[self.chosen].iter().map(|o| *o.plan.spec()).collect();
        format!("cublasLt f16 {}", describe_specs(&specs))
    }
}

/// Absolute and relative tolerance of the peer's sanity check: an f16 GEMM is not expected to be
/// bit-exact (the dual GEMM's products are rounded to f16 before the gate), only close.
pub const PEER_ATOL: f64 = 1e-2;
/// See [`PEER_ATOL`].
pub const PEER_RTOL: f64 = 1e-2;

/// How the peer's output compares with the reference.
#[derive(Clone, Debug, PartialEq)]
pub enum PeerAgreement {
    /// Every element bit-identical.
    BitExact,
    /// Within [`PEER_ATOL`] + [`PEER_RTOL`] · |ref| everywhere; the largest error.
    Close { max_abs_err: f64 },
}

/// Loose check of a peer output against the reference: every element finite where the
/// reference is, and within the peer tolerance. The error names the first bad element.
pub fn check_peer(got: &Output, reference: &Output) -> std::result::Result<PeerAgreement, String> {
    let (g, r) = (got.tensors(), reference.tensors());
    if g.len() != r.len() {
        return Err(format!("{} output tensors, expected {}", g.len(), r.len()));
    }
    let mut exact = true;
    let mut max_abs_err = 0f64;
    for (t, (gt, rt)) in g.iter().zip(r).enumerate() {
        if gt.shape() != rt.shape() {
            return Err(format!("output {t} has shape {:?}, expected {:?}", gt.shape(), rt.shape()));
        }
        for (i, (&x, &y)) in gt.data().iter().zip(rt.data()).enumerate() {
            exact &= x.to_bits() == y.to_bits();
            let (x, y) = (x.to_f64(), y.to_f64());
            if y.is_finite() {
                let err = (x - y).abs();
                if !x.is_finite() || err > PEER_ATOL + PEER_RTOL * y.abs() {
                    return Err(format!("output {t} element {i}: peer {x}, reference {y}"));
                }
                max_abs_err = max_abs_err.max(err);
            }
        }
    }
    Ok(if exact { PeerAgreement::BitExact } else { PeerAgreement::Close { max_abs_err } })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cuBLAS's column-major semantics of `spec` on host buffers:
    /// `C[i + j·ldc + b·stride_c] = alpha · Σ_p op(A)(i, p) · op(B)(p, j)`.
    fn emulate(spec: &GemmSpec, a: &[f32], b: &[f32], alpha: f32) -> Vec<f32> {
        let [_, _, sc] = spec.spans();
        let mut c = vec![f32::NAN; sc];
        let (m, n, k) = (spec.m as usize, spec.n as usize, spec.k as usize);
        let (lda, ldb, ldc) = (spec.lda as usize, spec.ldb as usize, spec.ldc as usize);
        for batch in 0..spec.batch as usize {
            let (a, b) = (&a[batch * spec.stride_a as usize..], &b[batch * spec.stride_b as usize..]);
            for i in 0..m {
                for j in 0..n {
                    let mut s = 0f32;
                    for p in 0..k {
                        let x = if spec.trans_a { a[p + i * lda] } else { a[i + p * lda] };
                        let y = if spec.trans_b { b[j + p * ldb] } else { b[p + j * ldb] };
                        s += x * y;
                    }
                    c[i + j * ldc + batch * spec.stride_c as usize] = alpha * s;
                }
            }
        }
        c
    }

    /// Row-major `C[L, M, N] = A[L, M, K] · B[L, N, K]ᵀ`.
    fn abt(a: &[f32], b: &[f32], m: usize, n: usize, k: usize, l: usize) -> Vec<f32> {
        let mut c = vec![0f32; l * m * n];
        for batch in 0..l {
            for i in 0..m {
                for j in 0..n {
                    c[(batch * m + i) * n + j] =
                        (0..k).map(|p| a[(batch * m + i) * k + p] * b[(batch * n + j) * k + p]).sum();
                }
            }
        }
        c
    }

    fn small_ints(len: usize, seed: usize) -> Vec<f32> {
        (0..len).map(|i| ((i * 7 + seed * 13) % 11) as f32 - 5.0).collect()
    }

    #[test]
    fn describe_lists_only_what_differs() {
        let specs = [abt_spec(80, 4096, 7168, 1), abt_spec(176, 4096, 7168, 1)];
        assert_eq!(describe_specs(&specs), "TN m=4096 n=[80,176] k=7168 x2");
        assert_eq!(describe_specs(&specs[..1]), "TN m=4096 n=80 k=7168");
        assert_eq!(describe_specs(&[weight_m_spec(4096, 7168, 8)]), "TN m=4096 n=1 k=7168 batch=8");
    }

    #[test]
    fn tn_mapping_computes_a_times_b_transposed() {
        let (m, n, k, l) = (5, 3, 4, 2);
        let (a, b) = (small_ints(l * m * k, 1), small_ints(l * n * k, 2));
        let spec = abt_spec(m, n, k, l);
        assert_eq!(spec.spans(), [l * n * k, l * m * k, l * m * n]);
        // cuBLAS's A is our B, cuBLAS's B is our A.
        assert_eq!(emulate(&spec, &b, &a, 1.0), abt(&a, &b, m, n, k, l));
    }

    #[test]
    fn weight_on_m_side_computes_the_gemv() {
        let (m, k, l) = (6, 4, 3);
        let (a, b) = (small_ints(l * m * k, 3), small_ints(l * k, 4));
        let spec = weight_m_spec(m, k, l);
        assert_eq!(spec.spans(), [l * m * k, l * k, l * m]);
        assert_eq!(emulate(&spec, &a, &b, 2.0), abt(&a, &b, m, 1, k, l).iter().map(|x| 2.0 * x).collect::<Vec<_>>());
    }
}
