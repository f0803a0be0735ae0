//! Binding a grouped plan (`plan.rs`) to device operands: each group's problem descriptor
//! (tensor maps included) written to device memory once, the X operands the pre-pass decodes, the
//! builder's groups, and the launch of the pre-pass (decode every X, build the work table) and the
//! persistent main kernel. Two forms: a list of groups with their own tensors and shapes (SPEC
//! §3.4), and the MoE form, one `[E, N, K]` weight tensor, tokens `[T, K]` sorted by expert and
//! the experts' end rows on the device, which the host never reads, as it never reads the
//! per-expert alphas there (the epilogue of a unit reads its expert's). With 16-bit activations
//! (W4A16) nothing is decoded: each group's problem maps its own activation tensor, and the
//! first launch only builds the table.

use cudarc::driver::CudaFunction;

use super::plan::{GroupedPlan, GroupedShape};
use crate::backend::cuda::device::{product_alpha, to_i32, ActView, GemmViews};
use crate::backend::cuda::device::{F16View, F32View, I32View, Keep, Nvfp4View, Owned, Workspace};
use crate::backend::cuda::family::Launch;
use crate::backend::cuda::kernels::grouped::{
    GroupSegment, GroupedBuild, GroupedPrepParams, Sm90GroupedParams, BUILD_THREADS, PREPARE_SYMBOL, TABLE_SYMBOL,
    TABLE_THREADS,
};
use crate::backend::cuda::kernels::pdl_ready;
use crate::backend::cuda::kernels::sm90::{XDecodeParams, XKind, BK, DECODE_BIAS, THREADS};
use crate::backend::cuda::runtime::{Gpu, LaunchOptions, LaunchShape, StreamHandle};
use crate::backend::cuda::sm90::bind::{problem_struct, OutputSide, XSide};
use crate::format::PackAct;
use crate::ops::{effective_alpha, Act, Activation, MoeAlpha};
use crate::{Error, Result};

/// The operands of a grouped launch.
pub enum GroupedOperands<'a> {
    /// Groups with their own tensors: A `[1, M, K]` (NVFP4, or 16-bit in every group), B `[1, N,
    /// K]`, c `[1, M, N]` each.
    List(&'a [GemmViews<'a>]),
    /// The MoE form: tokens `[1, T, K]` sorted by expert, weights `[E, N, K]`, `offsets[e]` the
    /// end row of expert e's tokens (device memory), output `[1, T, N]`.
    Moe {
        /// The tokens (NVFP4 or 16-bit).
        a: ActView<'a>,
        /// The experts' weights.
        b: &'a Nvfp4View,
        /// E end rows.
        offsets: &'a I32View,
        /// The FP32 factor before the final rounding: one (optional) for every expert, or E on
        /// the device, one per expert.
        alpha: MoeAlpha<&'a F32View>,
        /// The output.
        c: &'a F16View,
    },
}

impl GroupedOperands<'_> {
    /// The launch's shape (the operands' rules are [`Op::validate`](crate::ops::Op::validate)'s,
    /// checked before routing; binding compares this shape with the plan's).
    pub fn shape(&self) -> GroupedShape {
        match self {
            GroupedOperands::List(groups) => GroupedShape::List(
                groups.iter().map(|g| (g.a.act_meta().rows(), g.b.meta.rows, g.a.act_meta().k())).collect(),
            ),
            GroupedOperands::Moe { a, b, .. } => {
                let a = a.act_meta();
                GroupedShape::Moe { t: a.rows(), n: b.meta.rows, k: a.k(), e: b.meta.l }
            }
        }
    }
}

/// A grouped plan bound to its operands: launchable any number of times, allocating nothing.
pub(crate) struct GroupedLaunch {
    prepare: CudaFunction,
    main: CudaFunction,
    first: First,
    params: Sm90GroupedParams,
    shapes: (LaunchShape, LaunchShape),
    /// What its launches read: operands, outputs, the workspace and the descriptor tables (every
    /// group's problem, the builder's groups, the X operands to decode).
    keep: Vec<Keep>,
    /// The main kernel's symbol when it reads packed weights.
    packed: Option<&'static str>,
}

/// The first kernel's parameters: the pre-pass's (decode NVFP4 X, build the table) or, with
/// 16-bit activations, the table builder's.
enum First {
    Prepare(GroupedPrepParams),
    Table(GroupedBuild),
}

/// The alpha of a product, in the reference's order (alpha * global(A) * global(B)), with the
/// decode bias.
fn alpha_of(alpha: Option<f32>, a: ActView<'_>, b: &Nvfp4View) -> [f64; 2] {
    let f = match a {
        Act::Nvfp4(a) => product_alpha(alpha, a, b),
        Act::Dense(_) => effective_alpha(alpha, &a, b) as f64,
    };
    [f * DECODE_BIAS, 0.0]
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
/// `main` take the plan's shared memory; `prepare` is the pre-pass (W4A4) or the table builder
/// (W4A16).
pub(crate) fn bind_grouped(
    gpu: &Gpu,
    plan: &GroupedPlan,
    (prepare, main): (CudaFunction, CudaFunction),
    packed: Option<(PackAct, &'static str)>,
    ops: &GroupedOperands<'_>,
    ws: &Workspace,
) -> Result<GroupedLaunch> {
    if ops.shape() != plan.shape {
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
        deal: plan.deals() as i32,
        ..GroupedBuild::default()
    };
    // The X of one product `[1, rows, K]`: decoded by the pre-pass into the next of its scratch
    // slots (NVFP4), or the activation as it is.
    let mut slots = scratch.x16.iter();
    let mut x_side = |x: ActView<'_>, rows: usize, decode_from: Option<&Nvfp4View>| -> Result<XSide> {
        match (x, decode_from) {
            (Act::Dense(a), _) => Ok(XSide { pack: packed.map(|(act, _)| act), ..XSide::dense(a)? }),
            (Act::Nvfp4(_), Some(src)) => {
                let &(off, len) = slots.next().ok_or_else(|| Error::Invalid("grouped bind: X slots".into()))?;
                let x16 = ws.at(off, len)?;
                let (d, nb) = decode_of(src, rows, x16, blocks)?;
                decodes.push(d);
                blocks += nb;
                Ok(XSide { addr: x16, rows, l: 1, row_bytes: src.meta.k.div_ceil(BK) * BK * 2, pack: None })
            }
            (Act::Nvfp4(_), None) => Err(Error::Invalid("grouped bind: an NVFP4 X without its operand".into())),
        }
    };
    match ops {
        GroupedOperands::List(groups) => {
            for (g, (op, &swapped)) in groups.iter().zip(&plan.swapped).enumerate() {
                let (m, n, k) = (op.a.act_meta().rows(), op.b.meta.rows, op.a.act_meta().k());
                // W and X: the larger NVFP4 operand is W; a 16-bit A is always X.
                let (w, xs, w_rows) = match op.a {
                    Act::Nvfp4(a) if !swapped => (a, x_side(Act::Nvfp4(op.b), n, Some(op.b))?, m),
                    Act::Nvfp4(a) => (op.b, x_side(op.a, m, Some(a))?, n),
                    Act::Dense(_) => (op.b, x_side(op.a, m, None)?, n),
                };
                let out = OutputSide { addr: op.c.addr, m, n, l: 1, swapped, flat: false, bf16: op.c.bf16_flag() };
                problems.push(problem_struct(v, 1, (&[w], w_rows, k, 1), xs, alpha_of(op.alpha, op.a, op.b), out)?);
                segments.push(GroupSegment {
                    prob: to_i32(g, "groups")?,
                    l: 0,
                    x_base: 0,
                    x_rows: to_i32(xs.rows, "X rows")?,
                    tiles_w: to_i32(w_rows.div_ceil(v.bm), "W tiles")?,
                    k_iters: to_i32(k.div_ceil(BK), "k-steps")?,
                    pad: [0; 2],
                });
                keep.extend([act_keep(op.a), op.b.keep(), op.c.keep()].into_iter().flatten());
            }
            build.segments = to_i32(groups.len(), "groups")?;
        }
        GroupedOperands::Moe { a, b, offsets, alpha, c } => {
            let GroupedShape::Moe { t, n, k, e } = plan.shape else { unreachable!("shape checked above") };
            let xs = match a {
                Act::Nvfp4(src) => x_side(*a, t, Some(src))?,
                Act::Dense(_) => x_side(*a, t, None)?,
            };
            let out = OutputSide { addr: c.addr, m: t, n, l: 1, swapped: true, flat: true, bf16: c.bf16_flag() };
            let one = match alpha {
                MoeAlpha::One(x) => *x,
                MoeAlpha::PerExpert(_) => None,
            };
            let mut problem = problem_struct(v, 1, (&[*b], n, k, e), xs, alpha_of(one, *a, b), out)?;
            if let MoeAlpha::PerExpert(alphas) = alpha {
                if alphas.len != e {
                    return Err(Error::Shape(format!("grouped bind: {} alphas for {e} experts", alphas.len)));
                }
                // Expert l's factor, (alpha_l[l] * global(A)) * global(B) in f32, is formed by
                // the epilogue of each of its units.
                problem.epi.alpha_l = alphas.addr;
                problem.epi.global = [a.act_meta().global_scale(), b.meta.global_scale];
                keep.extend(alphas.keep());
            }
            problems.push(problem);
            build.offsets = offsets.addr;
            build.segments = to_i32(e, "experts")?;
            build.moe_rows = to_i32(t, "tokens")?;
            build.moe_tiles_w = to_i32(n.div_ceil(v.bm), "W tiles")?;
            build.moe_k_iters = to_i32(k.div_ceil(BK), "k-steps")?;
            keep.extend([act_keep(*a), b.keep(), offsets.keep(), c.keep()].into_iter().flatten());
        }
    }
    let problems = gpu.upload(&problems, "the grouped launch's problems")?;
    let segments = if segments.is_empty() { None } else { Some(gpu.upload(&segments, "the grouped launch's groups")?) };
    build.segs = segments.as_ref().map_or(0, |s| gpu.addr(s));
    let problems_at = gpu.addr(&problems);
    let first = if plan.x == XKind::Nvfp4 {
        let n = to_i32(decodes.len(), "X operands")?;
        let decodes = gpu.upload(&decodes, "the grouped launch's X operands")?;
        let prep = GroupedPrepParams { decode: gpu.addr(&decodes), decodes: n, pad: 0, build };
        keep.push(Owned::new(gpu, decodes));
        First::Prepare(prep)
    } else {
        First::Table(build)
    };
    keep.push(Owned::new(gpu, (problems, segments)));
    let params = Sm90GroupedParams {
        problems: problems_at,
        units: build.units,
        slot_first: build.slot_first,
        workspace: ws.at(scratch.partials.0, scratch.partials.1)?,
        counters: ws.counters(plan.grid)?,
    };
    // Block 0 builds the table, the others decode (W4A4; W4A16 launches the table kernel, one
    // block of TABLE_THREADS). The main kernel starts while the first kernel runs (barrier setup)
    // and waits for it before reading the table.
    let first_threads = if matches!(first, First::Table(_)) { TABLE_THREADS } else { BUILD_THREADS };
    let shapes = (
        LaunchShape::linear(to_i32(blocks + 1, "pre-pass blocks")? as u32, first_threads, 0),
        LaunchShape::linear(plan.grid as u32, THREADS, plan.smem_bytes() as u32)
            .with(LaunchOptions { dependent: true, cluster_x: 1 }),
    );
    Ok(GroupedLaunch { prepare, main, first, params, shapes, keep, packed: packed.map(|(_, symbol)| symbol) })
}

/// What keeps an activation's memory alive (none for a view the caller owns).
fn act_keep(a: ActView<'_>) -> Option<Keep> {
    match a {
        Act::Nvfp4(a) => a.keep(),
        Act::Dense(a) => a.keep(),
    }
}

impl Launch for GroupedLaunch {
    /// The first kernel (pre-pass or table builder), then the main kernel; `chain`: the first as a
    /// programmatic dependent.
    fn enqueue(&self, gpu: &Gpu, stream: StreamHandle, chain: bool) -> Result<()> {
        let options = LaunchOptions { dependent: chain && pdl_ready(self.first_symbol()), cluster_x: 0 };
        match &self.first {
            First::Prepare(p) => gpu.launch(stream, &self.prepare, self.shapes.0.with(options), p)?,
            First::Table(b) => gpu.launch(stream, &self.prepare, self.shapes.0.with(options), b)?,
        }
        gpu.launch(stream, &self.main, self.shapes.1, &self.params)
    }
    fn bound_kernel(&self) -> Option<&'static str> {
        self.packed
    }
    fn first_symbol(&self) -> &'static str {
        match self.first {
            First::Prepare(_) => PREPARE_SYMBOL,
            First::Table(_) => TABLE_SYMBOL,
        }
    }
    fn keeps(&self) -> &[Keep] {
        &self.keep
    }
}
