//! The MoE form at decode sizes on the W4A16 GEMV's `_cols` kernels (kernels/gemv16_moe.cuh, the
//! `_moe` kernels of gemv16.cu): plan, route and bind.
//!
//! A decode step routes a few rows to each expert. The skeleton's grouped launch runs such an
//! expert as a 16-row MMA tile fed by a work table built in a kernel of its own; here each
//! expert's rows are the columns of the GEMV's MMA (up to 8 per pass), the weights streamed once
//! per pass through a ring in shared memory, and each CTA lays out the experts' rows from the
//! device offsets itself, in the same launch. That wins where few rows per expert let its lower
//! fixed cost weigh ([`takes_by_default`]: up to 2 rows per expert for K <= 2048, fewer for
//! longer K, whose token windows are restaged per tile).

use std::fmt;

use super::device::{product_alpha, to_i32, DeviceOp, Workspace, WorkspaceNeeds};
use super::family::{DeviceFacts, Kernels, Launch, Plan, Verdict};
use super::gemv_launch::{takes, GemvLaunch, MoeOperands, Operands};
use super::gemv_tiling::Tiling;
use super::kernels::gemv16::{moe_symbol, Chunk, XType, GEMV16, MOE_MAX_EXPERTS, MOE_SMEM_BYTES};
use super::overrides::Overrides;
use crate::format::{OutputDtype, ScaleLayout};
use crate::ops::{effective_alpha, Act, Activation, MoeAlpha, Op, OpMeta};
use crate::{Error, Result};

/// Whether the route sends a MoE form of T rows over E experts (N x K weights) to the `_moe`
/// kernels when nothing is forced. Measured against the grouped launch's best form (W4A16
/// packed, W4A4) on an H200, graph protocol, with the tiles stepped by increments and plain
/// scales copied per warp (NOTES.md, "Session 17"):
/// - K <= 2048 with its K-steps (1024 elements) at least 7/8 full on average: up to 2 rows per
///   expert (Qwen3-30B-A3B gate/up up to T = 256, SPEC's 32-token decode; DeepSeek-V3's EP rank
///   down up to T = 30);
/// - K <= 2048 with partial K-steps (part of every such K-step's threads idle; Qwen3-30B-A3B's
///   down, K = 768, fills 3/4): up to one row per 2 experts (0.94x at T = 256);
/// - longer K: one row per 4 experts, per 8 with partial K-steps (DeepSeek-V3 gate/up T = 2 and
///   8, Mixtral T = 2; 0.8x at T = 38 and 16, where each expert's token window is restaged per
///   tile).
pub fn takes_by_default((t, _n, k, e): (usize, usize, usize, usize)) -> bool {
    let (rows, experts) = default_share(k);
    t * experts <= e * rows
}

/// [`takes_by_default`]'s bound for reduction length K: at most `rows` routed rows per `experts`
/// experts.
fn default_share(k: usize) -> (usize, usize) {
    match (k <= 2048, ksteps_filled(k)) {
        (true, true) => (2, 1),
        (true, false) => (1, 2),
        (false, true) => (1, 4),
        (false, false) => (1, 8),
    }
}

/// Whether K's K-steps of 32 chunks (32 elements each) are at least 7/8 full on average.
fn ksteps_filled(k: usize) -> bool {
    let chunks = k.div_ceil(32);
    8 * chunks >= 7 * 32 * chunks.div_ceil(32)
}

/// The launch configuration of a MoE form on the `_moe` kernels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoeColsConfig {
    /// Kernel symbol.
    pub symbol: &'static str,
    /// The tokens' type.
    pub act: XType,
    /// The output's type.
    pub out: OutputDtype,
    /// Scale layout of the weights (and of NVFP4 tokens).
    pub layout: ScaleLayout,
    /// (T, N, K, E): tokens, weight rows, reduction length, experts.
    pub tnke: (usize, usize, usize, usize),
    /// Row tiles, grid and shared memory (no split: the tiles come from the device).
    pub tiling: Tiling,
    /// SMs of the device.
    pub sms: usize,
}

impl MoeColsConfig {
    /// One wave of persistent CTAs (SMs x occupancy with [`MOE_SMEM_BYTES`] of dynamic shared
    /// memory), each taking its share of the (segment, row tile) tiles the device lays out.
    pub fn choose(
        tnke: (usize, usize, usize, usize),
        (act, layout, out): (XType, ScaleLayout, OutputDtype),
        sms: usize,
        occupancy: impl FnOnce(usize) -> usize,
    ) -> Self {
        let (_, n, k, _) = tnke;
        let symbol = moe_symbol(act, layout, out);
        // The row tiles, K-steps and occupancy of the `_cols` tiling; one slice, no plan of tiles.
        let mut tiling = Tiling::choose((n, k, 1), Chunk::B16, (MOE_SMEM_BYTES, 0), 1, sms, occupancy);
        tiling.split = 1;
        tiling.ksteps_per_slice = tiling.ksteps;
        tiling.window_ksteps = 0; // the device sizes each segment's window
        tiling.tiles = 0;
        tiling.tiles_per_cta = 0;
        tiling.grid = sms * tiling.ctas_per_sm;
        tiling.smem_bytes = MOE_SMEM_BYTES;
        Self { symbol, act, out, layout, tnke, tiling, sms }
    }
}

impl fmt::Display for MoeColsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (t, n, k, e) = self.tnke;
        let g = &self.tiling;
        write!(
            f,
            "{} T={t} N={n} K={k} E={e}: {} row tiles x the device's segments of <= 8 rows, {} K-steps, grid {} \
             ({} CTAs/SM x {} SMs), {} B smem",
            self.symbol, g.row_ctas, g.ksteps, g.grid, g.ctas_per_sm, self.sms, g.smem_bytes
        )
    }
}

/// Why the `_moe` kernels cannot take a MoE form of `(T, N, K, E)`, or `None`; `any_rows`: take
/// it whatever its rows per expert (`NVFP4_MOE_GEMV=on`), else as [`takes_by_default`] says. The
/// rule is on T, E and K: the counts are on the device only (a skewed routing, all rows to one
/// expert, streams that expert's weights once per 8 of its rows).
fn rejects((t, n, k, e): (usize, usize, usize, usize), any_rows: bool) -> Option<String> {
    if !k.is_multiple_of(32) {
        return Some(format!("K = {k} is not a multiple of 32"));
    }
    if e > MOE_MAX_EXPERTS {
        return Some(format!("{e} experts: the kernels' table holds {MOE_MAX_EXPERTS}"));
    }
    if !any_rows && !takes_by_default((t, n, k, e)) {
        let bound = match default_share(k) {
            (rows, 1) => format!("{rows} per expert"),
            (_, experts) => format!("one per {experts}"),
        };
        return Some(format!("{t} rows over {e} experts: more than {bound} (K = {k})"));
    }
    // 32-bit offsets: the weights' rows (E x N), one expert's weights, the tokens, the output.
    let fits = |x: Option<usize>| x.is_some_and(|x| i32::try_from(x).is_ok());
    // And the kernels' key of a staged window: 9 x its first row + its rows.
    let ok = fits(e.checked_mul(n))
        && fits(n.checked_mul(k / 2))
        && fits(t.checked_mul(k))
        && fits(t.checked_mul(n))
        && fits(t.checked_mul(9));
    (!ok).then(|| format!("T {t} x N {n} x K {k} x E {e} exceeds the kernels' 32-bit offsets"))
}

/// The family's verdict on a MoE form: 16-bit tokens, or NVFP4 tokens in the weights' scale
/// layout, few rows per expert, while the grouped launch is not forced (`NVFP4_MOE_GEMV` decides
/// first when set).
pub(crate) fn route(op: &OpMeta, facts: &dyn DeviceFacts, overrides: &Overrides) -> Result<Verdict> {
    let Op::MoeGemm { a, b, c, .. } = op else {
        return Ok(Verdict::NotItsOp);
    };
    let act = match a {
        Act::Dense(x) => XType::Dense(x.dtype),
        Act::Nvfp4(x) if x.layout == b.layout => XType::Nvfp4,
        Act::Nvfp4(_) => return Ok(Verdict::Declines("NVFP4 tokens in the weights' scale layout".into())),
    };
    match overrides.moe_gemv {
        Some(false) => return Ok(Verdict::Declines("disabled by NVFP4_MOE_GEMV=off".into())),
        None if overrides.grouped.is_some() => {
            return Ok(Verdict::Declines("the grouped launch is forced (NVFP4_GROUPED_SM90)".into()))
        }
        _ => {}
    }
    let tnke = (a.rows(), b.rows, a.k(), b.l);
    // NVFP4 tokens with K < 64: no grouped launch reads them (and the fallback takes no W4A4 MoE
    // form), so any rows per expert.
    let only_taker = act == XType::Nvfp4 && a.k() < 64;
    if let Some(why) = rejects(tnke, overrides.moe_gemv == Some(true) || only_taker) {
        return Ok(Verdict::Declines(why));
    }
    let out = act.out_or(c.map(|c| c.dtype));
    takes(facts, &GEMV16, |occupancy| {
        let symbol = moe_symbol(act, b.layout, out);
        MoeColsConfig::choose(tnke, (act, b.layout, out), facts.sms(), |smem| occupancy(symbol, smem))
    })
}

impl Plan for MoeColsConfig {
    fn family(&self) -> &'static str {
        "gemv16_moe"
    }
    fn needs(&self) -> WorkspaceNeeds {
        WorkspaceNeeds::default()
    }
    fn bind(&self, k: &dyn Kernels, op: &DeviceOp<'_>, ws: &Workspace) -> Result<Box<dyn Launch>> {
        let Op::MoeGemm { a, b, offsets, alpha, c } = *op else {
            return Err(Error::Invalid(format!("a MoE GEMV plan bound to a {}", op.name())));
        };
        let (t, n, kk, e) = self.tnke;
        let am = a.act_meta();
        if (am.l(), am.rows(), am.k()) != (1, t, kk) || (b.meta.l, b.meta.rows, b.meta.k) != (e, n, kk) {
            return Err(Error::Shape(format!(
                "gemv16 moe: tokens {:?} and weights {:?} do not match (T, N, K, E) = {:?}",
                (am.l(), am.rows(), am.k()),
                b.meta,
                self.tnke
            )));
        }
        let (values, scales, act, nvfp4_layout, keep_a) = match a {
            Act::Dense(x) => (x.addr, 0, XType::Dense(x.dtype), None, x.keep()),
            Act::Nvfp4(x) => (x.values, x.scales, XType::Nvfp4, Some(x.meta.layout), x.keep()),
        };
        if b.meta.layout != self.layout || nvfp4_layout.is_some_and(|l| l != self.layout) {
            return Err(Error::Shape(format!(
                "gemv16 moe: the weights' (and NVFP4 tokens') scales must be {:?}",
                self.layout
            )));
        }
        if (act, c.dtype) != (self.act, self.out) || c.shape != [1, t, n] {
            return Err(Error::Shape(format!(
                "gemv16 moe: a {act:?} input and a {} {:?} output need another plan than {}",
                c.dtype, c.shape, self.symbol
            )));
        }
        if matches!(a, Act::Dense(x) if !x.addr.is_multiple_of(16)) {
            return Err(Error::Invalid("gemv16 moe: the tokens must be 16-byte aligned".into()));
        }
        if offsets.len != e {
            return Err(Error::Shape(format!("gemv16 moe: {} offsets for {e} experts", offsets.len)));
        }
        // The one alpha as the reference forms it; per-expert alphas are formed by the kernel.
        let (one, per_expert) = match alpha {
            MoeAlpha::One(x) => (x, None),
            MoeAlpha::PerExpert(v) if v.len == e => (None, Some(v)),
            MoeAlpha::PerExpert(v) => {
                return Err(Error::Shape(format!("gemv16 moe: {} alphas for {e} experts", v.len)))
            }
        };
        let alpha = match a {
            Act::Nvfp4(x) => product_alpha(one, x, b),
            Act::Dense(_) => f64::from(effective_alpha(one, &a, b)),
        };
        let ops = Operands {
            a: b.values,
            sfa: b.scales,
            b: values,
            sfb: scales,
            c: c.addr,
            alpha,
            keep: [b.keep(), keep_a, c.keep(), offsets.keep()]
                .into_iter()
                .chain([per_expert.and_then(|v| v.keep())])
                .flatten()
                .collect(),
        };
        let moe = MoeOperands {
            offsets: offsets.addr,
            alpha_l: per_expert.map_or(0, |v| v.addr),
            global: [am.global_scale(), b.meta.global_scale],
        };
        to_i32(t, "gemv16 moe: T")?;
        let f = k.function(&GEMV16, self.symbol)?;
        let launch =
            GemvLaunch::new(k.gpu(), (self.symbol, &self.tiling), f, ops, ((n, kk, e), t), ws, ("gemv16 moe", "N"))?;
        Ok(Box::new(launch.with_moe(moe)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::family::Modeled;
    use crate::backend::cuda::route::route as route_op;
    use crate::backend::cuda::sm90::Forced;
    use crate::problem::Shape;

    fn run(counts: Vec<usize>, n: usize, k: usize, layout: ScaleLayout, act: Option<OutputDtype>) -> String {
        let op = Shape::Moe { n, k, counts }.op_meta_in(layout, act);
        match route_op(&op, &Modeled::HOPPER, &Overrides::NONE) {
            Ok(r) => r.to_string(),
            Err(e) => e.to_string(),
        }
    }

    /// Batch-1 to batch-4 decode routings and small weights take the `_moe` kernels in both modes,
    /// and up to 2 rows per expert for K <= 2048; more rows, K % 32 != 0, too many experts and a
    /// forced grouped launch do not, saying why.
    #[test]
    fn decode_routings_route_here() {
        // Qwen3-30B-A3B gate/up, one token's top 8.
        let batch1: Vec<usize> = (0..128).map(|e| usize::from(e % 16 == 3)).collect();
        for act in [Some(OutputDtype::Bf16), Some(OutputDtype::F16), None] {
            for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
                let r = run(batch1.clone(), 1536, 2048, layout, act);
                assert!(r.starts_with("gemv16_moe: gemv16_nvfp4_sm90_"), "{r}");
                assert!(r.contains("_moe T=8 N=1536 K=2048 E=128: 48 row tiles"), "{r}");
            }
        }
        let family = |counts: Vec<usize>, n, k| run(counts, n, k, ScaleLayout::Blocked, Some(OutputDtype::Bf16));
        // K <= 2048: two rows per expert (SPEC §9's 32-token decode of Qwen3-30B-A3B's gate/up
        // included), one per 2 experts for its down projection (K = 768: 3/4 of a K-step).
        assert!(family(vec![2; 128], 1536, 2048).starts_with("gemv16_moe"));
        let r = family([3, 2].repeat(64), 1536, 2048);
        assert!(r.starts_with("grouped") && r.contains("320 rows over 128 experts: more than 2 per expert"), "{r}");
        assert!(family([1, 0].repeat(64), 2048, 768).starts_with("gemv16_moe"));
        let r = family([1, 1, 1, 0].repeat(32), 2048, 768);
        assert!(
            r.starts_with("grouped") && r.contains("96 rows over 128 experts: more than one per 2 (K = 768)"),
            "{r}"
        );
        // Longer K: one row per 4 experts, per 8 with partial K-steps.
        let r = run(vec![8; 8], 4096, 14336, ScaleLayout::Plain, Some(OutputDtype::Bf16));
        assert!(r.starts_with("grouped") && r.contains("64 rows over 8 experts: more than one per 4"), "{r}");
        assert!(takes_by_default((2, 4096, 7168, 8)) && !takes_by_default((3, 4096, 7168, 8)));
        assert!(takes_by_default((1, 4096, 6176, 8)) && !takes_by_default((2, 4096, 6176, 8)));
        let r = run(vec![1; 4], 256, 272, ScaleLayout::Plain, None);
        assert!(r.contains("K = 272 is not a multiple of 32"), "{r}");
        let r = run(vec![1; 600], 256, 256, ScaleLayout::Plain, None);
        assert!(r.contains("600 experts: the kernels' table holds 512"), "{r}");
        // A batch-1 routing the kernels take by default (K = 256: one row per 8 experts) goes to
        // the grouped launch when that is forced.
        let op =
            Shape::Moe { n: 256, k: 256, counts: vec![1, 0, 0, 0, 0, 0, 0, 0] }.op_meta_in(ScaleLayout::Plain, None);
        assert_eq!(route_op(&op, &Modeled::HOPPER, &Overrides::NONE).unwrap().family(), "gemv16_moe");
        let forced = route_op(&op, &Modeled::HOPPER, &Overrides::grouped(Forced::Skeleton)).unwrap();
        assert!(
            forced.family() == "grouped" && forced.to_string().contains("the grouped launch is forced"),
            "{forced}"
        );
        // NVFP4_MOE_GEMV: off sends a decode routing to the grouped launch, on takes any rows per
        // expert (Mixtral's 8), not a K its kernels cannot read.
        let off = route_op(&op, &Modeled::HOPPER, &Overrides::moe_gemv(false)).unwrap();
        assert!(off.family() == "grouped" && off.to_string().contains("NVFP4_MOE_GEMV=off"), "{off}");
        let mixtral = Shape::Moe { n: 4096, k: 14336, counts: vec![8; 8] }.op_meta_in(ScaleLayout::Plain, None);
        assert_eq!(route_op(&mixtral, &Modeled::HOPPER, &Overrides::moe_gemv(true)).unwrap().family(), "gemv16_moe");
        // Plain scales ending on a half word (E x N x K/32 odd) are taken: the kernels read their
        // last pair alone.
        let tail = Shape::Moe { n: 97, k: 32, counts: vec![3] }.op_meta_in(ScaleLayout::Plain, Some(OutputDtype::Bf16));
        assert_eq!(route_op(&tail, &Modeled::HOPPER, &Overrides::moe_gemv(true)).unwrap().family(), "gemv16_moe");
        // W4A4 with K < 64 has no other kernel: any rows per expert.
        let k32 = Shape::Moe { n: 96, k: 32, counts: vec![30, 0, 9] }.op_meta_in(ScaleLayout::Plain, None);
        assert_eq!(route_op(&k32, &Modeled::HOPPER, &Overrides::NONE).unwrap().family(), "gemv16_moe");
        let k48 = Shape::Moe { n: 256, k: 48, counts: vec![1, 2] }.op_meta_in(ScaleLayout::Plain, None);
        let k48 = route_op(&k48, &Modeled::HOPPER, &Overrides::moe_gemv(true)).map(|r| r.family());
        assert_ne!(k48.ok(), Some("gemv16_moe"));
    }

    #[test]
    fn one_wave_of_persistent_ctas_and_the_window() {
        let c = MoeColsConfig::choose(
            (38, 4096, 7168, 32),
            (XType::Dense(OutputDtype::Bf16), ScaleLayout::Blocked, OutputDtype::Bf16),
            132,
            |_| 2,
        );
        assert_eq!(c.symbol, "gemv16_nvfp4_sm90_bf16_blocked_to_bf16_moe");
        let t = &c.tiling;
        assert_eq!((t.row_ctas, t.ksteps, t.split, t.grid, t.smem_bytes), (128, 7, 1, 264, MOE_SMEM_BYTES));
        assert_eq!(t.scratch(4096, 38, 32), WorkspaceNeeds::default());
    }
}
