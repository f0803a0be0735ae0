//! The grouped GEMM on the skeleton (grouped_gemm_sm90.cu): a pure plan (the tile variant, each
//! group's orientation, the grid and the work table's bound), a bind step that writes each
//! group's problem descriptor (tensor maps included) to device memory once, and the launch of the
//! pre-pass (decode every X, build the table) and the persistent main kernel. Two forms: a list
//! of groups with their own tensors and shapes (SPEC §3.4), and the MoE form, one `[E, N, K]`
//! weight tensor, tokens `[T, K]` sorted by expert and the experts' end rows on the device, which
//! the host never reads.

use std::fmt;

use cudarc::driver::CudaFunction;

use super::bind::{problem_struct, OutputSide};
use super::plan::{fixup_cycles, stage_cycles, Forced, UNIT_OVERHEAD_CYCLES};
use crate::backend::cuda::device::{product_alpha, to_i32};
use crate::backend::cuda::device::{
    Carve, F16View, GemmViews, I32View, Keep, Nvfp4View, Owned, Workspace, WorkspaceNeeds,
};
use crate::backend::cuda::family::Launch;
use crate::backend::cuda::kernels::grouped::{
    GroupSegment, GroupedBuild, GroupedPrepParams, Sm90GroupedParams, BUILD_THREADS, MAX_SEGMENTS, PREPARE_SYMBOL,
};
use crate::backend::cuda::kernels::pdl_ready;
use crate::backend::cuda::kernels::sm90::{Op, Variant, XDecodeParams, BK, DECODE_BIAS, THREADS, VARIANTS};
use crate::backend::cuda::runtime::{Gpu, LaunchOptions, LaunchShape, StreamHandle};
use crate::{Error, Result};

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
    /// Each X operand's decoded f16 `[rows, K64]`: (offset, bytes).
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
        if let Some(why) = super::rejects(Op::Gemm, (m, n, k, 1), None) {
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

/// The plan of a grouped launch on `sms` SMs (the variant forced by `NVFP4_GROUPED_SM90`, if any).
pub fn grouped_plan(shape: &GroupedShape, sms: usize, forced: Option<Forced>) -> GroupedPlan {
    let only = match forced {
        Some(Forced::Config(v, _, _)) => Some(v),
        _ => None,
    };
    // A list group's larger operand is W, as in a GEMM; a MoE launch's W is the experts.
    let swapped: Vec<bool> = match shape {
        GroupedShape::List(g) => g.iter().map(|&(m, n, _)| m < n).collect(),
        GroupedShape::Moe { .. } => Vec::new(),
    };
    let mut best: Option<(GroupedPlan, f64)> = None;
    for v in VARIANTS.into_iter().filter(|v| only.is_none_or(|o| o == *v) && (only.is_some() || CHOSEN.contains(v))) {
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
    /// The main kernel's symbol.
    pub fn symbol(&self) -> &'static str {
        self.variant.symbol(Op::Grouped)
    }
    /// Dynamic shared memory of the main kernel.
    pub fn smem_bytes(&self) -> usize {
        self.variant.layout(Op::Grouped).smem_bytes
    }
    /// Rows and K of each X operand the pre-pass decodes.
    fn x_operands(&self) -> Vec<(usize, usize)> {
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
        write!(
            f,
            "{} {what}: tile {}x{}x{BK}, W = B in {swapped} of {} groups, stream-K over {} CTAs x {THREADS}, table <= {} \
             units, smem {} B, est {:.1} kcycles",
            self.symbol(),
            self.variant.bm,
            self.variant.bn,
            self.swapped.len(),
            self.grid,
            self.max_units,
            self.smem_bytes(),
            self.est_cycles / 1e3
        )
    }
}

/// The operands of a grouped launch.
pub enum GroupedOperands<'a> {
    /// Groups with their own tensors: A `[1, M, K]`, B `[1, N, K]`, c `[1, M, N]` each.
    List(&'a [GemmViews<'a>]),
    /// The MoE form: tokens `[1, T, K]` sorted by expert, weights `[E, N, K]`, `offsets[e]` the
    /// end row of expert e's tokens (device memory), output `[1, T, N]`.
    Moe {
        /// The tokens.
        a: &'a Nvfp4View,
        /// The experts' weights.
        b: &'a Nvfp4View,
        /// E end rows.
        offsets: &'a I32View,
        /// The optional FP32 factor before the final rounding.
        alpha: Option<f32>,
        /// The output.
        c: &'a F16View,
    },
}

impl GroupedOperands<'_> {
    /// The launch's shape, after checking that every operand agrees with it.
    pub fn shape(&self) -> Result<GroupedShape> {
        let err = |s: String| Err(Error::Shape(format!("grouped gemm: {s}")));
        match self {
            GroupedOperands::List(groups) => {
                if groups.is_empty() {
                    return err("no groups".into());
                }
                let mut out = Vec::with_capacity(groups.len());
                for (i, g) in groups.iter().enumerate() {
                    let (a, b) = (&g.a.meta, &g.b.meta);
                    let (m, n, k) = (a.rows, b.rows, a.k);
                    if a.l != 1 || b.l != 1 || b.k != k || g.c.shape != [1, m, n] {
                        return err(format!(
                            "group {i}: A [{}, {m}, {k}], B [{}, {n}, {}], output {:?} do not form a GEMM with L = 1",
                            a.l, b.l, b.k, g.c.shape
                        ));
                    }
                    out.push((m, n, k));
                }
                Ok(GroupedShape::List(out))
            }
            GroupedOperands::Moe { a, b, offsets, c, .. } => {
                let (t, n, k, e) = (a.meta.rows, b.meta.rows, a.meta.k, b.meta.l);
                if a.meta.l != 1 || b.meta.k != k || c.shape != [1, t, n] || offsets.len != e {
                    return err(format!(
                        "MoE form: tokens [{}, {t}, {k}], weights [{e}, {n}, {}], {} offsets and output {:?} do not \
                         agree (tokens [1, T, K], weights [E, N, K], E offsets, output [1, T, N])",
                        a.meta.l, b.meta.k, offsets.len, c.shape
                    ));
                }
                Ok(GroupedShape::Moe { t, n, k, e })
            }
        }
    }
}

/// A grouped plan bound to its operands: launchable any number of times, allocating nothing.
pub(crate) struct GroupedLaunch {
    prepare: CudaFunction,
    main: CudaFunction,
    prep: GroupedPrepParams,
    params: Sm90GroupedParams,
    shapes: (LaunchShape, LaunchShape),
    /// What its launches read: operands, outputs, the workspace and the descriptor tables (every
    /// group's problem, the builder's groups, the X operands to decode).
    keep: Vec<Keep>,
}

/// The alpha of a product, in the reference's order (alpha * global(A) * global(B)), with the
/// decode bias.
fn alpha_of(alpha: Option<f32>, a: &Nvfp4View, b: &Nvfp4View) -> [f64; 2] {
    [product_alpha(alpha, a, b) * DECODE_BIAS, 0.0]
}

/// The pre-pass's description of one X operand `[1, rows, K]` decoded to `out`, from block `block0`.
fn decode_of(x: &Nvfp4View, rows: usize, out: u64, block0: usize) -> Result<(XDecodeParams, usize)> {
    let (k, k64) = (x.meta.k, x.meta.k.div_ceil(BK) * BK);
    // One thread per 16-byte output chunk, 8 per 64-element group.
    let blocks = (rows * (k64 / BK) * 8).div_ceil(BUILD_THREADS as usize);
    let d = XDecodeParams {
        x: x.values,
        sf: x.scales,
        out,
        rows: to_i32(rows, "X rows")?,
        k: to_i32(k, "K")?,
        k64: to_i32(k64, "K")?,
        l: 1,
        blocked: x.blocked_flag(),
        block0: to_i32(block0, "pre-pass blocks")?,
    };
    Ok((d, blocks))
}

/// Binds `plan` to `ops` with `ws` (holding `plan.scratch().needs`): writes the descriptors to
/// device memory (the only allocation) and fills both kernels' parameters. The caller has let
/// `main` take the plan's shared memory.
pub(crate) fn bind_grouped(
    gpu: &Gpu,
    plan: &GroupedPlan,
    (prepare, main): (CudaFunction, CudaFunction),
    ops: &GroupedOperands<'_>,
    ws: &Workspace,
) -> Result<GroupedLaunch> {
    if ops.shape()? != plan.shape {
        return Err(Error::Shape("grouped gemm: the operands do not have the plan's shape".into()));
    }
    let v = plan.variant;
    let scratch = plan.scratch();
    let mut problems = Vec::new();
    let mut segments = Vec::new();
    let mut decodes = Vec::new();
    let mut keep: Vec<Keep> = vec![ws.keep()];
    let mut blocks = 0;
    let mut build = GroupedBuild {
        units: ws.at(scratch.units.0, scratch.units.1)?,
        slot_first: ws.at(scratch.slot_first.0, scratch.slot_first.1)?,
        max_units: to_i32(plan.max_units, "work table entries")?,
        slots: to_i32(plan.grid, "CTAs")?,
        bn: v.bn as i32,
        ..GroupedBuild::default()
    };
    match ops {
        GroupedOperands::List(groups) => {
            for (g, ((op, &swapped), &(x_off, x_len))) in groups.iter().zip(&plan.swapped).zip(&scratch.x16).enumerate()
            {
                let (m, n, k) = (op.a.meta.rows, op.b.meta.rows, op.a.meta.k);
                let (w, x, w_rows, x_rows) = if swapped { (op.b, op.a, n, m) } else { (op.a, op.b, m, n) };
                let x16 = ws.at(x_off, x_len)?;
                let (d, nb) = decode_of(x, x_rows, x16, blocks)?;
                decodes.push(d);
                blocks += nb;
                let out = OutputSide { addr: op.c.addr, m, n, l: 1, swapped, flat: false, bf16: op.c.bf16_flag() };
                problems.push(problem_struct(
                    v,
                    1,
                    (&[w], w_rows, k, 1),
                    (x16, x_rows, 1),
                    alpha_of(op.alpha, op.a, op.b),
                    out,
                )?);
                segments.push(GroupSegment {
                    prob: to_i32(g, "groups")?,
                    l: 0,
                    x_base: 0,
                    x_rows: to_i32(x_rows, "X rows")?,
                    tiles_w: to_i32(w_rows.div_ceil(v.bm), "W tiles")?,
                    k_iters: to_i32(k.div_ceil(BK), "k-steps")?,
                    pad: [0; 2],
                });
                keep.extend([op.a.keep(), op.b.keep(), op.c.keep()].into_iter().flatten());
            }
            build.segments = to_i32(groups.len(), "groups")?;
        }
        GroupedOperands::Moe { a, b, offsets, alpha, c } => {
            let GroupedShape::Moe { t, n, k, e } = plan.shape else { unreachable!("shape checked above") };
            let x16 = ws.at(scratch.x16[0].0, scratch.x16[0].1)?;
            let (d, nb) = decode_of(a, t, x16, 0)?;
            decodes.push(d);
            blocks += nb;
            let out = OutputSide { addr: c.addr, m: t, n, l: 1, swapped: true, flat: true, bf16: c.bf16_flag() };
            problems.push(problem_struct(v, 1, (&[*b], n, k, e), (x16, t, 1), alpha_of(*alpha, a, b), out)?);
            build.offsets = offsets.addr;
            build.segments = to_i32(e, "experts")?;
            build.moe_rows = to_i32(t, "tokens")?;
            build.moe_tiles_w = to_i32(n.div_ceil(v.bm), "W tiles")?;
            build.moe_k_iters = to_i32(k.div_ceil(BK), "k-steps")?;
            keep.extend([a.keep(), b.keep(), offsets.keep(), c.keep()].into_iter().flatten());
        }
    }
    let problems = gpu.upload(&problems, "the grouped launch's problems")?;
    let segments = if segments.is_empty() { None } else { Some(gpu.upload(&segments, "the grouped launch's groups")?) };
    let decodes = gpu.upload(&decodes, "the grouped launch's X operands")?;
    build.segs = segments.as_ref().map_or(0, |s| gpu.addr(s));
    let (problems_at, decodes_at) = (gpu.addr(&problems), gpu.addr(&decodes));
    keep.push(Owned::new(gpu, (problems, segments, decodes)));
    let prep =
        GroupedPrepParams { decode: decodes_at, decodes: to_i32(scratch.x16.len(), "X operands")?, pad: 0, build };
    let params = Sm90GroupedParams {
        problems: problems_at,
        units: build.units,
        slot_first: build.slot_first,
        workspace: ws.at(scratch.partials.0, scratch.partials.1)?,
        counters: ws.counters(plan.grid)?,
    };
    // Block 0 builds the table, the others decode. The main kernel starts while the pre-pass
    // runs (barrier setup) and waits for it before reading the table.
    let shapes = (
        LaunchShape::linear(to_i32(blocks + 1, "pre-pass blocks")? as u32, BUILD_THREADS, 0),
        LaunchShape::linear(plan.grid as u32, THREADS, plan.smem_bytes() as u32)
            .with(LaunchOptions { dependent: true, cluster_x: 1 }),
    );
    Ok(GroupedLaunch { prepare, main, prep, params, shapes, keep })
}

impl Launch for GroupedLaunch {
    /// The pre-pass, then the main kernel; `chain`: the pre-pass as a programmatic dependent.
    fn enqueue(&self, gpu: &Gpu, stream: StreamHandle, chain: bool) -> Result<()> {
        let options = LaunchOptions { dependent: chain && pdl_ready(PREPARE_SYMBOL), cluster_x: 0 };
        gpu.launch(stream, &self.prepare, self.shapes.0.with(options), &self.prep)?;
        gpu.launch(stream, &self.main, self.shapes.1, &self.params)
    }
    fn first_symbol(&self) -> &'static str {
        PREPARE_SYMBOL
    }
    fn keeps(&self) -> &[Keep] {
        &self.keep
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

    #[test]
    fn bench_variants() {
        let picks: Vec<Variant> = bench_lists().iter().map(|s| grouped_plan(s, 132, None).variant).collect();
        let (big, small) = (Variant { bm: 256, bn: 128 }, Variant { bm: 128, bn: 128 });
        assert_eq!(picks, [big, big, small, small]);
        let forced = Some(Forced::Config(Variant { bm: 256, bn: 16 }, None, None));
        assert_eq!(grouped_plan(&bench_lists()[0], 132, forced).variant, Variant { bm: 256, bn: 16 });
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
