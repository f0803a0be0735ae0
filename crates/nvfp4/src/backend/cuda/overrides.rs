//! Forced launch configurations and the route printout: what the `NVFP4_*_SM90` and
//! `NVFP4_PRINT_CONFIG` variables ask for, read once where a program starts (the CLI, the Python
//! package, the examples: [`Overrides::from_env`]) and passed to the backend as an argument
//! ([`CudaBackend::with_overrides`](super::CudaBackend::with_overrides)). Nothing below the
//! edges reads the environment for them, so tests build the overrides they need and run on any
//! number of threads.

use std::io::Write;

use super::kernels::sm90::Op;
use super::sm90::Forced;

/// What a program asks of the router and the bind step beyond the problem itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    /// The GEMM's forced choice (`NVFP4_GEMM_SM90`).
    pub gemm: Option<Forced>,
    /// The dual GEMM's (`NVFP4_DUAL_SM90`; `small` is not one: there is no small dual kernel).
    pub dual: Option<Forced>,
    /// The grouped GEMM's (`NVFP4_GROUPED_SM90`; not `small` either).
    pub grouped: Option<Forced>,
    /// The MoE form on the GEMV's `_moe` kernels (`NVFP4_MOE_GEMV`): `on` takes every routing
    /// its kernels can index, whatever its rows per expert; `off` none.
    pub moe_gemv: Option<bool>,
    /// Print each operation's route to stderr when it is bound (`NVFP4_PRINT_CONFIG=1`).
    pub print_routes: bool,
}

impl Overrides {
    /// None forced, nothing printed.
    pub const NONE: Self = Self { gemm: None, dual: None, grouped: None, moe_gemv: None, print_routes: false };

    /// The overrides the environment asks for. A value that names nothing known is ignored with
    /// a warning on stderr (a typo must not silently time the wrong kernel).
    pub fn from_env() -> Self {
        let forced = |op: Op| {
            let var = Forced::var(op);
            let value = std::env::var(var).ok()?;
            let ignored = |why: &str| {
                // Not eprintln!, which panics when stderr is closed.
                let _ = writeln!(std::io::stderr(), "nvfp4: {var}={value} ignored: {why}");
                None
            };
            match Forced::parse(&value) {
                Some(Forced::Small) if op != Op::Gemm => ignored("only the GEMM has a small kernel"),
                Some(f) => Some(f),
                None => ignored("not off, small, sm90 or a variant such as m256n64c1s2"),
            }
        };
        let moe_gemv = std::env::var("NVFP4_MOE_GEMV").ok().and_then(|v| match v.as_str() {
            "on" => Some(true),
            "off" => Some(false),
            _ => {
                let _ = writeln!(std::io::stderr(), "nvfp4: NVFP4_MOE_GEMV={v} ignored: not on or off");
                None
            }
        });
        Self {
            gemm: forced(Op::Gemm),
            dual: forced(Op::Dual),
            grouped: forced(Op::Grouped),
            moe_gemv,
            print_routes: std::env::var("NVFP4_PRINT_CONFIG").is_ok_and(|v| v == "1"),
        }
    }

    /// Only the GEMM forced to `f`.
    pub fn gemm(f: Forced) -> Self {
        Self { gemm: Some(f), ..Self::NONE }
    }
    /// Only the dual GEMM forced to `f`.
    pub fn dual(f: Forced) -> Self {
        Self { dual: Some(f), ..Self::NONE }
    }
    /// Only the grouped GEMM forced to `f`.
    pub fn grouped(f: Forced) -> Self {
        Self { grouped: Some(f), ..Self::NONE }
    }
    /// Only the MoE form on the GEMV forced on or off.
    pub fn moe_gemv(on: bool) -> Self {
        Self { moe_gemv: Some(on), ..Self::NONE }
    }

    /// The forced choice for skeleton operation `op`.
    pub fn forced(&self, op: Op) -> Option<Forced> {
        match op {
            Op::Gemm => self.gemm,
            Op::Dual => self.dual,
            Op::Grouped => self.grouped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_operation_has_its_own() {
        assert_eq!(Overrides::dual(Forced::Off).forced(Op::Dual), Some(Forced::Off));
        assert_eq!(Overrides::dual(Forced::Off).forced(Op::Gemm), None);
    }
}
