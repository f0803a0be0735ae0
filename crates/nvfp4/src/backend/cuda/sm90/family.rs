//! The skeleton as two kernel families of the router: `sm90` (the GEMM and the fused dual GEMM,
//! one problem per launch) and `grouped` (every group in one persistent launch, list and MoE
//! forms). Each verdict is the skeleton's own rules ([`rejects`], [`grouped_rejects`]) and plan
//! ([`plan`], [`grouped_plan`]); each plan binds itself with the skeleton's bind step.

use super::grouped::{bind_grouped, grouped_plan, grouped_rejects, GroupedOperands, GroupedPlan, GroupedShape};
use super::plan::{plan, rejects, Forced, Sm90Plan};
use super::{bind, Sm90Kernels, Sm90Operands};
use crate::backend::cuda::device::{DeviceOp, Nvfp4GemmViews, Workspace, WorkspaceNeeds};
use crate::backend::cuda::family::{nvfp4_act, w4a4_only, DeviceFacts, Kernels, Launch, Plan, Verdict};
use crate::backend::cuda::kernels::grouped::PREPARE_SYMBOL;
use crate::backend::cuda::kernels::sm90::{Op as Kind, DECODE_X, DECODE_X_SYMBOL, THREADS};
use crate::backend::cuda::overrides::Overrides;
use crate::ops::{Group, Op, OpMeta};
use crate::{Error, Result};

/// The `sm90` family's verdict on a GEMM or dual GEMM: declined where the skeleton's rules
/// ([`rejects`]) or the override say so, or where B1 and B2 have different scale layouts (its W
/// parts share one scale mode); else the plan. A plan with clusters that the GPU cannot hold all
/// at once is planned again without them (the schedule assumes every cluster runs at once).
pub(crate) fn route(op: &OpMeta, facts: &dyn DeviceFacts, overrides: &Overrides) -> Result<Verdict> {
    if let Some(v) = w4a4_only(op) {
        return Ok(v);
    }
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
    if let Some(why) = rejects(kind, mnkl, forced) {
        return Ok(Verdict::Declines(why));
    }
    let sms = facts.sms();
    let mut p = plan(kind, mnkl, sms, forced);
    if p.launch_cluster() > 1 {
        let smem = p.layout().smem_bytes;
        let fit = facts.clusters_fit(kind.module(), p.symbol(), THREADS, smem, p.launch_cluster())?;
        if fit * p.launch_cluster() < p.grid {
            p = plan(kind, mnkl, sms, Some(Forced::Config(p.variant, Some(1), None)));
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
            Op::Gemm { a, b, alpha, c } => (nvfp4_act(a, "sm90")?, vec![(*b).clone()], alpha, c),
            Op::DualGemm { a, b1, b2, alpha, c } => {
                (nvfp4_act(a, "sm90")?, vec![(*b1).clone(), (*b2).clone()], alpha, c)
            }
            _ => return Err(Error::Invalid(format!("a skeleton plan bound to a {}", op.name()))),
        };
        let main = k.function(self.op.module(), self.symbol())?;
        k.gpu().allow_smem(&main, self.layout().smem_bytes)?;
        let kernels = Sm90Kernels { main, decode_x: k.function(&DECODE_X, DECODE_X_SYMBOL)? };
        let ops = Sm90Operands { a, b: &b, alpha: *alpha, c };
        Ok(Box::new(bind(self, kernels, &ops, ws)?))
    }
}

/// The `grouped` family's verdict on a grouped GEMM (list or MoE form): declined where the
/// skeleton's grouped rules ([`grouped_rejects`]) or the override say so, else the plan.
pub(crate) fn grouped_route(op: &OpMeta, facts: &dyn DeviceFacts, overrides: &Overrides) -> Result<Verdict> {
    if let Some(v) = w4a4_only(op) {
        return Ok(v);
    }
    let shape = match op {
        Op::GroupedGemm(groups) => GroupedShape::List(groups.iter().map(|g| (g.a.rows(), g.b.rows, g.a.k())).collect()),
        Op::MoeGemm { a, b, .. } => GroupedShape::Moe { t: a.rows(), n: b.rows, k: a.k(), e: b.l },
        _ => return Ok(Verdict::NotItsOp),
    };
    Ok(match grouped_rejects(&shape, overrides.grouped) {
        Some(why) => Verdict::Declines(why),
        None => Verdict::Takes(Box::new(grouped_plan(&shape, facts.sms(), overrides.grouped))),
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
        let list: Vec<Nvfp4GemmViews<'_>>;
        let ops = match op {
            Op::GroupedGemm(groups) => {
                list = groups
                    .iter()
                    .map(|g| Ok(Group { a: nvfp4_act(&g.a, "grouped")?, b: g.b, alpha: g.alpha, c: g.c }))
                    .collect::<Result<_>>()?;
                GroupedOperands::List(&list)
            }
            Op::MoeGemm { a, b, offsets, alpha, c } => {
                GroupedOperands::Moe { a: nvfp4_act(a, "grouped")?, b, offsets, alpha: *alpha, c }
            }
            _ => return Err(Error::Invalid(format!("a grouped plan bound to a {}", op.name()))),
        };
        let main = k.function(Kind::Grouped.module(), self.symbol())?;
        k.gpu().allow_smem(&main, self.smem_bytes())?;
        let prepare = k.function(Kind::Grouped.module(), PREPARE_SYMBOL)?;
        Ok(Box::new(bind_grouped(k.gpu(), self, (prepare, main), &ops, ws)?))
    }
}
