//! Binding a grouped plan (`plan.rs`) to device operands: each group's problem descriptor
//! (tensor maps included) written to device memory once, the X operands the pre-pass decodes, the
//! builder's groups, and the launch of the pre-pass (decode every X, build the work table) and the
//! persistent main kernel. Two forms: a list of groups with their own tensors and shapes (SPEC
//! §3.4), and the MoE form, one `[E, N, K]` weight tensor, tokens `[T, K]` sorted by expert and
//! the experts' end rows on the device, which the host never reads.

use cudarc::driver::CudaFunction;

use super::plan::{GroupedPlan, GroupedShape};
use crate::backend::cuda::device::{product_alpha, to_i32};
use crate::backend::cuda::device::{F16View, I32View, Keep, Nvfp4GemmViews, Nvfp4View, Owned, Workspace};
use crate::backend::cuda::family::Launch;
use crate::backend::cuda::kernels::grouped::{
    GroupSegment, GroupedBuild, GroupedPrepParams, Sm90GroupedParams, BUILD_THREADS, PREPARE_SYMBOL,
};
use crate::backend::cuda::kernels::pdl_ready;
use crate::backend::cuda::kernels::sm90::{XDecodeParams, BK, DECODE_BIAS, THREADS};
use crate::backend::cuda::runtime::{Gpu, LaunchOptions, LaunchShape, StreamHandle};
use crate::backend::cuda::sm90::bind::{problem_struct, OutputSide};
use crate::{Error, Result};

/// The operands of a grouped launch.
pub enum GroupedOperands<'a> {
    /// Groups with their own tensors: A `[1, M, K]`, B `[1, N, K]`, c `[1, M, N]` each.
    List(&'a [Nvfp4GemmViews<'a>]),
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
    /// The launch's shape (the operands' rules are [`Op::validate`](crate::ops::Op::validate)'s,
    /// checked before routing; binding compares this shape with the plan's).
    pub fn shape(&self) -> GroupedShape {
        match self {
            GroupedOperands::List(groups) => {
                GroupedShape::List(groups.iter().map(|g| (g.a.meta.rows, g.b.meta.rows, g.a.meta.k)).collect())
            }
            GroupedOperands::Moe { a, b, .. } => {
                GroupedShape::Moe { t: a.meta.rows, n: b.meta.rows, k: a.meta.k, e: b.meta.l }
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
