//! The SPEC §6 shape catalogue, addressable as `test:N` / `bench:N` (N counts from 0).

use std::str::FromStr;

use super::{ProblemKind, Shape};
use crate::{Error, Result};

fn gemv(m: usize, k: usize, l: usize) -> Shape {
    Shape::Gemv { m, k, l }
}
fn gemm(m: usize, n: usize, k: usize) -> Shape {
    Shape::Gemm { m, n, k, l: 1 }
}
fn dual(m: usize, n: usize, k: usize) -> Shape {
    Shape::DualGemm { m, n, k, l: 1 }
}
fn grouped(ms: &[usize], ns: &[usize], ks: &[usize]) -> Shape {
    let at = |v: &[usize], i: usize| if v.len() == 1 { v[0] } else { v[i] };
    Shape::GroupedGemm { groups: (0..ms.len()).map(|i| (ms[i], at(ns, i), at(ks, i))).collect() }
}

/// Correctness shapes: every one must pass on every backend.
pub fn test_shapes(kind: ProblemKind) -> Vec<Shape> {
    match kind {
        ProblemKind::Gemv => vec![
            gemv(128, 256, 1),
            gemv(128, 1536, 1),
            gemv(128, 3072, 1),
            gemv(256, 7168, 1),
            gemv(2432, 4608, 2),
            gemv(384, 7168, 2),
            gemv(512, 512, 2),
            gemv(512, 4096, 2),
            gemv(512, 1536, 2),
        ],
        ProblemKind::Gemm => vec![
            gemm(128, 256, 256),
            gemm(128, 1536, 7168),
            gemm(128, 3072, 1536),
            gemm(256, 7168, 256),
            gemm(256, 7168, 2048),
            gemm(2304, 4608, 7168),
            gemm(384, 7168, 2304),
            gemm(512, 512, 7168),
            gemm(512, 4096, 512),
            gemm(512, 1536, 7168),
        ],
        ProblemKind::DualGemm => vec![
            dual(1536, 512, 7168),
            dual(256, 512, 256),
            dual(3072, 1024, 1536),
            dual(7168, 1024, 256),
            dual(7168, 2304, 2048),
            dual(4608, 384, 7168),
            dual(7168, 384, 2304),
            dual(512, 768, 7168),
            dual(4096, 768, 512),
        ],
        ProblemKind::GroupedGemm => vec![
            grouped(&[96, 128], &[128, 256], &[256, 512]),
            grouped(&[256, 72], &[512, 384], &[256, 256]),
            grouped(&[128, 128], &[128, 256], &[512, 256]),
            grouped(&[80, 128, 256], &[384, 256, 128], &[256, 512, 256]),
            grouped(&[64, 72, 96], &[128, 384, 512], &[512, 512, 256]),
            grouped(&[64, 256, 128], &[768, 128, 256], &[512, 256, 512]),
            grouped(&[128, 128, 64], &[256, 512, 512], &[768, 256, 768]),
            grouped(&[128; 4], &[128; 4], &[512, 256, 512, 256]),
            grouped(&[40, 56, 384, 512], &[512, 384, 256, 128], &[256; 4]),
            grouped(&[512, 384, 256, 128], &[256; 4], &[512, 768, 512, 768]),
        ],
    }
}

/// Performance shapes: the leaderboard set.
pub fn bench_shapes(kind: ProblemKind) -> Vec<Shape> {
    match kind {
        ProblemKind::Gemv => vec![gemv(7168, 16384, 1), gemv(4096, 7168, 8), gemv(7168, 2048, 4)],
        ProblemKind::Gemm => vec![gemm(128, 7168, 16384), gemm(128, 4096, 7168), gemm(128, 7168, 2048)],
        ProblemKind::DualGemm => {
            vec![dual(256, 4096, 7168), dual(512, 4096, 7168), dual(256, 3072, 4096), dual(512, 3072, 7168)]
        }
        ProblemKind::GroupedGemm => vec![
            grouped(&[80, 176, 128, 72, 64, 248, 96, 160], &[4096], &[7168]),
            grouped(&[40, 76, 168, 72, 164, 148, 196, 160], &[7168], &[2048]),
            grouped(&[192, 320], &[3072], &[4096]),
            grouped(&[128, 384], &[4096], &[1536]),
        ],
    }
}

/// Large square shapes for comparing sustained throughput with cuBLAS (GEMM only).
pub fn large_shapes(kind: ProblemKind) -> Vec<Shape> {
    match kind {
        ProblemKind::Gemm => vec![gemm(4096, 4096, 4096), gemm(8192, 8192, 8192)],
        _ => Vec::new(),
    }
}

/// A catalogue entry: `test:N` or `bench:N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    /// Index into [`test_shapes`].
    Test(usize),
    /// Index into [`bench_shapes`].
    Bench(usize),
}

impl FromStr for Case {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::UnknownCase(s.to_string());
        let (set, idx) = s.split_once(':').ok_or_else(bad)?;
        let idx: usize = idx.parse().map_err(|_| bad())?;
        match set {
            "test" => Ok(Case::Test(idx)),
            "bench" => Ok(Case::Bench(idx)),
            _ => Err(bad()),
        }
    }
}

impl Case {
    /// The shape this case names for `kind`.
    pub fn shape(self, kind: ProblemKind) -> Result<Shape> {
        let (list, idx, name) = match self {
            Case::Test(i) => (test_shapes(kind), i, "test"),
            Case::Bench(i) => (bench_shapes(kind), i, "bench"),
        };
        let len = list.len();
        list.into_iter()
            .nth(idx)
            .ok_or_else(|| Error::UnknownCase(format!("{name}:{idx} ({kind} has {name}:0..{name}:{})", len - 1)))
    }
}
