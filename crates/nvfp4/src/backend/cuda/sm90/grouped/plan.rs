//! The plan of a grouped launch on the skeleton (grouped_gemm_sm90.cu): a pure function of its
//! shape (a list of groups with their own (M, N, K), or the MoE form's tokens, experts, N and K)
//! and the SM count: the tile variant, each group's orientation, the grid and the work table's
//! bound, the workspace it needs, and the rules it must meet.

use std::fmt;

use crate::backend::cuda::device::{Carve, WorkspaceNeeds};
use crate::backend::cuda::kernels::grouped::MAX_SEGMENTS;
use crate::backend::cuda::kernels::sm90::{Op, Variant, XKind, BK, THREADS, VARIANTS};
use crate::backend::cuda::sm90::plan::{fixup_cycles, rejects_for, stage_cycles, Forced, UNIT_OVERHEAD_CYCLES};

/// The shape of a grouped launch.
#[derive(Clone, Debug, PartialEq)]
pub enum GroupedShape {
    /// Groups (M, N, K), each with its own tensors.
    List(Vec<(usize, usize, usize)>),
    /// T tokens, N, K, E experts; the tokens per expert are known on the device only.
    Moe { t: usize, n: usize, k: usize, e: usize },
}

/// The launch configuration of a grouped GEMM.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupedPlan {
    /// Tile variant (one for every group).
    pub variant: Variant,
    /// What every group's X is: NVFP4 (decoded by the pre-pass) or a 16-bit activation (W4A16:
    /// loaded as it is, W always the weights).
    pub x: XKind,
    /// The shape.
    pub shape: GroupedShape,
    /// Per group of a list: W = B (the weights on the wgmma M side), else W = A. MoE: W is
    /// always the experts' weights.
    pub swapped: Vec<bool>,
    /// Persistent CTAs.
    pub grid: usize,
    /// Entries of the work table: every tile group plus one cut per CTA.
    pub max_units: usize,
    /// The cost model's estimate, in SM cycles.
    pub est_cycles: f64,
}

/// Where a grouped plan's scratch lives in its workspace, in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupedScratch {
    /// Each X operand's decoded f16 `[rows, K64]`: (offset, bytes); none with 16-bit activations.
    pub x16: Vec<(usize, usize)>,
    /// The work table and each CTA's first entry.
    pub units: (usize, usize),
    /// See [`Self::units`].
    pub slot_first: (usize, usize),
    /// Two f32 partial tiles per CTA.
    pub partials: (usize, usize),
    /// Scratch bytes and counters (one per CTA).
    pub needs: WorkspaceNeeds,
}

/// Why the skeleton cannot take this grouped launch, or `None`.
pub fn grouped_rejects(shape: &GroupedShape, forced: Option<Forced>) -> Option<String> {
    grouped_rejects_for(shape, XKind::Nvfp4, forced)
}

/// [`grouped_rejects`] for X of kind `x`.
pub fn grouped_rejects_for(shape: &GroupedShape, x: XKind, forced: Option<Forced>) -> Option<String> {
    if forced == Some(Forced::Off) {
        return Some(format!("disabled by {}=off", Forced::var(Op::Grouped)));
    }
    let moe;
    let groups: &[(usize, usize, usize)] = match shape {
        GroupedShape::List(g) => g,
        GroupedShape::Moe { t, n, k, e } => {
            if *e > MAX_SEGMENTS {
                return Some(format!("{e} experts: one launch takes at most {MAX_SEGMENTS}"));
            }
            // The kernels index the tokens [T, K], their decoded copy and the output [T, N] with
            // 32-bit offsets, and one expert's weights [N, K] too; the experts are the weights'
            // batch index (a TMA coordinate of its own, 64-bit scale offsets), never multiplied
            // into a 32-bit offset. So the launch is bounded as one T x N x K GEMM is.
            moe = [(*t, *n, *k)];
            &moe
        }
    };
    if groups.len() > MAX_SEGMENTS {
        return Some(format!("{} groups: one launch takes at most {MAX_SEGMENTS}", groups.len()));
    }
    for &(m, n, k) in groups {
        if let Some(why) = rejects_for(Op::Gemm, x, (m, n, k, 1), None) {
            return Some(why);
        }
        // The table packs k-step ranges in 16 bits.
        if k.div_ceil(BK) > 0xFFFF {
            return Some(format!("K = {k}: at most {} per group", 0xFFFF * BK));
        }
    }
    None
}

/// The variants the heuristic picks from, and its rule: m256n128 when its tile groups fill every
/// SM, else m128n128.
// NOTE: measured on the H200 (`dev_gemm_diag timing grouped:...`, L2 flushed), the cost model's
// stage cycles (fitted to the GEMM on the H100) misjudge the grouped launch: m256n128 151 µs,
// m128n128 171, m128n256 223 on the 8 experts N=4096 K=7168 (176 tile groups of 256 rows);
// m128n128 48.6 µs, m256n64 48.4, m256n128 54.3, m128n256 65 on 2 groups N=3072 K=4096 (60
// tile groups of 256 rows: stream-K cuts each into ~3 pieces); m128n128 31.4, m256n64 34.9 on 2
// groups N=4096 K=1536.
const CHOSEN: [Variant; 2] = [Variant { bm: 256, bn: 128 }, Variant { bm: 128, bn: 128 }];

/// The MoE form at decode sizes: (most routed rows per expert on average, the variant). A token
/// tile far wider than an expert's rows multiplies zeros: 64 rows over 8 experts on m256n128
/// cost as much MMA work as 1024 would. Measured (H200, the peer bench's graph protocol,
/// session 13 run 1, µs for m256n16 / n32 / n64 / the m256n128 of `CHOSEN`): Mixtral-8x7B
/// gate/up, 64 rows over 8 experts, W4A16 200.9 / 217.4 / 255.9 / 408.5; Qwen3-30B-A3B gate/up,
/// 256 rows over 128 experts, 91.6 / 99.4 / 117.3; DeepSeek-V3 gate/up, 38 rows over 32 experts,
/// 165.2 / 176.6 / 207.0 (n16 the fastest on all six decode cases, both modes, at 0.9 to 8 rows
/// per expert). Wider tiles as the rows grow, as the dense plan picks n32 and n64 at M = 32
/// and 64 (not measured on the MoE form between 8 and 32 rows per expert).
const MOE_DECODE: [(usize, Variant); 3] =
    [(8, Variant { bm: 256, bn: 16 }), (16, Variant { bm: 256, bn: 32 }), (32, Variant { bm: 256, bn: 64 })];

/// The decode variant of a MoE launch of `t` routed rows over `e` experts, if any.
fn moe_decode_variant(t: usize, e: usize) -> Option<Variant> {
    MOE_DECODE.iter().find(|(rows, _)| t <= rows * e.max(1)).map(|&(_, v)| v)
}

/// The plan of a grouped launch on `sms` SMs (the variant forced by `NVFP4_GROUPED_SM90`, if any).
pub fn grouped_plan(shape: &GroupedShape, sms: usize, forced: Option<Forced>) -> GroupedPlan {
    grouped_plan_for(shape, XKind::Nvfp4, sms, forced)
}

/// [`grouped_plan`] for X of kind `x`.
pub fn grouped_plan_for(shape: &GroupedShape, x: XKind, sms: usize, forced: Option<Forced>) -> GroupedPlan {
    let only = match (forced, shape) {
        (Some(Forced::Config(v, _, _)), _) => Some(v),
        (_, GroupedShape::Moe { t, e, .. }) => moe_decode_variant(*t, *e),
        _ => None,
    };
    // A list group's larger operand is W, as in a GEMM (with a 16-bit activation A, W is always
    // B); a MoE launch's W is the experts.
    let swapped: Vec<bool> = match shape {
        GroupedShape::List(g) => g.iter().map(|&(m, n, _)| m < n || x != XKind::Nvfp4).collect(),
        GroupedShape::Moe { .. } => Vec::new(),
    };
    let mut best: Option<(GroupedPlan, f64)> = None;
    let only = only.filter(|v| v.instantiated(Op::Grouped, x));
    for v in VARIANTS.into_iter().filter(|v| {
        only.is_none_or(|o| o == *v) && (only.is_some() || CHOSEN.contains(v)) && v.instantiated(Op::Grouped, x)
    }) {
        // (W tiles, X tiles, k-steps) per group; a MoE launch's experts as if their tokens were
        // spread evenly, each ending on a part tile.
        let tiles: Vec<(usize, usize, usize)> = match shape {
            GroupedShape::List(g) => g
                .iter()
                .zip(&swapped)
                .map(|(&(m, n, k), &sw)| {
                    let (w, x) = if sw { (n, m) } else { (m, n) };
                    (w.div_ceil(v.bm), x.div_ceil(v.bn), k.div_ceil(BK))
                })
                .collect(),
            GroupedShape::Moe { t, n, k, e } => {
                vec![(n.div_ceil(v.bm), t.div_ceil(v.bn) + e.div_ceil(2), k.div_ceil(BK))]
            }
        };
        let tile_groups: usize = tiles.iter().map(|&(w, x, _)| w * x).sum();
        let k_steps: usize = tiles.iter().map(|&(w, x, k)| w * x * k).sum();
        let max_units = match shape {
            GroupedShape::List(_) => tile_groups + sms,
            GroupedShape::Moe { t, n, e, .. } => (t.div_ceil(v.bn) + e) * n.div_ceil(v.bm) + sms,
        };
        // Stream-K over the whole launch: the largest share, its units' overheads, one fixup.
        let est = k_steps.div_ceil(sms) as f64 * stage_cycles(v)
            + (tile_groups.div_ceil(sms) + 1) as f64 * UNIT_OVERHEAD_CYCLES
            + fixup_cycles(v, 2);
        // Unforced, the rule of CHOSEN decides (the estimate is still printed).
        let rank = match (only, v.bm, tile_groups >= sms) {
            (Some(_), _, _) => est,
            (None, 256, true) => 0.0,
            (None, 256, false) => f64::INFINITY,
            (None, _, _) => 1.0,
        };
        if best.as_ref().is_none_or(|b| rank < b.1) {
            best = Some((
                GroupedPlan {
                    variant: v,
                    x,
                    shape: shape.clone(),
                    swapped: swapped.clone(),
                    grid: sms,
                    max_units,
                    est_cycles: est,
                },
                rank,
            ));
        }
    }
    best.map(|b| b.0).expect("m128n128 is always a candidate")
}

impl GroupedPlan {
    /// Whether the work table may deal whole waves of tile groups round robin before its
    /// stream-K share (sm90/grouped.cuh): with the prefill tiles (BN >= 128), whose neighbours
    /// share X and W tiles in L2. The decode tiles read their weights once in any order, and
    /// dealt they ran slower (H100, Qwen3-30B-A3B down at 256 rows: 61.9 -> 69.6 µs).
    pub fn deals(&self) -> bool {
        self.variant.bn >= 128
    }
    /// The main kernel's symbol.
    pub fn symbol(&self) -> &'static str {
        self.variant.symbol_for(Op::Grouped, self.x)
    }
    /// Dynamic shared memory of the main kernel.
    pub fn smem_bytes(&self) -> usize {
        self.variant.layout(Op::Grouped, self.x).smem_bytes
    }
    /// Rows and K of each X operand the pre-pass decodes (none: 16-bit activations).
    fn x_operands(&self) -> Vec<(usize, usize)> {
        if self.x != XKind::Nvfp4 {
            return Vec::new();
        }
        match &self.shape {
            GroupedShape::List(g) => {
                g.iter().zip(&self.swapped).map(|(&(m, n, k), &sw)| (if sw { m } else { n }, k)).collect()
            }
            GroupedShape::Moe { t, k, .. } => vec![(*t, *k)],
        }
    }
    /// The workspace it needs.
    pub fn scratch(&self) -> GroupedScratch {
        let mut c = Carve::default();
        let x16 = self
            .x_operands()
            .into_iter()
            .map(|(rows, k)| {
                let bytes = rows * k.div_ceil(BK) * BK * 2;
                (c.take(bytes), bytes)
            })
            .collect();
        let units = self.max_units * std::mem::size_of::<crate::backend::cuda::kernels::grouped::GroupedUnit>();
        let units = (c.take(units), units);
        let slot_first = (c.take((self.grid + 1) * 4), (self.grid + 1) * 4);
        let partials = 2 * self.grid * self.variant.bm * self.variant.bn * 4;
        let partials = (c.take(partials), partials);
        GroupedScratch { x16, units, slot_first, partials, needs: WorkspaceNeeds { bytes: c.0, counters: self.grid } }
    }
}

impl fmt::Display for GroupedPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match &self.shape {
            GroupedShape::List(g) => format!("{} groups", g.len()),
            GroupedShape::Moe { t, n, k, e } => format!("MoE T={t} N={n} K={k} E={e}"),
        };
        let swapped = self.swapped.iter().filter(|&&s| s).count();
        let what = match self.x {
            XKind::Nvfp4 => what,
            XKind::Dense(d) => format!("{what} (W4A16 {d})"),
        };
        write!(
            f,
            "{} {what}: tile {}x{}x{BK}, W = B in {swapped} of {} groups, {}stream-K over {} CTAs x {THREADS}, table <= \
             {} units, smem {} B, est {:.1} kcycles",
            self.symbol(),
            self.variant.bm,
            self.variant.bn,
            self.swapped.len(),
            if self.deals() { "whole waves dealt (from 2 per CTA), then " } else { "" },
            self.grid,
            self.max_units,
            self.smem_bytes(),
            self.est_cycles / 1e3
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench_lists() -> Vec<GroupedShape> {
        let list = |ms: &[usize], n, k| GroupedShape::List(ms.iter().map(|&m| (m, n, k)).collect());
        vec![
            list(&[80, 176, 128, 72, 64, 248, 96, 160], 4096, 7168),
            list(&[40, 76, 168, 72, 164, 148, 196, 160], 7168, 2048),
            list(&[192, 320], 3072, 4096),
            list(&[128, 384], 4096, 1536),
        ]
    }

    #[test]
    fn plans_are_deterministic_and_cover_every_tile() {
        let mut shapes = bench_lists();
        shapes.push(GroupedShape::List(vec![(512, 128, 256), (7, 1, 64), (130, 257, 4096)]));
        shapes.push(GroupedShape::Moe { t: 1024, n: 4096, k: 7168, e: 8 });
        shapes.push(GroupedShape::Moe { t: 1, n: 7, k: 64, e: 3 });
        for s in shapes {
            assert!(grouped_rejects(&s, None).is_none(), "{s:?}");
            let p = grouped_plan(&s, 132, None);
            assert_eq!(p, grouped_plan(&s, 132, None));
            assert_eq!(p.grid, 132);
            let sc = p.scratch();
            assert_eq!(sc.needs.counters, 132);
            assert_eq!(sc.partials.1, 2 * 132 * p.variant.bm * p.variant.bn * 4);
            // The table holds every tile group of the launch and one cut per CTA.
            let tile_groups: usize = match &s {
                GroupedShape::List(g) => g
                    .iter()
                    .zip(&p.swapped)
                    .map(|(&(m, n, _), &sw)| {
                        let (w, x) = if sw { (n, m) } else { (m, n) };
                        w.div_ceil(p.variant.bm) * x.div_ceil(p.variant.bn)
                    })
                    .sum(),
                // Worst case: every expert ends on a part tile.
                GroupedShape::Moe { t, n, e, .. } => (t.div_ceil(p.variant.bn) + e) * n.div_ceil(p.variant.bm),
            };
            assert_eq!(p.max_units, tile_groups + 132, "{p}");
            if let GroupedShape::List(g) = &s {
                assert_eq!(sc.x16.len(), g.len());
                for (&(m, n, k), (&sw, &(_, bytes))) in g.iter().zip(p.swapped.iter().zip(&sc.x16)) {
                    assert_eq!(sw, m < n);
                    assert_eq!(bytes, if sw { m } else { n } * k.div_ceil(64) * 64 * 2);
                }
            }
        }
    }

    /// With 16-bit activations every group's W is its weights, nothing is decoded before the
    /// launch, and the kernel is the W4A16 one of the activations' type.
    #[test]
    fn w4a16_plans() {
        use crate::format::OutputDtype;
        let x = XKind::Dense(OutputDtype::Bf16);
        for s in [
            GroupedShape::List(vec![(512, 128, 256), (7, 1, 64), (130, 257, 4096)]),
            GroupedShape::Moe { t: 1024, n: 4096, k: 7168, e: 8 },
        ] {
            assert_eq!(grouped_rejects_for(&s, x, None), None);
            let p = grouped_plan_for(&s, x, 132, None);
            assert!(p.swapped.iter().all(|&sw| sw), "{p}");
            assert!(p.scratch().x16.is_empty(), "{p}");
            let want = format!("grouped_gemm_w4a16bf16_sm90_ws_m{}n{}", p.variant.bm, p.variant.bn);
            assert_eq!(p.symbol(), want);
            // The rest of the scratch is the W4A4 plan's.
            let q = grouped_plan(&s, 132, None);
            let (ps, qs) = (p.scratch(), q.scratch());
            assert_eq!((ps.units.1, ps.slot_first.1, ps.partials.1), (qs.units.1, qs.slot_first.1, qs.partials.1));
        }
    }

    #[test]
    fn bench_variants() {
        let picks: Vec<Variant> = bench_lists().iter().map(|s| grouped_plan(s, 132, None).variant).collect();
        let (big, small) = (Variant { bm: 256, bn: 128 }, Variant { bm: 128, bn: 128 });
        assert_eq!(picks, [big, big, small, small]);
        let forced = Some(Forced::Config(Variant { bm: 256, bn: 16 }, None, None));
        assert_eq!(grouped_plan(&bench_lists()[0], 132, forced).variant, Variant { bm: 256, bn: 16 });
    }

    /// The MoE form picks a token tile by the routed rows per expert: n16 up to 8 on average
    /// (every SPEC decode case), then n32, n64, then the prefill rule.
    #[test]
    fn moe_decode_tiles() {
        let moe = |t, e| grouped_plan(&GroupedShape::Moe { t, n: 4096, k: 7168, e }, 132, None).variant;
        let v = |bm, bn| Variant { bm, bn };
        for (t, e) in [(64, 8), (256, 128), (38, 32), (30, 32), (1, 3), (512, 128), (0, 8)] {
            assert_eq!(moe(t, e), v(256, 16), "{t} rows over {e}");
        }
        assert_eq!(moe(65, 8), v(256, 32));
        assert_eq!(moe(256, 8), v(256, 64));
        assert_eq!(moe(8192, 8), v(256, 128));
        assert_eq!(moe(16384, 128), v(256, 128));
        // Only the prefill tiles deal whole waves (the decode tiles stream their weights).
        let deals = |t, e| grouped_plan(&GroupedShape::Moe { t, n: 4096, k: 7168, e }, 132, None).deals();
        assert!(!deals(256, 128) && !deals(256, 8) && deals(8192, 8) && deals(16384, 128));
        let x = XKind::Dense(crate::format::OutputDtype::Bf16);
        assert_eq!(
            grouped_plan_for(&GroupedShape::Moe { t: 256, n: 1536, k: 2048, e: 128 }, x, 132, None).variant,
            v(256, 16)
        );
        // A forced variant still wins.
        let forced = Some(Forced::Config(v(128, 128), None, None));
        assert_eq!(
            grouped_plan(&GroupedShape::Moe { t: 64, n: 4096, k: 7168, e: 8 }, 132, forced).variant,
            v(128, 128)
        );
    }

    #[test]
    fn rejects_what_the_kernel_cannot_take() {
        let list = |g: Vec<(usize, usize, usize)>| GroupedShape::List(g);
        assert!(grouped_rejects(&list(vec![(64, 64, 48)]), None).is_some());
        assert!(grouped_rejects(&list(vec![(64, 64, 256), (8, 8, 16)]), None).is_some());
        assert!(grouped_rejects(&list(vec![(64, 64, 256); MAX_SEGMENTS + 1]), None).is_some());
        assert!(grouped_rejects(&list(vec![(64, 64, 256)]), Some(Forced::Off)).is_some());
        assert!(grouped_rejects(&GroupedShape::Moe { t: 8, n: 8, k: 256, e: MAX_SEGMENTS + 1 }, None).is_some());
        assert!(grouped_rejects(&GroupedShape::Moe { t: 8, n: 1 << 20, k: 1 << 14, e: 512 }, None).is_some());
        assert!(grouped_rejects(&GroupedShape::Moe { t: 8, n: 8, k: 256, e: MAX_SEGMENTS }, None).is_none());
    }

    /// Expert projections of real MoE models at prefill sizes fit the kernels' indexing: the
    /// experts multiply no 32-bit offset, only the tokens, their outputs and one expert do.
    #[test]
    fn moe_prefill_sizes_of_real_models_are_taken() {
        let taken = [
            (16384, 1536, 2048, 128), // Qwen3-30B-A3B gate/up at 2048 tokens, top-8
            (16384, 2048, 768, 128),  // its down projection
            (65536, 7168, 2048, 256), // DeepSeek-V3's down projection, 256 experts
            (65536, 4096, 7168, 256), // its gate/up projection
            (65536, 4096, 7168, MAX_SEGMENTS),
        ];
        for (t, n, k, e) in taken {
            let s = GroupedShape::Moe { t, n, k, e };
            assert_eq!(grouped_rejects(&s, None), None, "{s:?}");
            let p = grouped_plan(&s, 132, None);
            assert!(i32::try_from(p.max_units).is_ok() && i32::try_from(p.scratch().needs.bytes).is_ok(), "{p}");
        }
        // What does not fit: an output [T, N] or tokens [T, K] past 2^31 elements, one expert of
        // more than 2^31 bytes.
        for (t, n, k) in [(1 << 20, 4096, 256), (1 << 18, 256, 1 << 14), (8, 1 << 19, 1 << 13)] {
            assert!(grouped_rejects(&GroupedShape::Moe { t, n, k, e: 2 }, None).is_some(), "{t} {n} {k}");
        }
    }
}
