//! The one-launch GEMM of small problems (kernels/gemm_small.cu): when it is chosen, its launch
//! configuration, bind and launch.

use std::fmt;

use cudarc::driver::CudaFunction;

use super::device::{product_alpha, to_i32, DeviceOp, Keep, Workspace, WorkspaceNeeds};
use super::family::{nvfp4_act, w4a4_only, DeviceFacts, Kernels, Launch, Plan, Verdict};
use super::kernels::pdl_ready;
use super::kernels::sm90::DECODE_BIAS;
use super::kernels::small::{SmallParams, CHUNK_K, SMALL, THREADS, TILE_M, TILE_N, WARPS};
use super::overrides::Overrides;
use super::runtime::{Gpu, LaunchOptions, LaunchShape, StreamHandle};
use super::sm90::Forced;
use crate::ops::{Op, OpMeta};
use crate::{Error, Result};

pub use super::kernels::small::SMALL_SYMBOL;

/// CTAs of the small kernel for (M, N, L).
pub fn ctas((m, n, _k, l): (usize, usize, usize, usize)) -> usize {
    m.div_ceil(TILE_M) * n.div_ceil(TILE_N) * l
}

/// Whether a GEMM of this shape runs on the small kernel: when forced (`NVFP4_GEMM_SM90=small`),
/// never when another choice is forced (`sm90`, `off`, a variant), and otherwise where it measured
/// faster than the skeleton in both protocols (H200, NOTES.md "The small GEMM"): at most
/// [`MAX_CHUNKS_PER_WARP`] chunks per warp (each one memory latency after the first) and at most
/// [`MAX_CHUNKS_PER_SM`] CTA-chunks of work per SM. 128x256x256: 3.1 µs per launch in a graph
/// against the skeleton's 8.5; 128x1024x1024 6.4 against 12.0; 512x512x512 8.2 against 11.8;
/// past the bounds it loses (128x2048x2048 20.8 against 14.4, 128x7168x256 15.3 against 8.9).
pub fn chosen(mnkl: (usize, usize, usize, usize), sms: usize, forced: Option<Forced>) -> bool {
    match forced {
        Some(Forced::Small) => true,
        Some(_) => false,
        None => {
            let chunks = mnkl.2.div_ceil(CHUNK_K);
            chunks.div_ceil(WARPS) <= MAX_CHUNKS_PER_WARP && ctas(mnkl) * chunks <= MAX_CHUNKS_PER_SM * sms
        }
    }
}

/// The small family's verdict: a GEMM that [`chosen`] gives it (`NVFP4_GEMM_SM90` included).
pub(crate) fn route(op: &OpMeta, facts: &dyn DeviceFacts, overrides: &Overrides) -> Result<Verdict> {
    let Op::Gemm { a, b, .. } = op else {
        return Ok(Verdict::NotItsOp);
    };
    if let Some(v) = w4a4_only(op) {
        return Ok(v);
    }
    let mnkl = (a.rows(), b.rows, a.k(), a.l());
    let forced = overrides.gemm;
    Ok(if chosen(mnkl, facts.sms(), forced) {
        Verdict::Takes(Box::new(SmallConfig { mnkl, grid: ctas(mnkl) }))
    } else if let Some(f) = forced {
        Verdict::Declines(format!("NVFP4_GEMM_SM90 forces {f:?}"))
    } else {
        let chunks = mnkl.2.div_ceil(CHUNK_K);
        Verdict::Declines(format!(
            "{} chunks of K per warp (at most {MAX_CHUNKS_PER_WARP}), {} CTA-chunks per SM (at most {MAX_CHUNKS_PER_SM})",
            chunks.div_ceil(WARPS),
            (ctas(mnkl) * chunks).div_ceil(facts.sms().max(1))
        ))
    })
}

/// Most 64-element chunks per warp where the small kernel is chosen on its own.
pub const MAX_CHUNKS_PER_WARP: usize = 4;
/// Most CTA-chunks (CTAs x chunks of K) per SM where the small kernel is chosen on its own.
pub const MAX_CHUNKS_PER_SM: usize = 32;

/// Launch configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmallConfig {
    /// (M, N, K, L).
    pub mnkl: (usize, usize, usize, usize),
    /// CTAs launched.
    pub grid: usize,
}

impl fmt::Display for SmallConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (m, n, k, l) = self.mnkl;
        write!(
            f,
            "{SMALL_SYMBOL} {m}x{n}x{k}x{l}: one launch, {TILE_M}x{TILE_N} tiles, K in {CHUNK_K}-element chunks \
             shared by {WARPS} warps, mma.sync m16n8k16 from registers, grid {} x {THREADS}",
            self.grid
        )
    }
}

impl Plan for SmallConfig {
    fn family(&self) -> &'static str {
        "small"
    }
    fn needs(&self) -> WorkspaceNeeds {
        WorkspaceNeeds::default()
    }
    /// Binds a GEMM's views (of the plan's shape) to the kernel.
    fn bind(&self, k: &dyn Kernels, op: &DeviceOp<'_>, _: &Workspace) -> Result<Box<dyn Launch>> {
        let Op::Gemm { a, b, alpha, c } = op else {
            return Err(Error::Invalid(format!("a small-GEMM plan bound to a {}", op.name())));
        };
        let a = nvfp4_act(a, "small")?;
        let (m, n, kk, l) = self.mnkl;
        if (a.meta.l, a.meta.rows, a.meta.k, b.meta.rows) != (l, m, kk, n) || c.shape != [l, m, n] {
            return Err(Error::Shape(format!(
                "small gemm: operands and output do not have the plan's shape {m}x{n}x{kk}x{l}"
            )));
        }
        to_i32(self.grid, "CTAs")?;
        let params = SmallParams {
            a: a.values,
            sfa: a.scales,
            b: b.values,
            sfb: b.scales,
            c: c.addr,
            // The 2^-7 of each operand's biased decode comes back here (a power of two: exact).
            alpha: product_alpha(*alpha, a, b) * DECODE_BIAS,
            m: to_i32(m, "M")?,
            n: to_i32(n, "N")?,
            k: to_i32(kk, "K")?,
            l: to_i32(l, "L")?,
            layouts: a.blocked_flag() | b.blocked_flag() << 1,
            out_bf16: c.bf16_flag(),
        };
        let keep = [a.keep(), b.keep(), c.keep()].into_iter().flatten().collect();
        let func = k.function(&SMALL, SMALL_SYMBOL)?;
        Ok(Box::new(SmallLaunch { grid: self.grid, func, params, keep }))
    }
}

/// A GEMM bound to the small kernel.
struct SmallLaunch {
    grid: usize,
    func: CudaFunction,
    params: SmallParams,
    keep: Vec<Keep>,
}

impl Launch for SmallLaunch {
    /// `chain`: as a programmatic dependent of the previous kernel (the kernel waits before it
    /// touches memory).
    fn enqueue(&self, gpu: &Gpu, stream: StreamHandle, chain: bool) -> Result<()> {
        let options = LaunchOptions { dependent: chain && pdl_ready(SMALL_SYMBOL), cluster_x: 0 };
        let shape = LaunchShape::linear(self.grid as u32, THREADS, 0).with(options);
        gpu.launch(stream, &self.func, shape, &self.params)
    }
    fn first_symbol(&self) -> &'static str {
        SMALL_SYMBOL
    }
    fn keeps(&self) -> &[Keep] {
        &self.keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice() {
        // Forced either way.
        assert!(chosen((4096, 4096, 4096, 1), 132, Some(Forced::Small)));
        assert!(!chosen((128, 256, 256, 1), 132, Some(Forced::Off)));
        // On its own: small shapes only.
        for mnkl in [(128, 256, 256, 1), (128, 1024, 1024, 1), (512, 512, 512, 1), (32, 1024, 1024, 1), (1, 1, 16, 1)] {
            assert!(chosen(mnkl, 132, None), "{mnkl:?}");
        }
        // Long K, many tiles, or both.
        for mnkl in
            [(128, 256, 4096, 1), (4096, 4096, 256, 1), (128, 7168, 256, 1), (128, 2048, 2048, 1), (128, 7168, 2048, 1)]
        {
            assert!(!chosen(mnkl, 132, None), "{mnkl:?}");
        }
        assert_eq!(ctas((17, 33, 64, 2)), 2 * 2 * 2);
    }
}
