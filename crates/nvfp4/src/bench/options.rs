//! What a benchmark run measures: the problems, the shape catalogue, samples and warm-up, the
//! protocol, and the generator seed every row shares.

use std::fmt;
use std::str::FromStr;

use super::protocol::Protocol;
use crate::backend::cuda::Overrides;
use crate::problem::{bench_shapes, large_shapes, test_shapes, ProblemKind, Shape};
use crate::{Error, Result};

/// The fewest timed samples a run accepts (a median of fewer is noise).
pub const MIN_SAMPLES: usize = 20;
/// Default timed samples per measurement.
pub const DEFAULT_SAMPLES: usize = 30;
/// Default warm-up launches before them.
pub const DEFAULT_WARMUP: usize = 10;
/// Generator seed of every benchmark problem, fixed so that runs are comparable.
pub const SEED: u64 = 1;

/// Which catalogue of shapes to run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ShapeSet {
    /// The SPEC §6 benchmark (leaderboard) shapes.
    #[default]
    Bench,
    /// The SPEC §6 correctness shapes.
    Test,
    /// Large square GEMMs (4096³, 8192³); the other problems have none.
    Large,
}

impl ShapeSet {
    /// The shapes of `kind` in this set.
    pub fn shapes(self, kind: ProblemKind) -> Vec<Shape> {
        match self {
            ShapeSet::Bench => bench_shapes(kind),
            ShapeSet::Test => test_shapes(kind),
            ShapeSet::Large => large_shapes(kind),
        }
    }
}

impl FromStr for ShapeSet {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "bench" => Ok(ShapeSet::Bench),
            "test" => Ok(ShapeSet::Test),
            "large" => Ok(ShapeSet::Large),
            _ => Err(Error::Invalid(format!("unknown shape set `{s}` (bench, test, large)"))),
        }
    }
}

impl fmt::Display for ShapeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ShapeSet::Bench => "bench",
            ShapeSet::Test => "test",
            ShapeSet::Large => "large",
        })
    }
}

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Problems to run, in order.
    pub problems: Vec<ProblemKind>,
    /// Shape catalogue.
    pub shapes: ShapeSet,
    /// Timed samples per measurement (at least [`MIN_SAMPLES`]).
    pub samples: usize,
    /// Warm-up launches before them.
    pub warmup: usize,
    /// The timing protocol of every row (SPEC §7).
    pub mode: Protocol,
    /// Also time the GPU quantizer (`bench::quantize`, after the problems).
    pub quantize: bool,
    /// Forced configurations and the route printout for the CUDA backend.
    pub overrides: Overrides,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            problems: ProblemKind::ALL.to_vec(),
            shapes: ShapeSet::Bench,
            samples: DEFAULT_SAMPLES,
            warmup: DEFAULT_WARMUP,
            mode: Protocol::Cold,
            quantize: true,
            overrides: Overrides::NONE,
        }
    }
}
