//! Binding a skeleton plan to device operands: tensor maps, the parameter structs of the X
//! pre-pass and the main kernel, and the launch of both on a given stream (of the main kernel
//! alone when X is a 16-bit activation, W4A16: it loads X as it is).

use cudarc::driver::sys::CUtensorMapSwizzle::{CU_TENSOR_MAP_SWIZZLE_128B as SW128, CU_TENSOR_MAP_SWIZZLE_NONE as SW0};
use cudarc::driver::CudaFunction;

use super::plan::{Schedule, Sm90Plan};
use crate::backend::cuda::device::{product_alpha, to_i32, ActView, F16View, Keep, Nvfp4View, Workspace};
use crate::backend::cuda::family::Launch;
use crate::backend::cuda::kernels::pdl_ready;
use crate::backend::cuda::kernels::sm90::{
    DecodeXParams, Op, SfMode, Sm90EpilogueArgs, Sm90MainloopArgs, Sm90Params, Sm90Problem, Sm90Schedule, Variant,
    WPrefetch, XDecodeParams, XKind, BK, DECODE_BIAS, DECODE_X_SYMBOL, DECODE_X_THREADS, K_CLUSTER, K_SPLIT, K_STREAM,
    ROW_BYTES, THREADS,
};
use crate::backend::cuda::runtime::{tma_map, Gpu, LaunchOptions, LaunchShape, StreamHandle, TmaMap};
use crate::format::PackAct;
use crate::ops::{effective_alpha, Act, Activation};
use crate::{Error, Result};

/// The kernels of a skeleton launch.
pub(crate) struct Sm90Kernels {
    /// The plan's variant of the operation.
    pub main: CudaFunction,
    /// The X pre-pass (W4A4; none when X is a 16-bit activation).
    pub decode_x: Option<CudaFunction>,
    /// `main` reads W in its packed form for this activation type (format/w16_pack.rs).
    pub packed: Option<PackAct>,
    /// `main`'s symbol.
    pub symbol: &'static str,
}

/// The operands of one problem: W's parts (A or B for a GEMM; B1, B2 for a dual GEMM), X, the
/// caller's alpha, and the output `[L, M, N]`.
pub struct Sm90Operands<'a> {
    /// A, `[L, M, K]`: NVFP4 (W4A4) or a 16-bit activation (W4A16).
    pub a: ActView<'a>,
    /// B, or B1 and B2, `[L, N, K]`.
    pub b: &'a [Nvfp4View],
    /// The optional FP32 factor before the final rounding (of each product, for a dual GEMM).
    pub alpha: Option<f32>,
    /// `[L, M, N]` f16 or bf16.
    pub c: &'a F16View,
}

/// A plan bound to its operands: launchable any number of times, allocating nothing.
pub(crate) struct Sm90Launch {
    kernels: Sm90Kernels,
    params: Box<Sm90Params>,
    x_params: DecodeXParams,
    shapes: (LaunchShape, LaunchShape), // pre-pass, main kernel
    /// The main kernel's symbol (the first kernel without a pre-pass).
    symbol: &'static str,
    keep: Vec<Keep>,
}

/// The f32 form of `alpha` when it is ± a power of two that f32 holds as a normal number: then
/// `f32 sum * alpha` is exact and one f32 -> f16 rounding equals the reference's.
pub(crate) fn pow2_f32(alpha: f64) -> Option<f32> {
    let bits = alpha.to_bits();
    let (mantissa, exp) = (bits & ((1 << 52) - 1), ((bits >> 52) & 0x7FF) as i64 - 1023);
    (alpha != 0.0 && mantissa == 0 && (-126..=127).contains(&exp)).then_some(alpha as f32)
}

fn shape_error(what: String) -> Error {
    Error::Shape(format!("sm90 bind: {what}"))
}

/// Checks that the operands have the plan's shape.
fn check_operands(plan: &Sm90Plan, ops: &Sm90Operands<'_>) -> Result<()> {
    let (m, n, k, l) = plan.mnkl;
    if ops.b.len() != plan.op.parts() {
        return Err(shape_error(format!("{:?} takes {} B operands, got {}", plan.op, plan.op.parts(), ops.b.len())));
    }
    let a = ops.a.act_meta();
    if (a.l(), a.rows(), a.k()) != (l, m, k) {
        return Err(shape_error(format!("A is [{}, {}, {}], the plan wants [{l}, {m}, {k}]", a.l(), a.rows(), a.k())));
    }
    let x = match a.dense_dtype() {
        Some(d) => XKind::Dense(d),
        None => XKind::Nvfp4,
    };
    if x != plan.x {
        return Err(shape_error(format!("A is {}, the plan wants {:?}", a.mode(), plan.x)));
    }
    for (i, b) in ops.b.iter().enumerate() {
        if (b.meta.l, b.meta.rows, b.meta.k) != (l, n, k) {
            let bm = &b.meta;
            return Err(shape_error(format!(
                "B{i} is [{}, {}, {}], the plan wants [{l}, {n}, {k}]",
                bm.l, bm.rows, bm.k
            )));
        }
    }
    if ops.c.shape != [l, m, n] {
        return Err(shape_error(format!("output is {:?}, the plan wants [{l}, {m}, {n}]", ops.c.shape)));
    }
    if ops.b.len() == 2 && ops.b[0].meta.layout != ops.b[1].meta.layout {
        return Err(shape_error("B1 and B2 must share one scale layout".into()));
    }
    Ok(())
}

/// Binds `plan` to `ops`, with `ws` (holding `plan.scratch().needs`) for the decoded X, the
/// split-K partials and their counters. Encodes the tensor maps; allocates nothing. The caller has
/// let the main kernel take the plan's shared memory.
pub(crate) fn bind(
    plan: &Sm90Plan,
    kernels: Sm90Kernels,
    ops: &Sm90Operands<'_>,
    ws: &Workspace,
) -> Result<Sm90Launch> {
    check_operands(plan, ops)?;
    let (m, n, k, l) = plan.mnkl;
    let v = plan.variant;
    let (w_rows, x_rows) = plan.wx_rows();
    let scratch = plan.scratch();
    let k64 = plan.k_iters * BK;
    // W parts and X: a GEMM's larger operand is W; a dual GEMM's W is B1 and B2; a 16-bit A is
    // X as it is, W the weights.
    let mut x_params = XDecodeParams::default();
    let mut x_blocks = 0;
    let (w, xs): (Vec<&Nvfp4View>, XSide) = match ops.a {
        Act::Nvfp4(a) => {
            let (w, x): (Vec<&Nvfp4View>, &Nvfp4View) = match (plan.op, plan.swapped) {
                (Op::Gemm, false) => (vec![a], &ops.b[0]),
                _ => (ops.b.iter().collect(), a),
            };
            let x16 = ws.at(scratch.x16.0, scratch.x16.1)?;
            x_params = XDecodeParams {
                x: x.values,
                sf: x.scales,
                out: x16,
                rows: to_i32(x_rows, "X rows")?,
                k: to_i32(k, "K")?,
                k64: to_i32(k64, "K")?,
                l: to_i32(l, "L")?,
                blocked: x.blocked_flag(),
                block0: 0,
            };
            // One pre-pass thread per 16-byte output chunk, 8 per 64-element group.
            x_blocks = to_i32((l * x_rows * plan.k_iters * 8).div_ceil(DECODE_X_THREADS as usize), "X decode blocks")?;
            (w, XSide { addr: x16, rows: x_rows, l, row_bytes: k64 * 2, pack: None })
        }
        Act::Dense(a) => (ops.b.iter().collect(), XSide { pack: kernels.packed, ..XSide::dense(a)? }),
    };

    // Alpha of each product, in the reference's order: alpha * global(A) * global(B_i).
    let mut alpha = [0f64; 2];
    for (i, b) in ops.b.iter().enumerate() {
        alpha[i] = match ops.a {
            Act::Nvfp4(a) => product_alpha(ops.alpha, a, b),
            Act::Dense(_) => effective_alpha(ops.alpha, &ops.a, b) as f64,
        } * DECODE_BIAS;
    }
    let out = OutputSide { addr: ops.c.addr, m, n, l, swapped: plan.swapped, flat: false, bf16: ops.c.bf16_flag() };
    let prob = problem_struct(v, plan.cluster, (&w, w_rows, k, l), xs, alpha, out)?;
    let (workspace, counters) = if plan.global_fixup() {
        (ws.at(scratch.partials.0, scratch.partials.1)?, ws.counters(scratch.needs.counters)?)
    } else {
        (0, 0)
    };
    let sched = Sm90Schedule {
        tiles_w: to_i32(plan.tiles.0, "W tiles")?,
        tiles_x: to_i32(plan.tiles.1, "X tiles")?,
        split: to_i32(plan.split, "split")?,
        k_iters: to_i32(plan.k_iters, "k-steps")?,
        iters_per_split: to_i32(plan.iters_per_split, "k-steps per split")?,
        units: to_i32(plan.units, "units")?,
        k_mode: match plan.schedule {
            Schedule::StreamK => K_STREAM,
            Schedule::SplitInCluster(_) => K_CLUSTER,
            Schedule::Split(_) => K_SPLIT,
        },
        cluster: to_i32(plan.cluster, "cluster")?,
    };
    // The pre-pass prefetches the GEMM's first W stages (not with CTA pairs, whose units it does
    // not model; not for the dual GEMM's two parts).
    let prefetch = plan.op == Op::Gemm && plan.cluster == 1;
    let w_prefetch = WPrefetch {
        sched,
        values: if prefetch { w[0].values } else { 0 },
        scales: if prefetch && prob.main.w_sf_mode == SfMode::Tma as i32 { w[0].scales } else { 0 },
        rows: to_i32(w_rows, "W rows")?,
        row_bytes: to_i32(k / 2, "K")?,
        sf_cols: to_i32(k / 16, "K")?,
        grid: to_i32(plan.grid, "grid")?,
        bm: to_i32(v.bm, "tile rows")?,
    };
    let params = Box::new(Sm90Params { prob, sched, workspace, counters });
    let a_keep = match ops.a {
        Act::Nvfp4(a) => a.keep(),
        Act::Dense(a) => a.keep(),
    };
    let keep: Vec<Keep> =
        ops.b.iter().filter_map(Nvfp4View::keep).chain(a_keep).chain(ops.c.keep()).chain([ws.keep()]).collect();
    // The main kernel starts while the pre-pass runs (barrier setup, first W loads) and waits for
    // it before its first X load; without a pre-pass it is the first kernel (see `enqueue`).
    let shapes = (
        LaunchShape::linear(x_blocks as u32, DECODE_X_THREADS, 0),
        LaunchShape::linear(plan.grid as u32, THREADS, plan.layout().smem_bytes as u32)
            .with(LaunchOptions { dependent: kernels.decode_x.is_some(), cluster_x: plan.launch_cluster() as u32 }),
    );
    let x_params = DecodeXParams { x: x_params, w: w_prefetch };
    let symbol = kernels.symbol;
    Ok(Sm90Launch { kernels, params, x_params, shapes, symbol, keep })
}

/// Where the main kernel loads X from: `[l, rows, row_bytes]` bytes at `addr` (the decoded f16 X
/// with K padded to 64, or a 16-bit activation as the caller gave it).
#[derive(Clone, Copy, Debug)]
pub(crate) struct XSide {
    pub addr: u64,
    pub rows: usize,
    pub l: usize,
    pub row_bytes: usize,
    /// The packed weight form that decodes to X's type (a 16-bit X), if any.
    pub pack: Option<PackAct>,
}

impl XSide {
    /// A dense `[L, rows, K]` activation, loaded as it is: the TMA needs a 16-byte aligned base
    /// (its row stride, 2K bytes, is one for every K the skeleton takes).
    pub(crate) fn dense(a: &F16View) -> Result<Self> {
        let [l, rows, k] = a.shape;
        if !a.addr.is_multiple_of(16) || !(2 * k).is_multiple_of(16) {
            return Err(Error::Invalid(format!(
                "sm90 W4A16: the activation must start on a 16-byte boundary with K % 8 == 0 (address {:#x}, K = {k})",
                a.addr
            )));
        }
        Ok(Self { addr: a.addr, rows, l, row_bytes: 2 * k, pack: None })
    }
}

/// Where a problem's output goes: `c` is `[L, M, N]` f16 (or bf16: `bf16` = 1) (or, `flat`,
/// `[1, M, N]` holding every W batch's rows: a MoE launch's tokens); `swapped`: W is B, so W rows
/// are c's columns.
pub(crate) struct OutputSide {
    pub addr: u64,
    pub m: usize,
    pub n: usize,
    pub l: usize,
    pub swapped: bool,
    pub flat: bool,
    pub bf16: i32,
}

/// The kernel's description of one problem: for the mainloop, W's parts `[l, w_rows, K]` (one
/// scale layout) and X (the decoded f16 `[x_l, x_rows, K64]`, or a 16-bit activation); for the
/// epilogue, the output and the alpha of each part (with the decode bias). Encodes its tensor
/// maps.
pub(crate) fn problem_struct(
    v: Variant,
    cluster: usize,
    (w, w_rows, k, l): (&[&Nvfp4View], usize, usize, usize),
    x: XSide,
    alpha: [f64; 2],
    c: OutputSide,
) -> Result<Sm90Problem> {
    let part_rows = v.bm / w.len();
    // W packed for X's type (W4A16; a dual GEMM's pair as one) goes through the packed mainloop.
    let packed = match (x.pack, w) {
        (None, _) => None,
        (Some(act), [one]) => {
            Some(one.packed_for(act).ok_or_else(|| shape_error("a packed kernel without a packed W".into()))?)
        }
        (Some(act), [b1, b2]) => Some(
            b1.packed_pair_for(b2, act).ok_or_else(|| shape_error("a packed kernel without a packed pair".into()))?,
        ),
        (Some(_), _) => return Err(shape_error("a packed kernel takes one or two W operands".into())),
    };
    let w_mode = if packed.is_some() { SfMode::Packed } else { SfMode::of(w[0].meta.layout, k) };
    let mut tmap_w = [TmaMap::default(); 2];
    let mut tmap_sw = [TmaMap::default(); 2];
    let mut sf_w = [0u64; 2];
    for (i, wp) in w.iter().enumerate() {
        tmap_w[i] = tma_map(wp.values, w_rows, k / 2, l, (part_rows, ROW_BYTES), SW128)?;
        if w_mode == SfMode::Tma {
            tmap_sw[i] = tma_map(wp.scales, w_rows, k / 16, l, (part_rows, 16), SW0)?;
        }
        sf_w[i] = packed.unwrap_or(wp.scales);
    }
    let c_l = if c.flat { 1 } else { c.l };
    // The epilogue's TMA stores: W rows contiguous in c (W is B), 16-byte row strides.
    let c_tma = c.swapped && c.n.is_multiple_of(8) && c.addr.is_multiple_of(16);
    // C is [L, M, N]: W rows step by N (or 1 when W is B), X rows by 1 (or N).
    let (c_stride_w, c_stride_x) = if c.swapped { (1, c.n as i64) } else { (c.n as i64, 1) };
    // In a cluster each CTA loads 1/cluster of the X tile's rows (multicast to all).
    let tmap_x = tma_map(x.addr, x.rows, x.row_bytes, x.l, (v.bn / cluster, ROW_BYTES), SW128)?;
    // The epilogue clips at the rows the operands have, and is flat when they are.
    let (w_rows, x_rows, flat) = (to_i32(w_rows, "W rows")?, to_i32(x.rows, "X rows")?, i32::from(c.flat));
    let main = Sm90MainloopArgs {
        tmap_w,
        tmap_sw,
        tmap_x,
        sf_w,
        l: to_i32(l, "L")?,
        w_sf_mode: w_mode as i32,
        w_rows,
        x_flat: flat,
        k: to_i32(k, "K")?,
    };
    let epi = Sm90EpilogueArgs {
        c: c.addr,
        alpha,
        alpha_f32: [alpha[0] as f32, alpha[1] as f32],
        alpha_pow2: i32::from(pow2_f32(alpha[0]).is_some()),
        pad: 0,
        c_tma: i32::from(c_tma),
        c_flat: flat,
        c_stride_w,
        c_stride_x,
        c_stride_l: if c.flat { 0 } else { (c.m * c.n) as i64 },
        w_rows,
        x_rows,
        out_bf16: c.bf16,
        pad2: [0; 3],
        // Per-batch alphas: the MoE form's, set by its bind (sm90/grouped/bind.rs).
        alpha_l: 0,
        global: [0.0; 2],
        tmap_c: if c_tma { tma_map(c.addr, c.m, c.n * 2, c_l, (v.bn, ROW_BYTES), SW128)? } else { TmaMap::default() },
    };
    Ok(Sm90Problem { main, epi })
}

impl Launch for Sm90Launch {
    /// The X pre-pass, then the main kernel; `chain`: the pre-pass as a programmatic dependent.
    /// Without a pre-pass (W4A16), the main kernel alone, chained when `chain` and it is ready.
    fn enqueue(&self, gpu: &Gpu, stream: StreamHandle, chain: bool) -> Result<()> {
        let Some(decode_x) = &self.kernels.decode_x else {
            let options = LaunchOptions { dependent: chain && pdl_ready(self.symbol), ..self.shapes.1.options };
            return gpu.launch(stream, &self.kernels.main, self.shapes.1.with(options), self.params.as_ref());
        };
        let options = LaunchOptions { dependent: chain && pdl_ready(DECODE_X_SYMBOL), cluster_x: 0 };
        gpu.launch(stream, decode_x, self.shapes.0.with(options), &self.x_params)?;
        gpu.launch(stream, &self.kernels.main, self.shapes.1, self.params.as_ref())
    }
    fn bound_kernel(&self) -> Option<&'static str> {
        self.kernels.packed.map(|_| self.symbol)
    }
    fn first_symbol(&self) -> &'static str {
        if self.kernels.decode_x.is_some() {
            DECODE_X_SYMBOL
        } else {
            self.symbol
        }
    }
    fn keeps(&self) -> &[Keep] {
        &self.keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pow2_alpha() {
        assert_eq!(pow2_f32(16384.0), Some(16384.0));
        assert_eq!(pow2_f32(8192.0 * 0.5), Some(4096.0));
        assert_eq!(pow2_f32(0.75 * 16384.0), None);
        assert_eq!(pow2_f32(0.0), None);
        assert_eq!(pow2_f32(-2.0), Some(-2.0));
        assert_eq!(pow2_f32(2f64.powi(200)), None);
    }
}
