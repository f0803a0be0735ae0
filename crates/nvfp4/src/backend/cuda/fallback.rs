//! The tensor-core fallback for GEMM, gated dual GEMM and grouped GEMM (kernels/gemm_fallback.cu):
//! problem descriptors, the flattened tile grid, and the launch. Correct for any shape; its speed
//! is a placeholder until the wgmma kernels replace it.

use std::fmt;

use cudarc::driver::{CudaFunction, CudaSlice};

use super::runtime::Gpu;
use crate::format::{Nvfp4Tensor, ScaleLayout};
use crate::ops::{effective_alpha, DualGemm, Gemm, GroupedGemm};
use crate::{Error, Result};

/// Threads per CTA (4 warps).
pub const THREADS: u32 = 128;
/// Output tile of one CTA (rows of A x rows of B).
pub const TILE_M: usize = 64;
/// See [`TILE_M`].
pub const TILE_N: usize = 64;
/// K elements per shared-memory stage (two scale blocks).
pub const TILE_K: usize = 32;

/// Kernel symbols.
pub const GEMM_SYMBOL: &str = "gemm_nvfp4_sm90_mma";
/// See [`GEMM_SYMBOL`].
pub const DUAL_SYMBOL: &str = "dual_gemm_nvfp4_sm90_mma";

/// One problem of the launch; mirrors `struct MmaProblem` in gemm_fallback.cu. Serialized by
/// [`MmaProblem::to_bytes`] (no unsafe transmute): 7 pointers, 2 f64, 8 i32 = 104 bytes.
#[derive(Clone, Copy, Debug, Default)]
struct MmaProblem {
    a: u64,
    sfa: u64,
    b: u64,
    sfb: u64,
    b2: u64,
    sfb2: u64,
    c: u64,
    alpha: f64,
    alpha2: f64,
    m: i32,
    n: i32,
    k: i32,
    l: i32,
    layouts: i32,
    tiles_m: i32,
    tiles_n: i32,
    tile_start: i32,
}

impl MmaProblem {
    const BYTES: usize = 104;

    fn to_bytes(self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        let words64 = [self.a, self.sfa, self.b, self.sfb, self.b2, self.sfb2, self.c];
        let f64s = [self.alpha, self.alpha2];
        let words32 = [self.m, self.n, self.k, self.l, self.layouts, self.tiles_m, self.tiles_n, self.tile_start];
        let mut at = 0;
        for w in words64 {
            out[at..at + 8].copy_from_slice(&w.to_le_bytes());
            at += 8;
        }
        for f in f64s {
            out[at..at + 8].copy_from_slice(&f.to_le_bytes());
            at += 8;
        }
        for w in words32 {
            out[at..at + 4].copy_from_slice(&w.to_le_bytes());
            at += 4;
        }
        debug_assert_eq!(at, Self::BYTES);
        out
    }
}

/// The kernel's parameter struct; mirrors `struct MmaParams` in gemm_fallback.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MmaParams {
    problems: u64,
    count: i32,
    reserved: i32,
}

/// Launch configuration: which kernel, how many problems and tiles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MmaConfig {
    /// Kernel symbol.
    pub symbol: &'static str,
    /// (M, N, K, L) of each problem.
    pub problems: Vec<(usize, usize, usize, usize)>,
    /// CTAs launched (all problems' tiles, flattened).
    pub grid: usize,
}

impl fmt::Display for MmaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shapes: Vec<String> = self
            .problems
            .iter()
            .map(|&(m, n, k, l)| if l == 1 { format!("{m}x{n}x{k}") } else { format!("{m}x{n}x{k}x{l}") })
            .collect();
        write!(
            f,
            "{} [{}]: {TILE_M}x{TILE_N}x{TILE_K} tiles, mma.sync m16n8k16 f16->f32, grid {} x {THREADS}",
            self.symbol,
            shapes.join(", "),
            self.grid
        )
    }
}

/// One GEMM-like operand set on its way to the device.
struct Operands<'a> {
    a: &'a Nvfp4Tensor,
    b: &'a Nvfp4Tensor,
    b2: Option<&'a Nvfp4Tensor>,
    alpha: f64,
    alpha2: f64,
}

/// GEMM, dual GEMM or grouped GEMM with operands on the device.
pub(crate) struct MmaLaunch {
    pub config: MmaConfig,
    func: CudaFunction,
    params: MmaParams,
    // Operand buffers and the descriptor array the params point into.
    _buffers: Vec<CudaSlice<u8>>,
}

fn to_i32(x: usize, what: &str) -> Result<i32> {
    i32::try_from(x).map_err(|_| Error::Invalid(format!("{what} = {x} exceeds the kernel's 32-bit indexing")))
}

fn blocked(t: &Nvfp4Tensor) -> i32 {
    i32::from(t.layout() == ScaleLayout::Blocked)
}

impl MmaLaunch {
    fn build(
        gpu: &Gpu,
        symbol: &'static str,
        ops: &[Operands<'_>],
        outputs: &[&CudaSlice<u16>],
        func: CudaFunction,
    ) -> Result<Self> {
        let mut buffers = Vec::new();
        let mut up = |bytes: &[u8]| gpu.upload_kept(bytes, &mut buffers);
        let mut descs = Vec::with_capacity(ops.len() * MmaProblem::BYTES);
        let mut shapes = Vec::new();
        let mut tile_start = 0usize;
        for (op, out) in ops.iter().zip(outputs) {
            let (m, n, k, l) = (op.a.rows(), op.b.rows(), op.a.k(), op.a.l());
            let (tiles_m, tiles_n) = (m.div_ceil(TILE_M), n.div_ceil(TILE_N));
            let b2 = op.b2.unwrap_or(op.b);
            let d = MmaProblem {
                a: up(op.a.values())?,
                sfa: up(op.a.scales())?,
                b: up(op.b.values())?,
                sfb: up(op.b.scales())?,
                b2: if op.b2.is_some() { up(b2.values())? } else { 0 },
                sfb2: if op.b2.is_some() { up(b2.scales())? } else { 0 },
                c: gpu.addr(out),
                alpha: op.alpha,
                alpha2: op.alpha2,
                m: to_i32(m, "M")?,
                n: to_i32(n, "N")?,
                k: to_i32(k, "K")?,
                l: to_i32(l, "L")?,
                layouts: blocked(op.a) | blocked(op.b) << 1 | blocked(b2) << 2,
                tiles_m: to_i32(tiles_m, "M tiles")?,
                tiles_n: to_i32(tiles_n, "N tiles")?,
                tile_start: to_i32(tile_start, "tiles")?,
            };
            to_i32(l * m * n, "L * M * N")?;
            descs.extend_from_slice(&d.to_bytes());
            shapes.push((m, n, k, l));
            tile_start += tiles_m * tiles_n * l;
        }
        let grid = tile_start;
        to_i32(grid, "CTAs")?;
        let problems = up(&descs)?;
        let params = MmaParams { problems, count: to_i32(ops.len(), "groups")?, reserved: 0 };
        Ok(Self { config: MmaConfig { symbol, problems: shapes, grid }, func, params, _buffers: buffers })
    }

    /// GEMM into `c` (`[L, M, N]`).
    pub fn gemm(gpu: &Gpu, p: &Gemm, c: &CudaSlice<u16>, func: CudaFunction) -> Result<Self> {
        let alpha = effective_alpha(p.alpha, &p.a, &p.b) as f64;
        let ops = [Operands { a: &p.a, b: &p.b, b2: None, alpha, alpha2: 0.0 }];
        Self::build(gpu, GEMM_SYMBOL, &ops, &[c], func)
    }

    /// Dual GEMM into `c` (`[L, M, N]`).
    pub fn dual(gpu: &Gpu, p: &DualGemm, c: &CudaSlice<u16>, func: CudaFunction) -> Result<Self> {
        let ops = [Operands {
            a: &p.a,
            b: &p.b1,
            b2: Some(&p.b2),
            alpha: effective_alpha(p.alpha, &p.a, &p.b1) as f64,
            alpha2: effective_alpha(p.alpha, &p.a, &p.b2) as f64,
        }];
        Self::build(gpu, DUAL_SYMBOL, &ops, &[c], func)
    }

    /// Grouped GEMM, group g into `outs[g]` (`[1, M_g, N_g]`), all in one launch.
    pub fn grouped(gpu: &Gpu, p: &GroupedGemm, outs: &[&CudaSlice<u16>], func: CudaFunction) -> Result<Self> {
        let ops: Vec<Operands<'_>> = p
            .groups
            .iter()
            .map(|g| Operands {
                a: &g.a,
                b: &g.b,
                b2: None,
                alpha: effective_alpha(g.alpha, &g.a, &g.b) as f64,
                alpha2: 0.0,
            })
            .collect();
        Self::build(gpu, GEMM_SYMBOL, &ops, outs, func)
    }

    /// Enqueues the kernel.
    pub fn launch(&self, gpu: &Gpu) -> Result<()> {
        gpu.launch(&self.func, (self.config.grid as u32, 1, 1), (THREADS, 1, 1), 0, &self.params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_bytes_follow_the_c_layout() {
        let d = MmaProblem { a: 1, c: 7, alpha: 2.0, m: 3, tile_start: 9, ..Default::default() };
        let b = d.to_bytes();
        assert_eq!(&b[0..8], &1u64.to_le_bytes());
        assert_eq!(&b[48..56], &7u64.to_le_bytes());
        assert_eq!(&b[56..64], &2.0f64.to_le_bytes());
        assert_eq!(&b[72..76], &3i32.to_le_bytes());
        assert_eq!(&b[100..104], &9i32.to_le_bytes());
    }
}
