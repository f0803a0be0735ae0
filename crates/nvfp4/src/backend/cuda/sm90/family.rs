//! The skeleton as two kernel families of the router: `sm90` (the GEMM and the fused dual GEMM,
//! one problem per launch) and `grouped` (every group in one persistent launch, list and MoE
//! forms), each for NVFP4 activations (W4A4) and 16-bit ones (W4A16). Each verdict is the
//! skeleton's own rules ([`rejects_for`], [`grouped_rejects_for`]) and plan ([`plan_for`],
//! [`grouped_plan_for`]); each plan binds itself with the skeleton's bind step.

use super::grouped::{bind_grouped, grouped_plan_for, grouped_rejects_for, GroupedOperands, GroupedPlan, GroupedShape};
use super::plan::{plan_for, rejects_for, Forced, Sm90Plan};
use super::{bind, Sm90Kernels, Sm90Operands};
use crate::backend::cuda::device::{DeviceOp, Nvfp4View, Workspace, WorkspaceNeeds};
use crate::backend::cuda::family::{DeviceFacts, Kernels, Launch, Plan, Verdict};
use crate::backend::cuda::kernels::grouped::{PREPARE_SYMBOL, TABLE_SYMBOL};
use crate::backend::cuda::kernels::sm90::{Op as Kind, XKind, DECODE_X, DECODE_X_SYMBOL, THREADS};
use crate::backend::cuda::kernels::KernelModule;
use crate::backend::cuda::overrides::Overrides;
use crate::format::{OutputDtype, PackAct};
use crate::ops::{Op, OpMeta};
use crate::{Error, Result};

/// What X is for an operation's activation: NVFP4, or a 16-bit activation of its type.
fn x_kind(op: &OpMeta) -> XKind {
    op.dense_dtype().map_or(XKind::Nvfp4, XKind::Dense)
}

/// The packed kernels' module and activation type when X is 16-bit and every W operand (one per
/// problem; a dual GEMM's pair together) carries a packed form for X's type; `None` otherwise
/// (the kernels of the weights as they are).
fn packed_for(kind: Kind, x: XKind, weights: &[&Nvfp4View]) -> Option<(&'static KernelModule, PackAct)> {
    let XKind::Dense(d) = x else { return None };
    let act = if d == OutputDtype::Bf16 { PackAct::Bf16 } else { PackAct::F16 };
    let module = kind.packed_module(act)?;
    let all = match (kind, weights) {
        (Kind::Dual, [b1, b2]) => b1.packed_pair_for(b2, act).is_some(),
        (Kind::Dual, _) => false,
        _ => !weights.is_empty() && weights.iter().all(|w| w.packed_for(act).is_some()),
    };
    all.then_some((module, act))
}

/// The `sm90` family's verdict on a GEMM or dual GEMM, W4A4 or W4A16: declined where the
/// skeleton's rules ([`rejects_for`]) or the override say so, or where B1 and B2 have different
/// scale layouts (its W parts share one scale mode); else the plan. A plan with clusters that
/// the GPU cannot hold all at once is planned again without them (the schedule assumes every
/// cluster runs at once).
pub(crate) fn route(op: &OpMeta, facts: &dyn DeviceFacts, overrides: &Overrides) -> Result<Verdict> {
    let x = x_kind(op);
    let (kind, a, b, mixed) = match op {
        Op::Gemm { a, b, .. } => (Kind::Gemm, a, b, false),
        Op::DualGemm { a, b1, b2, .. } => (Kind::Dual, a, b1, b1.layout != b2.layout),
        _ => return Ok(Verdict::NotItsOp),
    };
    if mixed {
        return Ok(Verdict::Declines("B1 and B2 have different scale layouts".into()));
    }
    let mnkl = (a.rows(), b.rows, a.k(), a.l());
    let forced = overrides.forced(kind);
    if let Some(why) = rejects_for(kind, x, mnkl, forced) {
        return Ok(Verdict::Declines(why));
    }
    let sms = facts.sms();
    let mut p = plan_for(kind, x, mnkl, sms, forced);
    if p.launch_cluster() > 1 {
        let smem = p.layout().smem_bytes;
        let fit = facts.clusters_fit(kind.module_for(x), p.symbol(), THREADS, smem, p.launch_cluster())?;
        if fit * p.launch_cluster() < p.grid {
            p = plan_for(kind, x, mnkl, sms, Some(Forced::Config(p.variant, Some(1), None)));
        }
    }
    Ok(Verdict::Takes(Box::new(p)))
}

impl Plan for Sm90Plan {
    fn family(&self) -> &'static str {
        "sm90"
    }
    fn needs(&self) -> WorkspaceNeeds {
        self.scratch().needs
    }
    fn bind(&self, k: &dyn Kernels, op: &DeviceOp<'_>, ws: &Workspace) -> Result<Box<dyn Launch>> {
        let (a, b, alpha, c) = match op {
            Op::Gemm { a, b, alpha, c } => (*a, vec![(*b).clone()], alpha, c),
            Op::DualGemm { a, b1, b2, alpha, c } => (*a, vec![(*b1).clone(), (*b2).clone()], alpha, c),
            _ => return Err(Error::Invalid(format!("a skeleton plan bound to a {}", op.name()))),
        };
        // A weight packed for X's type takes the packed kernels (format/w16_pack.rs), and a
        // packed dual GEMM pair the variants only they have.
        let packed = packed_for(self.op, self.x, &b.iter().collect::<Vec<_>>());
        let sms = k.gpu().info().sms as usize;
        let alt = packed.and_then(|_| self.packed_dual_plan(ws, sms));
        let plan = alt.as_ref().unwrap_or(self);
        let symbol = packed.map_or(plan.symbol(), |(module, _)| plan.variant.symbol_in(module));
        let main = k.function(packed.map_or(plan.op.module_for(plan.x), |(m, _)| m), symbol)?;
        k.gpu().allow_smem(&main, plan.layout().smem_bytes)?;
        // A 16-bit activation is loaded as it is: no pre-pass.
        let decode_x = match plan.x {
            XKind::Nvfp4 => Some(k.function(&DECODE_X, DECODE_X_SYMBOL)?),
            XKind::Dense(_) => None,
        };
        let kernels = Sm90Kernels { main, decode_x, packed: packed.map(|(_, act)| act), symbol };
        let ops = Sm90Operands { a, b: &b, alpha: *alpha, c };
        Ok(Box::new(bind(plan, kernels, &ops, ws)?))
    }
}

impl Sm90Plan {
    /// A W4A16 dual GEMM whose pair is packed has a kernel for every variant, among them those
    /// the W4A16 plan must skip (`W16_SKIPPED`: the unpacked decode spills there): the plan
    /// over every variant, when it picks one of those and needs no more workspace than `ws`
    /// (never for a forced plan: the caller asked for its variant).
    fn packed_dual_plan(&self, ws: &Workspace, sms: usize) -> Option<Sm90Plan> {
        if self.op != Kind::Dual || self.x == XKind::Nvfp4 || self.forced {
            return None;
        }
        let mut alt = plan_for(self.op, XKind::Nvfp4, self.mnkl, sms, None);
        alt.x = self.x;
        (alt.variant != self.variant && !alt.variant.instantiated(self.op, self.x) && ws.holds(alt.scratch().needs))
            .then_some(alt)
    }
}

/// The `grouped` family's verdict on a grouped GEMM (list or MoE form, W4A4 or W4A16): declined
/// where the skeleton's grouped rules ([`grouped_rejects_for`]) or the override say so, else the
/// plan.
pub(crate) fn grouped_route(op: &OpMeta, facts: &dyn DeviceFacts, overrides: &Overrides) -> Result<Verdict> {
    let x = x_kind(op);
    let shape = match op {
        Op::GroupedGemm(groups) => GroupedShape::List(groups.iter().map(|g| (g.a.rows(), g.b.rows, g.a.k())).collect()),
        Op::MoeGemm { a, b, .. } => GroupedShape::Moe { t: a.rows(), n: b.rows, k: a.k(), e: b.l },
        _ => return Ok(Verdict::NotItsOp),
    };
    Ok(match grouped_rejects_for(&shape, x, overrides.grouped) {
        Some(why) => Verdict::Declines(why),
        None => Verdict::Takes(Box::new(grouped_plan_for(&shape, x, facts.sms(), overrides.grouped))),
    })
}

impl Plan for GroupedPlan {
    fn family(&self) -> &'static str {
        "grouped"
    }
    fn needs(&self) -> WorkspaceNeeds {
        self.scratch().needs
    }
    fn bind(&self, k: &dyn Kernels, op: &DeviceOp<'_>, ws: &Workspace) -> Result<Box<dyn Launch>> {
        let ops = match op {
            Op::GroupedGemm(groups) => GroupedOperands::List(groups),
            Op::MoeGemm { a, b, offsets, alpha, c } => GroupedOperands::Moe { a: *a, b, offsets, alpha: *alpha, c },
            _ => return Err(Error::Invalid(format!("a grouped plan bound to a {}", op.name()))),
        };
        let weights: Vec<&Nvfp4View> = match &ops {
            GroupedOperands::List(groups) => groups.iter().map(|g| g.b).collect(),
            GroupedOperands::Moe { b, .. } => vec![*b],
        };
        let packed = packed_for(Kind::Grouped, self.x, &weights);
        let module = packed.map_or(Kind::Grouped.module_for(self.x), |(m, _)| m);
        let symbol = self.variant.symbol_in(module);
        let main = k.function(module, symbol)?;
        k.gpu().allow_smem(&main, self.smem_bytes())?;
        // The pre-pass decodes NVFP4 X and builds the table; with 16-bit activations only the
        // table is built.
        let first = match self.x {
            XKind::Nvfp4 => PREPARE_SYMBOL,
            XKind::Dense(_) => TABLE_SYMBOL,
        };
        let prepare = k.function(module, first)?;
        let packed = packed.map(|(_, act)| (act, symbol));
        Ok(Box::new(bind_grouped(k.gpu(), self, (prepare, main), packed, &ops, ws)?))
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::cuda::family::Modeled;
    use crate::backend::cuda::overrides::Overrides;
    use crate::backend::cuda::route::route;
    use crate::format::{OutputDtype, ScaleLayout};
    use crate::problem::Shape;

    /// W4A16 GEMMs, dual GEMMs and grouped launches (both forms) route to the skeleton's W4A16
    /// kernel of the activation's type, in one family each; the W4A4 form of the same shape keeps
    /// its own kernel; K that the skeleton cannot take goes to the W4A16 fallback.
    #[test]
    fn w4a16_routes_to_the_w4a16_kernels() {
        // (A GEMM of up to 8 activation rows goes to the W4A16 GEMV family, asked before the
        // skeleton.)
        let cases = [
            (Shape::Gemm { m: 9, n: 8192, k: 8192, l: 1 }, "sm90", "gemm"),
            (Shape::Gemm { m: 4096, n: 1024, k: 8192, l: 1 }, "sm90", "gemm"),
            (Shape::Gemm { m: 12, n: 300, k: 96, l: 3 }, "sm90", "gemm"),
            (Shape::DualGemm { m: 256, n: 4096, k: 7168, l: 1 }, "sm90", "dual_gemm"),
            (Shape::GroupedGemm { groups: vec![(40, 512, 256), (512, 384, 256)] }, "grouped", "grouped_gemm"),
            (Shape::Moe { n: 384, k: 512, counts: vec![40, 0, 76, 8] }, "grouped", "grouped_gemm"),
        ];
        for (shape, family, op) in cases {
            for (dtype, ty) in [(OutputDtype::Bf16, "bf16"), (OutputDtype::F16, "f16")] {
                for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
                    let r = route(&shape.op_meta_in(layout, Some(dtype)), &Modeled::HOPPER, &Overrides::NONE)
                        .unwrap_or_else(|e| panic!("{shape} {ty}: {e}"));
                    assert_eq!(r.family(), family, "{shape} {ty}: {r}");
                    assert!(r.plan().starts_with(&format!("{op}_w4a16{ty}_sm90_ws_m")), "{shape} {ty}: {r}");
                    let w4a4 = route(&shape.op_meta(layout), &Modeled::HOPPER, &Overrides::NONE).unwrap();
                    assert!(!w4a4.plan().contains("w4a16"), "{shape}: {w4a4}");
                }
            }
        }
        let one = Shape::Gemm { m: 1, n: 8192, k: 8192, l: 1 }.op_meta_in(ScaleLayout::Plain, Some(OutputDtype::Bf16));
        assert_eq!(route(&one, &Modeled::HOPPER, &Overrides::NONE).unwrap().family(), "gemv16");
        // K the skeleton cannot load goes to the W4A16 fallback, the skeleton's rule printed.
        let k48 = Shape::Gemm { m: 9, n: 64, k: 48, l: 1 }.op_meta_in(ScaleLayout::Plain, Some(OutputDtype::Bf16));
        let r = route(&k48, &Modeled::HOPPER, &Overrides::NONE).unwrap();
        assert_eq!(r.family(), "fallback", "{r}");
        assert!(r.plan().starts_with("gemm_w4a16bf16_sm90_mma") && r.to_string().contains("K = 48"), "{r}");
    }
}
