//! The plan of a skeleton launch: a pure function of the operation, its shape and the SM count
//! (no GPU), printable, deterministic. It picks which GEMM operand plays W (the larger one, so
//! for small M the weights run on the wgmma M side; a dual GEMM's W is always B1 and B2), the
//! tile variant and how K is shared among CTAs (split-K or stream-K), from a small cost model of
//! the SM (tensor-core cycles, decode issue cycles, waves, split-K fixup). CTA pairs that share X
//! by TMA multicast exist as a forced option.

use std::fmt;

use crate::backend::cuda::device::{Carve, WorkspaceNeeds};
use crate::backend::cuda::kernels::sm90::{Layout, Op, Variant, XKind, BK, VARIANTS};

/// Most K slices per tile.
pub const MAX_SPLIT: usize = 16;

/// How a plan shares K among CTAs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// Every tile in this many K slices, one work unit each, units dealt round-robin.
    Split(usize),
    /// Stream-K: the grid shares all tiles' k-steps evenly; a tile's pieces are summed by the CTA
    /// that finishes last.
    StreamK,
    /// Split-K in this many pieces with one unit per CTA, the pieces of a tile in one cluster,
    /// summed in the first CTA's shared memory (no workspace). Only when forced: it measured no
    /// faster than the workspace sum (H200, NOTES.md).
    SplitInCluster(usize),
}

/// A forced choice (tuning and tests), as `NVFP4_GEMM_SM90`, `NVFP4_DUAL_SM90` or
/// `NVFP4_GROUPED_SM90` write it ([`Overrides`](crate::backend::cuda::Overrides)): `off` sends
/// every problem of that operation to the fallback kernel; `small` every GEMM to the one-launch
/// small kernel (`backend/cuda/small.rs`; GEMM only); `sm90` every problem the skeleton takes to
/// the skeleton with its own plan (no small kernel); `m256n64` forces a variant, then
/// optionally `c1` or `c2` the cluster size, and `s3` a split, `s3d` a split summed in clusters
/// of 3 CTAs, or `sk` stream-K: `m128n128c2sk`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forced {
    /// The skeleton takes no problem.
    Off,
    /// The small kernel takes every GEMM (the skeleton none).
    Small,
    /// The skeleton with its own plan wherever it takes the shape (never the small kernel).
    Skeleton,
    /// This variant, and this cluster size and schedule if given and legal.
    Config(Variant, Option<usize>, Option<Schedule>),
}

impl Forced {
    /// Parses the variable's value; `None` when it names nothing known.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "off" => return Some(Forced::Off),
            "small" => return Some(Forced::Small),
            "sm90" => return Some(Forced::Skeleton),
            _ => {}
        }
        let (name, split) = match s.split_once('s') {
            Some((v, "k")) => (v, Some(Schedule::StreamK)),
            Some((v, sp)) => match sp.strip_suffix('d') {
                Some(d) => (v, Some(Schedule::SplitInCluster(d.parse().ok()?))),
                None => (v, Some(Schedule::Split(sp.parse().ok()?))),
            },
            None => (s, None),
        };
        let (name, cluster) = match name.split_once('c') {
            Some((v, "1")) => (v, Some(1)),
            Some((v, "2")) => (v, Some(2)),
            Some(_) => return None,
            None => (name, None),
        };
        let v = VARIANTS.into_iter().find(|v| format!("m{}n{}", v.bm, v.bn) == name)?;
        Some(Forced::Config(v, cluster, split))
    }

    /// The variable that forces `op`.
    pub fn var(op: Op) -> &'static str {
        match op {
            Op::Gemm => "NVFP4_GEMM_SM90",
            Op::Dual => "NVFP4_DUAL_SM90",
            Op::Grouped => "NVFP4_GROUPED_SM90",
        }
    }
}

/// Why the skeleton cannot take a problem of `op` with this shape (the caller falls back to the
/// general kernel), or `None`. `forced` is the operation's forced choice.
pub fn rejects(op: Op, mnkl: (usize, usize, usize, usize), forced: Option<Forced>) -> Option<String> {
    rejects_for(op, XKind::Nvfp4, mnkl, forced)
}

/// [`rejects`] for X of kind `x`: a 16-bit activation needs the same K alignment (the weights'
/// 16-byte TMA rows), and no decoded copy of X to index.
pub fn rejects_for(
    op: Op,
    x: XKind,
    (m, n, k, l): (usize, usize, usize, usize),
    forced: Option<Forced>,
) -> Option<String> {
    match forced {
        Some(Forced::Off) => return Some(format!("disabled by {}=off", Forced::var(op))),
        Some(Forced::Small) => return Some(format!("disabled by {}=small", Forced::var(op))),
        _ => {}
    }
    if !k.is_multiple_of(32) || k < BK {
        return Some(format!("K = {k}: TMA needs 16-byte row strides (K % 32 == 0) and K >= {BK}"));
    }
    let fits = |x: Option<usize>| x.is_some_and(|x| x <= i32::MAX as usize);
    let w = n.checked_mul(op.parts());
    // The X pre-pass indexes its f16 output ([L, rows, K padded to 64]) with 32-bit offsets, the
    // epilogue the output.
    let x16 = match x {
        XKind::Nvfp4 => m.max(n).checked_mul(k.next_multiple_of(BK)).and_then(|x| x.checked_mul(l)),
        XKind::Dense(_) => Some(0),
    };
    if !fits(l.checked_mul(m).and_then(|x| x.checked_mul(n)))
        || !fits(w.and_then(|w| w.max(m).checked_mul(k / 2)))
        || !fits(x16)
    {
        return Some(format!("{m}x{n}x{k}x{l} exceeds 32-bit indexing"));
    }
    None
}

/// The launch configuration of one problem.
#[derive(Clone, Debug, PartialEq)]
pub struct Sm90Plan {
    /// The operation.
    pub op: Op,
    /// What X is: NVFP4 (decoded by the pre-pass) or a 16-bit activation (W4A16, one launch).
    pub x: XKind,
    /// Tile variant.
    pub variant: Variant,
    /// (M, N, K, L).
    pub mnkl: (usize, usize, usize, usize),
    /// W = B (and B2) and X = A (weights on the wgmma M side), else W = A and X = B. Always
    /// with a 16-bit activation A.
    pub swapped: bool,
    /// Tiles along W and X.
    pub tiles: (usize, usize),
    /// CTAs per cluster: 2 pairs W tiles that share each X sub-stage by TMA multicast.
    pub cluster: usize,
    /// Split-K with one unit per CTA only: the CTAs of a cluster of this many hold the K pieces
    /// of one tile and sum them in the first one's shared memory (1: no such cluster; the
    /// pieces go through the workspace).
    pub kcluster: usize,
    /// Split-K or stream-K.
    pub schedule: Schedule,
    /// K slices per tile (split-K), or the most pieces of any tile (stream-K): the workspace's
    /// partial tiles per tile.
    pub split: usize,
    /// 64-element k-steps in K, and per slice (split-K) or per CTA, rounded up (stream-K).
    pub k_iters: usize,
    /// See [`Self::k_iters`].
    pub iters_per_split: usize,
    /// Work units (tile groups x split; stream-K: tile groups) and persistent CTAs; a tile group
    /// is `cluster` W tiles of one X tile and batch.
    pub units: usize,
    /// See [`Self::units`].
    pub grid: usize,
    /// The cost model's estimate, in SM cycles.
    pub est_cycles: f64,
    /// The caller forced its variant (an override): nothing may choose another at bind time.
    pub forced: bool,
}

/// Where a plan's scratch lives in its workspace, in bytes, and its counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sm90Scratch {
    /// Decoded X, `[L, x_rows, K64]` f16: (offset, bytes).
    pub x16: (usize, usize),
    /// Split-K partial tiles, `[tiles, split, BM * BN]` f32 (empty without split).
    pub partials: (usize, usize),
    /// Scratch bytes and arrival counters (one per tile with split > 1) the workspace must hold.
    pub needs: WorkspaceNeeds,
}

impl Sm90Plan {
    /// Rows of each W part, and X rows.
    pub fn wx_rows(&self) -> (usize, usize) {
        let (m, n, _, _) = self.mnkl;
        if self.swapped {
            (n, m)
        } else {
            (m, n)
        }
    }
    /// The variant's shared-memory carve-up.
    pub fn layout(&self) -> Layout {
        self.variant.layout(self.op, self.x)
    }
    /// The kernel symbol.
    pub fn symbol(&self) -> &'static str {
        self.variant.symbol_for(self.op, self.x)
    }
    /// CTAs per launched cluster (1: no cluster).
    pub fn launch_cluster(&self) -> usize {
        self.cluster.max(self.kcluster)
    }
    /// The pieces of split tiles are summed through the workspace (partials and counters).
    pub fn global_fixup(&self) -> bool {
        self.split > 1 && self.kcluster == 1
    }
    /// The workspace it needs.
    pub fn scratch(&self) -> Sm90Scratch {
        let (_, x_rows) = self.wx_rows();
        let l = self.mnkl.3;
        let tiles = self.tiles.0 * self.tiles.1 * l;
        let mut c = Carve::default();
        let x16 = if self.x == XKind::Nvfp4 { l * x_rows * self.k_iters * BK * 2 } else { 0 };
        let partials = if self.global_fixup() { tiles * self.split * self.variant.bm * self.variant.bn * 4 } else { 0 };
        let (xo, po) = (c.take(x16), c.take(partials));
        let counters = if self.global_fixup() { tiles } else { 0 };
        Sm90Scratch { x16: (xo, x16), partials: (po, partials), needs: WorkspaceNeeds { bytes: c.0, counters } }
    }
}

impl fmt::Display for Sm90Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (m, n, k, l) = self.mnkl;
        let (v, lay) = (self.variant, self.layout());
        let w = match (self.op, self.swapped, self.x) {
            (Op::Dual, _, _) => "B1|B2",
            (Op::Gemm | Op::Grouped, true, XKind::Nvfp4) => "B (swap AB)",
            (Op::Gemm | Op::Grouped, _, XKind::Dense(_)) => "B (X = the 16-bit A)",
            (Op::Gemm | Op::Grouped, false, XKind::Nvfp4) => "A",
        };
        write!(
            f,
            "{} {m}x{n}x{k}x{l}: W = {w}, tile {}x{}x{BK}, stages {}+{}, tiles {}x{}, cluster {}, {} {}{} ({} of \
             {} k-steps), {} units on {} CTAs x {}, smem {} B, est {:.1} kcycles",
            self.symbol(),
            v.bm,
            v.bn,
            lay.raw_stages,
            lay.x_stages,
            self.tiles.0,
            self.tiles.1,
            self.cluster,
            if self.schedule == Schedule::StreamK { "stream-K, pieces <=" } else { "split" },
            self.split,
            if self.kcluster > 1 { " summed in clusters" } else { "" },
            self.iters_per_split,
            self.k_iters,
            self.units,
            self.grid,
            crate::backend::cuda::kernels::sm90::THREADS,
            lay.smem_bytes,
            self.est_cycles / 1e3
        )
    }
}

// Cost model (SM cycles per 64-K sub-stage), fitted to `dev_gemm_diag timing` on the H100:
// tensor cycles at 2048 f16 FMA per cycle and ~78% of that at best (the m128n256 variant on
// 8192³), or the consumers' issue- and latency-bound time when that is longer: ~950 cycles with
// one m64 tile per warpgroup (it decodes 2 W rows per thread; 0.47 µs at 1.98 GHz), ~2400 with
// two. Split-K partials move at about 48 B per cycle per SM through L2 (each slice writes its
// tile, the last one reads the others). A dual GEMM's tile costs what a GEMM tile of the same
// W rows does.
const FMA_PER_CYCLE: f64 = 2048.0;
const MMA_EFFICIENCY: f64 = 0.78;
const ISSUE_CYCLES_PER_MTILE: [f64; 2] = [950.0, 2400.0];
pub(super) const UNIT_OVERHEAD_CYCLES: f64 = 2500.0;
const PARTIAL_BYTES_PER_CYCLE: f64 = 48.0;
// The cluster sum moves the pieces 1.. through distributed shared memory, with no L2 round trip
// in series (an estimate, not fitted).
const DSMEM_BYTES_PER_CYCLE: f64 = 128.0;
/// Most CTAs per cluster of the cluster sum of K pieces (the portable cluster size is 8).
pub const MAX_KCLUSTER: usize = 4;

/// SM cycles per 64-K sub-stage of variant `v`.
pub(super) fn stage_cycles(v: Variant) -> f64 {
    let mma = (v.bm * v.bn * BK) as f64 / FMA_PER_CYCLE / MMA_EFFICIENCY;
    mma.max(ISSUE_CYCLES_PER_MTILE[v.bm / 128 - 1])
}

/// Summing a tile cut into `pieces` K pieces: every piece's f32 partial through L2.
pub(super) fn fixup_cycles(v: Variant, pieces: usize) -> f64 {
    if pieces > 1 {
        (pieces * v.bm * v.bn * 4) as f64 / PARTIAL_BYTES_PER_CYCLE
    } else {
        0.0
    }
}

/// Summing a tile's `pieces` in a cluster: pieces 1.. into the first CTA's shared memory.
fn cluster_fixup_cycles(v: Variant, pieces: usize) -> f64 {
    ((pieces - 1) * v.bm * v.bn * 4) as f64 / DSMEM_BYTES_PER_CYCLE
}

/// Split-K: `units` units of `ips` sub-stages dealt round-robin over `slots` cluster slots,
/// pieces summed in clusters (`kcluster`) or through the workspace.
fn cost_split(v: Variant, units: usize, split: usize, ips: usize, slots: usize, kcluster: bool) -> f64 {
    let rounds = units.div_ceil(units.min(slots)) as f64;
    let fixup = if kcluster { cluster_fixup_cycles(v, split) } else { fixup_cycles(v, split) };
    rounds * (ips as f64 * stage_cycles(v) + UNIT_OVERHEAD_CYCLES) + fixup
}

/// Whether the pieces of a split-K plan can be summed in clusters of `split` CTAs: a GEMM variant
/// with fewer than 128 accumulators per thread (sm90/kreduce.cuh's `KCLUSTER_FITS`: the others
/// spilled), one unit per CTA (`units <= slots`), a cluster the GPU can form, and the other
/// pieces' f32 tiles fitting in the first CTA's rings.
pub fn kcluster_ok(op: Op, x: XKind, v: Variant, split: usize, units: usize, slots: usize) -> bool {
    op == Op::Gemm
        && (v.bm / 128) * v.bn / 2 < 128
        && (2..=MAX_KCLUSTER).contains(&split)
        && units <= slots
        && (split - 1) * v.bm * v.bn * 4 <= v.layout(op, x).bar_off
}

/// Stream-K over `slots` cluster slots: the slot with the largest share, its pieces' overheads,
/// and the fixup of the tiles split into `pieces` (at most).
fn cost_stream(v: Variant, groups: usize, k_iters: usize, slots: usize, pieces: usize) -> f64 {
    let share = (groups * k_iters).div_ceil(slots);
    let units_per_slot = share.div_ceil(k_iters) + 1;
    share as f64 * stage_cycles(v) + units_per_slot as f64 * UNIT_OVERHEAD_CYCLES + fixup_cycles(v, pieces)
}

/// Stream-K's slots for `groups` tile groups of `k_iters` k-steps on `slots` cluster slots (every
/// slot non-empty), and the most pieces any group is cut into (mirrors `stream_owner` of the
/// kernel's scheduler).
pub fn stream_k_shape(groups: usize, k_iters: usize, slots: usize) -> (usize, usize) {
    let total = groups * k_iters;
    // At least 1/8 of a tile per slot keeps a tile's pieces (partials in the workspace) few.
    let slots = slots.min(total).min(groups * 8);
    let owner = |i: usize| ((i + 1) * slots - 1) / total;
    let pieces = (0..groups).map(|t| owner((t + 1) * k_iters - 1) - owner(t * k_iters) + 1).max().unwrap_or(1);
    (slots, pieces)
}

/// The plan for `op` on (M, N, K, L) with `sms` SMs, restricted to a forced variant (and cluster
/// and schedule, when legal). Deterministic.
pub fn plan(op: Op, mnkl: (usize, usize, usize, usize), sms: usize, forced: Option<Forced>) -> Sm90Plan {
    plan_for(op, XKind::Nvfp4, mnkl, sms, forced)
}

/// [`plan`] for X of kind `x`.
// NOTE: the cost model is the W4A4 kernels' (fitted on the H100); the W4A16 decode costs more
// issue slots per element (it gathers its bytes and converts 4 scales per sub-stage, not 1).
pub fn plan_for(
    op: Op,
    x: XKind,
    (m, n, k, l): (usize, usize, usize, usize),
    sms: usize,
    forced: Option<Forced>,
) -> Sm90Plan {
    // The larger operand runs on the wgmma M side (decoded once per X tile, in registers); the
    // smaller one is decoded once per launch by the pre-pass. Both parts of a dual GEMM are W;
    // with a 16-bit activation A, W is always the weights B.
    let swapped = op == Op::Dual || m < n || x != XKind::Nvfp4;
    let (w_rows, x_rows) = if swapped { (n, m) } else { (m, n) };
    let k_iters = k.div_ceil(BK);
    let mut best: Option<Sm90Plan> = None;
    // A forced variant without a kernel for this X (Variant::instantiated) is not forced.
    let (only, forced_cluster, forced_schedule) = match forced {
        Some(Forced::Config(v, c, s)) if v.instantiated(op, x) => (Some(v), c, s),
        _ => (None, None, None),
    };
    let mut consider = |c: Sm90Plan| {
        if best.as_ref().is_none_or(|b| c.est_cycles < b.est_cycles) {
            best = Some(c);
        }
    };
    for v in VARIANTS {
        // Skip X tiles much wider than the X operand (a smaller variant covers it).
        let too_wide = v.bn > 16 && v.bn / 2 >= x_rows.next_multiple_of(16);
        if only.map_or(too_wide, |o| o != v) || !v.instantiated(op, x) {
            continue;
        }
        for cluster in [1, 2] {
            let tiles_w = w_rows.div_ceil(v.bm / op.parts());
            // Pairs need two W tiles, and the X tile's rows split evenly in 8-row swizzle groups.
            // NOTE: pairs only when forced: halving the L2 reads of X measured no faster on the
            // H100 (the bench shapes are not L2-bound); they stay for other GPUs and kernels.
            let paired_ok = tiles_w >= 2 && v.bn % 16 == 0 && forced_cluster == Some(2);
            if forced_cluster.is_some_and(|c| c != cluster) || (cluster > 1 && !paired_ok) {
                continue;
            }
            let tiles_wx = (tiles_w.next_multiple_of(cluster), x_rows.div_ceil(v.bn));
            let groups = tiles_wx.0 / cluster * tiles_wx.1 * l;
            let slots = sms / cluster;
            let config = |schedule, split, kcluster, iters_per_split, units, slots: usize, est: f64| Sm90Plan {
                op,
                x,
                variant: v,
                mnkl: (m, n, k, l),
                swapped,
                tiles: tiles_wx,
                cluster,
                kcluster,
                schedule,
                split,
                k_iters,
                iters_per_split,
                units,
                grid: slots * cluster,
                est_cycles: est,
                forced: only.is_some(),
            };
            for split in 1..=MAX_SPLIT.min(k_iters) {
                // Slices start on TMA-stage boundaries (4 sub-stages) when that keeps them all
                // non-empty: a slice starting inside one loads sub-stages it does not use.
                let even = k_iters.div_ceil(split);
                let aligned = even.next_multiple_of(4);
                let ips = if (split - 1) * aligned < k_iters { aligned } else { even };
                // Every slice must be non-empty, and split-K only to fill idle SMs.
                let legal = (split - 1) * ips < k_iters;
                let in_cluster = forced_schedule == Some(Schedule::SplitInCluster(split));
                let wanted = match forced_schedule {
                    Some(f) => f == Schedule::Split(split) || in_cluster,
                    None => split == 1 || groups * split <= slots,
                };
                if legal && wanted {
                    let units = groups * split;
                    // Summed in clusters only when forced and possible (else the workspace sum).
                    let kc = in_cluster && cluster == 1 && kcluster_ok(op, x, v, split, units, slots);
                    let est = cost_split(v, units, split, ips, slots, kc);
                    let (schedule, kcluster) =
                        if kc { (Schedule::SplitInCluster(split), split) } else { (Schedule::Split(split), 1) };
                    consider(config(schedule, split, kcluster, ips, units, units.min(slots), est));
                }
            }
            // Stream-K for a single partial wave of tile groups (its workspace holds every split
            // tile).
            let (stream_slots, pieces) = stream_k_shape(groups, k_iters, slots);
            let wanted = forced_schedule.is_none_or(|f| f == Schedule::StreamK);
            if wanted && groups < slots && pieces > 1 && pieces <= MAX_SPLIT {
                let est = cost_stream(v, groups, k_iters, stream_slots, pieces);
                let ips = (groups * k_iters).div_ceil(stream_slots);
                consider(config(Schedule::StreamK, pieces, 1, ips, groups, stream_slots, est));
            }
        }
    }
    match best {
        Some(b) => b,
        // A forced cluster or schedule that is not legal for this shape: the forced variant's
        // best configuration.
        None => plan_for(op, x, (m, n, k, l), sms, only.map(|v| Forced::Config(v, None, None))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::kernels::sm90::SMEM_CAP;

    #[test]
    fn plans_are_deterministic_and_legal() {
        for op in [Op::Gemm, Op::Dual] {
            for &mnkl in &[
                (128, 7168, 16384, 1),
                (128, 4096, 7168, 1),
                (128, 7168, 2048, 1),
                (4096, 4096, 4096, 1),
                (8192, 8192, 8192, 1),
                (256, 4096, 7168, 1),
                (512, 3072, 7168, 1),
                (7168, 384, 2304, 1),
                (1, 7, 256, 3),
                (257, 130, 256, 1),
            ] {
                let c = plan(op, mnkl, 132, None);
                assert_eq!(c, plan(op, mnkl, 132, None));
                assert!(c.grid <= 132 && c.grid >= 1);
                assert!(c.grid.is_multiple_of(c.cluster) && c.tiles.0.is_multiple_of(c.cluster), "{c}");
                assert!(c.layout().smem_bytes <= SMEM_CAP);
                let slots = 132 / c.cluster;
                match c.schedule {
                    Schedule::Split(split) | Schedule::SplitInCluster(split) => {
                        assert_eq!(split, c.split);
                        assert!((c.split - 1) * c.iters_per_split < c.k_iters, "{c}");
                        assert!(c.split == 1 || c.units <= slots, "{c}");
                    }
                    Schedule::StreamK => {
                        assert!(c.units < slots && c.grid / c.cluster <= c.units * c.k_iters, "{c}")
                    }
                }
                // Every output row is covered by the W tiles.
                let (w, x) = c.wx_rows();
                assert!(c.tiles.0 * c.variant.bm / op.parts() >= w && c.tiles.1 * c.variant.bn >= x, "{c}");
                match op {
                    Op::Dual => assert!(c.swapped && c.symbol().starts_with("dual_gemm_nvfp4_sm90_ws_"), "{c}"),
                    _ => assert!(w >= x, "{c}"),
                }
                let s = c.scratch();
                assert!(s.x16.1 >= mnkl.3 * x * mnkl.2 * 2 && s.needs.bytes >= s.partials.0 + s.partials.1);
                assert_eq!(s.partials.1 > 0, c.global_fixup());
                assert_eq!(s.needs.counters, if c.global_fixup() { c.tiles.0 * c.tiles.1 * mnkl.3 } else { 0 });
                // A cluster sum: one unit per CTA, the tile's pieces in one cluster, no pairs.
                if c.kcluster > 1 {
                    assert!(c.kcluster == c.split && c.cluster == 1 && c.units == c.grid, "{c}");
                    assert!(c.grid.is_multiple_of(c.kcluster) && c.kcluster <= MAX_KCLUSTER, "{c}");
                }
            }
        }
        // Small M: weights on the wgmma M side, all tokens in one X tile.
        let c = plan(Op::Gemm, (128, 7168, 16384, 1), 132, None);
        assert!(c.swapped && c.variant.bn == 128, "{c}");
        // A dual tile of 128 W rows covers 64 output columns of each product.
        let c =
            plan(Op::Dual, (256, 4096, 7168, 1), 132, Some(Forced::Config(Variant { bm: 128, bn: 256 }, None, None)));
        assert_eq!(c.tiles, (64, 1), "{c}");
    }

    #[test]
    fn forced_configs() {
        assert_eq!(Forced::parse("off"), Some(Forced::Off));
        assert_eq!(Forced::parse("small"), Some(Forced::Small));
        assert_eq!(Forced::parse("sm90"), Some(Forced::Skeleton));
        let v = Variant { bm: 256, bn: 64 };
        assert_eq!(Forced::parse("m256n64"), Some(Forced::Config(v, None, None)));
        assert_eq!(Forced::parse("m256n64s3"), Some(Forced::Config(v, None, Some(Schedule::Split(3)))));
        assert_eq!(Forced::parse("m256n64sk"), Some(Forced::Config(v, None, Some(Schedule::StreamK))));
        assert_eq!(Forced::parse("m256n64c2"), Some(Forced::Config(v, Some(2), None)));
        assert_eq!(Forced::parse("m256n64c1s3"), Some(Forced::Config(v, Some(1), Some(Schedule::Split(3)))));
        assert_eq!(Forced::parse("m256n64c2sk"), Some(Forced::Config(v, Some(2), Some(Schedule::StreamK))));
        assert_eq!(Forced::parse("m256n64sx"), None);
        assert_eq!(Forced::parse("m256n64c3"), None);
        assert_eq!(Forced::parse("m100n64"), None);
        let shape = (128, 4096, 7168, 1);
        let c = plan(Op::Gemm, shape, 132, Some(Forced::Config(v, Some(1), Some(Schedule::Split(3)))));
        assert_eq!((c.variant, c.cluster, c.schedule, c.split), (v, 1, Schedule::Split(3), 3));
        let c = plan(Op::Gemm, shape, 132, Some(Forced::Config(v, Some(1), Some(Schedule::StreamK))));
        assert_eq!((c.variant, c.schedule, c.grid), (v, Schedule::StreamK, 132));
        // Pairs: 16 x 2 tiles make 16 groups; stream-K over the 66 pair slots.
        let c = plan(Op::Gemm, shape, 132, Some(Forced::Config(v, Some(2), Some(Schedule::StreamK))));
        assert_eq!((c.cluster, c.units, c.grid), (2, 16, 132), "{c}");
        // One W tile cannot pair: the variant's best unpaired configuration instead.
        let c = plan(Op::Gemm, (128, 200, 256, 1), 132, Some(Forced::Config(v, Some(2), None)));
        assert_eq!((c.variant, c.cluster), (v, 1));
        // Split-K summed in clusters, when forced: one unit per CTA, no workspace.
        assert_eq!(Forced::parse("m256n64s3d"), Some(Forced::Config(v, None, Some(Schedule::SplitInCluster(3)))));
        let m128 = Variant { bm: 128, bn: 128 };
        let in_cluster = |s| Some(Forced::Config(m128, None, Some(Schedule::SplitInCluster(s))));
        let c = plan(Op::Gemm, shape, 132, in_cluster(4));
        assert_eq!(
            (c.schedule, c.kcluster, c.launch_cluster(), c.global_fixup()),
            (Schedule::SplitInCluster(4), 4, 4, false)
        );
        assert_eq!(c.scratch().needs.counters, 0);
        let c = plan(Op::Gemm, shape, 132, Some(Forced::Config(m128, None, Some(Schedule::Split(4)))));
        assert_eq!((c.kcluster, c.launch_cluster(), c.global_fixup()), (1, 1, true), "{c}");
        // Not for more than 4 pieces, nor for the dual GEMM, nor with 128 accumulators per thread:
        // the workspace sum of the same split instead.
        let c = plan(Op::Gemm, (128, 1024, 7168, 1), 132, in_cluster(8));
        assert_eq!((c.schedule, c.kcluster), (Schedule::Split(8), 1), "{c}");
        let c = plan(Op::Dual, shape, 132, in_cluster(2));
        assert_eq!((c.schedule, c.kcluster), (Schedule::Split(2), 1), "{c}");
        let wide = Variant { bm: 128, bn: 256 };
        let c = plan(
            Op::Gemm,
            (256, 4096, 7168, 1),
            132,
            Some(Forced::Config(wide, None, Some(Schedule::SplitInCluster(2)))),
        );
        assert_eq!((c.schedule, c.kcluster), (Schedule::Split(2), 1), "{c}");
        // Never chosen unforced.
        let c = plan(Op::Gemm, (128, 7168, 2048, 1), 132, None);
        assert_eq!((c.variant, c.schedule, c.kcluster), (m128, Schedule::Split(2), 1), "{c}");
        // Split 16 of 4 k-steps is not legal: the variant's own best split instead.
        let c = plan(Op::Gemm, (128, 4096, 256, 1), 132, Some(Forced::Config(v, None, Some(Schedule::Split(16)))));
        assert_eq!(c.variant, v);
        assert!((c.split - 1) * c.iters_per_split < c.k_iters);
    }

    /// The kernel's stream-K walk, replayed on the host: every CTA gets a non-empty share, every
    /// k-step of every tile is covered once, and the piece counts match `stream_k_shape`.
    #[test]
    fn stream_k_shares_cover_every_stage_once() {
        for &(tiles, k_iters, sms) in &[
            (56, 256, 132),
            (32, 112, 132),
            (56, 32, 132),
            (1, 1, 132),
            (3, 5, 132),
            (131, 2, 132),
            (3, 64, 132),
            (9, 3, 132),
        ] {
            let (grid, pieces) = stream_k_shape(tiles, k_iters, sms);
            let total = tiles * k_iters;
            assert_eq!(grid, sms.min(total).min(tiles * 8));
            assert!(pieces <= 10);
            let first = |c: usize| c * total / grid;
            let mut seen = vec![0u32; total];
            let mut per_tile = vec![Vec::new(); tiles];
            for c in 0..grid {
                assert!(first(c) < first(c + 1), "CTA {c} of {grid} has no stage");
                let mut u = first(c);
                while u < first(c + 1) {
                    let t = u / k_iters;
                    let k1 = (t * k_iters + k_iters).min(first(c + 1));
                    (u..k1).for_each(|i| seen[i] += 1);
                    per_tile[t].push(c);
                    u = k1;
                }
            }
            assert!(seen.iter().all(|&x| x == 1));
            let owner = |i: usize| ((i + 1) * grid - 1) / total;
            for (t, ctas) in per_tile.iter().enumerate() {
                let lo = owner(t * k_iters);
                let expect: Vec<usize> = (lo..=owner(t * k_iters + k_iters - 1)).collect();
                assert_eq!(*ctas, expect, "tile {t}");
            }
            assert_eq!(pieces, per_tile.iter().map(Vec::len).max().unwrap());
        }
    }

    /// With a 16-bit activation the weights are always W (also for large M), there is no
    /// decoded X to hold, and the kernel is the W4A16 one of the activation's type.
    #[test]
    fn w4a16_plans() {
        use crate::format::OutputDtype;
        for dtype in [OutputDtype::Bf16, OutputDtype::F16] {
            let x = XKind::Dense(dtype);
            for op in [Op::Gemm, Op::Dual] {
                for mnkl in [(1, 8192, 8192, 1), (256, 8192, 8192, 1), (4096, 1024, 8192, 1), (7, 300, 96, 3)] {
                    let c = plan_for(op, x, mnkl, 132, None);
                    assert_eq!(c, plan_for(op, x, mnkl, 132, None));
                    assert!(c.swapped && c.x == x, "{c}");
                    assert_eq!(c.wx_rows(), (mnkl.1, mnkl.0));
                    let ty = if dtype == OutputDtype::Bf16 { "bf16" } else { "f16" };
                    let want = format!("{}_w4a16{ty}_sm90_ws_m{}n{}", op.name(), c.variant.bm, c.variant.bn);
                    assert_eq!(c.symbol(), want);
                    let s = c.scratch();
                    assert_eq!(s.x16.1, 0, "{c}");
                    assert_eq!(s.needs.bytes, s.partials.1, "{c}");
                    assert!(c.to_string().contains("X = the 16-bit A") || op == Op::Dual, "{c}");
                }
            }
            // The dual GEMM's m128n256 has no W4A16 kernel: forcing it forces nothing.
            let skipped = Variant { bm: 128, bn: 256 };
            let forced = Some(Forced::Config(skipped, None, None));
            assert_ne!(plan_for(Op::Dual, x, (4096, 1024, 512, 1), 132, forced).variant, skipped);
            assert_eq!(plan_for(Op::Gemm, x, (4096, 1024, 512, 1), 132, forced).variant, skipped);
            // No decoded copy of X to index: a large M is taken (the W4A4 path's f16 copy of
            // 2^18 x 8192 elements would not fit 32-bit offsets).
            assert!(rejects(Op::Gemm, (1 << 18, 1024, 8192, 1), None).is_some());
            assert_eq!(rejects_for(Op::Gemm, x, (1 << 18, 1024, 8192, 1), None), None);
            assert!(rejects_for(Op::Gemm, x, (64, 64, 48, 1), None).is_some());
        }
    }

    #[test]
    fn rejects_unaligned_k_and_oversized_shapes() {
        for op in [Op::Gemm, Op::Dual] {
            for k in [16, 48, 32, 4112] {
                assert!(rejects(op, (3, 5, k, 1), None).is_some(), "{op:?} K = {k}");
            }
            assert!(rejects(op, (3, 5, 256, 1), None).is_none());
            assert!(rejects(op, (3, 5, 256, 1), Some(Forced::Off)).is_some());
            assert!(rejects(op, (1 << 20, 1 << 20, 256, 1), None).is_some());
            assert!(rejects(op, (usize::MAX, 2, 256, 1), None).is_some());
        }
    }
}
