//! Which kernel family runs an operation, and with which plan: a pure function of the
//! operation's metadata, the device's facts and the overrides ([`route`]), printable and tested
//! without a GPU.
//!
//! Every family (`family.rs`) says, for an operation, whether it takes it (with its plan),
//! declines it with the rule that stops it (a shape it cannot index, an alignment, an override),
//! or has no kernel for that operation at all. The router asks the families of `FAMILIES` in
//! order and takes the first plan; the declines before it say why the others did not run.
//! Adding a family is one entry in `FAMILIES`, its plan and launch types and its kernel file.

use std::fmt;

use super::family::{DeviceFacts, Family, Plan, Verdict};
use super::overrides::Overrides;
use crate::ops::OpMeta;
use crate::{Error, Result};

/// The families, in the order the router asks them: the GEMV; the W4A16 GEMV (a 16-bit vector,
/// or a W4A16 GEMM of one activation row); the one-launch small GEMM where it measured faster;
/// the Hopper skeleton (GEMM, dual GEMM); the GEMV's MoE form for few rows per expert; the
/// skeleton's grouped launch (list and MoE forms); the
/// mma.sync fallback, which takes any GEMM, dual GEMM or list of groups the others decline (W4A4
/// or W4A16), and the W4A16 MoE form.
pub(crate) static FAMILIES: [Family; 7] = [
    Family { name: "gemv", route: super::gemv::route },
    Family { name: "gemv16", route: super::gemv16::route },
    Family { name: "small", route: super::small::route },
    Family { name: "sm90", route: super::sm90::route },
    Family { name: "gemv16_moe", route: super::gemv16_moe::route },
    Family { name: "grouped", route: super::sm90::grouped_route },
    Family { name: "fallback", route: super::fallback::route },
];

/// An operation's route: the plan that runs it and why the families before it did not.
pub struct Route {
    pub(crate) plan: Box<dyn Plan>,
    declined: Vec<(&'static str, String)>,
}

impl Route {
    /// The family that runs the operation.
    pub fn family(&self) -> &'static str {
        self.plan.family()
    }
    /// Its plan, printed (kernel symbol, tiles, grid, schedule: what `describe` gave).
    pub fn plan(&self) -> String {
        self.plan.to_string()
    }
    /// (family, rule) of each family asked before it that declined the operation.
    pub fn declined(&self) -> &[(&'static str, String)] {
        &self.declined
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.plan.family(), self.plan)?;
        for (family, why) in &self.declined {
            write!(f, " [not {family}: {why}]")?;
        }
        Ok(())
    }
}

/// The route of `op` (whose rules it checks first: [`Op::validate`](crate::ops::Op::validate)).
/// No family taking it is a shape error naming every family's rule.
pub fn route(op: &OpMeta, facts: &dyn DeviceFacts, overrides: &Overrides) -> Result<Route> {
    op.validate()?;
    let mut declined = Vec::new();
    for family in &FAMILIES {
        match (family.route)(op, facts, overrides)? {
            Verdict::Takes(plan) => return Ok(Route { plan, declined }),
            Verdict::Declines(why) => declined.push((family.name, why)),
            Verdict::NotItsOp => {}
        }
    }
    let why: Vec<String> = declined.iter().map(|(f, w)| format!("{f}: {w}")).collect();
    Err(Error::Shape(format!("{}: no kernel takes it ({})", op.name(), why.join("; "))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::family::Modeled;
    use crate::backend::cuda::sm90::{rejects, Forced, Op as Kind};
    use crate::backend::cuda::small;
    use crate::check::cases;
    use crate::problem::{bench_shapes, large_shapes, test_shapes, ProblemKind, Shape};
    use crate::ScaleLayout;

    /// Every shape of the catalogue (tests, benchmarks, large) and of `nvfp4 check` (its edge
    /// shapes included), in both scale layouts.
    fn every_shape() -> Vec<(Shape, ScaleLayout)> {
        let mut shapes = Vec::new();
        for kind in ProblemKind::ALL {
            shapes.extend(test_shapes(kind));
            shapes.extend(bench_shapes(kind));
            shapes.extend(large_shapes(kind));
            shapes.extend(cases(kind, 1).into_iter().map(|c| c.shape));
        }
        shapes.into_iter().flat_map(|s| [(s.clone(), ScaleLayout::Plain), (s, ScaleLayout::Blocked)]).collect()
    }

    /// The family each operation must take: the GEMV and a GEMM of one row the GEMV kernel, of up
    /// to 8 rows the W4A16 GEMV's `_cols` kernels (NVFP4 activations decoded); a GEMM the small
    /// kernel where
    /// that measured faster, else the skeleton where its rules allow, else the fallback; a dual
    /// GEMM the skeleton or the fallback; a list of groups the grouped launch when every group
    /// suits it, else the fallback; the MoE form the GEMV's `_moe` kernels at batch-1-like
    /// routings and for K < 64 (no grouped launch reads it), else the grouped launch.
    fn expected(shape: &Shape) -> Option<&'static str> {
        let sm90_takes = |kind, mnkl| rejects(kind, mnkl, None).is_none();
        Some(match *shape {
            Shape::Gemv { .. } | Shape::Gemm { m: 1, .. } => "gemv",
            Shape::Gemm { m, .. } if m <= crate::backend::cuda::kernels::gemv16::MAX_COLS => "gemv16",
            Shape::Gemm { m, n, k, l } if small::chosen((m, n, k, l), 132, None) => "small",
            Shape::Gemm { m, n, k, l } if sm90_takes(Kind::Gemm, (m, n, k, l)) => "sm90",
            Shape::DualGemm { m, n, k, l } if sm90_takes(Kind::Dual, (m, n, k, l)) => "sm90",
            Shape::Gemm { .. } | Shape::DualGemm { .. } => "fallback",
            Shape::GroupedGemm { ref groups }
                if groups.iter().all(|&(m, n, k)| sm90_takes(Kind::Gemm, (m, n, k, 1))) =>
            {
                "grouped"
            }
            Shape::GroupedGemm { .. } => "fallback",
            Shape::Moe { n, k, ref counts }
                if k % 32 == 0
                    && counts.len() <= crate::backend::cuda::kernels::gemv16::MOE_MAX_EXPERTS
                    && (k < 64
                        || crate::backend::cuda::gemv16_moe::takes_by_default((
                            counts.iter().sum::<usize>(),
                            n,
                            k,
                            counts.len(),
                        ))) =>
            {
                "gemv16_moe"
            }
            Shape::Moe { k, .. } if k % 32 == 0 && k >= 64 => "grouped",
            Shape::Moe { .. } => return None,
        })
    }

    #[test]
    #[allow(clippy::print_stdout)] // the routes, for review: `cargo test route -- --nocapture`
    fn every_catalogue_and_check_shape_routes_to_its_family() {
        let shapes = every_shape();
        assert!(shapes.len() > 100);
        for (shape, layout) in &shapes {
            let op = shape.op_meta(*layout);
            match (route(&op, &Modeled::HOPPER, &Overrides::NONE), expected(shape)) {
                (Ok(r), Some(family)) => {
                    assert_eq!(r.family(), family, "{shape} {layout:?}: {r}");
                    // The families asked before it said why they did not take it.
                    let before = FAMILIES.iter().take_while(|f| f.name != family).count();
                    assert!(r.declined().len() <= before, "{shape}: {r}");
                    if family == "fallback" {
                        assert!(r.declined().iter().any(|(f, _)| *f == "sm90" || *f == "grouped"), "{shape}: {r}");
                    }
                    println!("{shape} {layout:?} -> {r}");
                }
                (Err(e), None) => {
                    assert!(e.to_string().contains("no kernel takes it"), "{shape}: {e}");
                    println!("{shape} {layout:?} -> refused: {e}");
                }
                (r, want) => panic!("{shape} {layout:?}: routed {:?}, expected {want:?}", r.map(|r| r.to_string())),
            }
        }
    }

    /// In W4A16 (either activation type) every shape routes: one activation row to the W4A16
    /// GEMV, the rest to the skeleton where its rules allow, else to the fallback, which says why
    /// the skeleton did not take it.
    #[test]
    fn every_w4a16_shape_routes() {
        for (shape, layout) in every_shape() {
            for dtype in [crate::OutputDtype::Bf16, crate::OutputDtype::F16] {
                let op = shape.op_meta_in(layout, Some(dtype));
                let r =
                    route(&op, &Modeled::HOPPER, &Overrides::NONE).unwrap_or_else(|e| panic!("{shape} {dtype}: {e}"));
                assert!(["gemv16", "sm90", "gemv16_moe", "grouped", "fallback"].contains(&r.family()), "{shape}: {r}");
                if r.family() == "fallback" {
                    assert!(r.declined().iter().any(|(f, _)| *f == "sm90" || *f == "grouped"), "{shape}: {r}");
                }
            }
        }
    }

    #[test]
    fn the_contest_benchmarks_take_the_fast_families() {
        let families = |kind| -> Vec<&'static str> {
            bench_shapes(kind)
                .iter()
                .map(|s| route(&s.op_meta(ScaleLayout::Plain), &Modeled::HOPPER, &Overrides::NONE).unwrap().family())
                .collect()
        };
        assert_eq!(families(ProblemKind::Gemv), ["gemv"; 3]);
        assert_eq!(families(ProblemKind::Gemm), ["sm90"; 3]);
        assert_eq!(families(ProblemKind::DualGemm), ["sm90"; 4]);
        assert_eq!(families(ProblemKind::GroupedGemm), ["grouped"; 4]);
        let small = Shape::Gemm { m: 128, n: 256, k: 256, l: 1 }.op_meta(ScaleLayout::Plain);
        assert_eq!(route(&small, &Modeled::HOPPER, &Overrides::NONE).unwrap().family(), "small");
    }

    #[test]
    fn overrides_steer_the_route_and_say_so() {
        let gemm = Shape::Gemm { m: 128, n: 256, k: 256, l: 1 }.op_meta(ScaleLayout::Plain);
        let on = |ov: Overrides| route(&gemm, &Modeled::HOPPER, &ov).unwrap();
        assert_eq!(on(Overrides::gemm(Forced::Skeleton)).family(), "sm90");
        let off = on(Overrides::gemm(Forced::Off));
        assert_eq!(off.family(), "fallback");
        assert!(off.to_string().contains("NVFP4_GEMM_SM90=off"), "{off}");
        let big = Shape::Gemm { m: 4096, n: 4096, k: 4096, l: 1 }.op_meta(ScaleLayout::Plain);
        assert_eq!(route(&big, &Modeled::HOPPER, &Overrides::gemm(Forced::Small)).unwrap().family(), "small");
        // One operation's override leaves the others alone.
        let dual = Shape::DualGemm { m: 256, n: 512, k: 256, l: 1 }.op_meta(ScaleLayout::Plain);
        assert_eq!(route(&dual, &Modeled::HOPPER, &Overrides::gemm(Forced::Off)).unwrap().family(), "sm90");
        assert_eq!(route(&dual, &Modeled::HOPPER, &Overrides::dual(Forced::Off)).unwrap().family(), "fallback");
        // The MoE form has no other family: off is an error naming the rule.
        let moe = Shape::Moe { n: 256, k: 256, counts: vec![3, 0, 9] }.op_meta(ScaleLayout::Plain);
        let e = route(&moe, &Modeled::HOPPER, &Overrides::grouped(Forced::Off)).err().expect("refused");
        assert!(e.to_string().contains("NVFP4_GROUPED_SM90=off"), "{e}");
    }

    #[test]
    fn a_gemv_with_two_layouts_and_bad_operations_are_typed_errors() {
        let mut gemv = Shape::Gemv { m: 128, k: 256, l: 1 }.op_meta(ScaleLayout::Plain);
        if let crate::ops::Op::Gemv { b: crate::ops::Act::Nvfp4(b), .. } = &mut gemv {
            b.layout = ScaleLayout::Blocked;
        }
        let e = route(&gemv, &Modeled::HOPPER, &Overrides::NONE).err().expect("refused");
        assert!(matches!(e, Error::Shape(_)) && e.to_string().contains("share one scale layout"), "{e}");
        let mut gemm = Shape::Gemm { m: 8, n: 8, k: 64, l: 1 }.op_meta(ScaleLayout::Plain);
        if let crate::ops::Op::Gemm { b, .. } = &mut gemm {
            b.k = 128;
        }
        let e = route(&gemm, &Modeled::HOPPER, &Overrides::NONE).err().expect("refused");
        assert!(e.to_string().contains("reduction lengths differ"), "{e}");
    }
}
