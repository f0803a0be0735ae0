//! Helpers shared by the GPU test files (`mod common;`): the backend, the poisoned check loop,
//! and the backend with a forced launch configuration.
#![allow(dead_code)] // each test file uses its own subset

use nvfp4::backend::cuda::sm90::{Forced, Op};
use nvfp4::backend::cuda::{CudaBackend, Overrides, Prepared};
use nvfp4::check::{compare_outputs, Mode};
use nvfp4::format::{Nvfp4Tensor, ScaleLayout};
use nvfp4::problem::{Output, Problem};
use nvfp4::CpuBackend;

/// The CUDA backend; a test that needs it fails loudly without one.
pub fn gpu() -> CudaBackend {
    CudaBackend::new().unwrap_or_else(|e| panic!("CUDA backend: {e}"))
}

/// Poison, launch, read back: an unwritten element stays NaN and fails the comparison.
pub fn run_prepared(prep: &mut Prepared) -> Output {
    prep.poison().unwrap();
    prep.launch().unwrap();
    prep.output().unwrap()
}

/// Prepares `p` once and runs it `launches` times (poisoned before each: repeated launches must
/// leave their counters reset), comparing every result with `reference` under `mode`. Returns the
/// launch description; panics naming the case on any mismatch.
pub fn check_against(
    b: &CudaBackend,
    p: &Problem,
    reference: &Output,
    mode: Mode,
    launches: usize,
    what: &str,
) -> String {
    let mut prep = b.prepare(p).unwrap_or_else(|e| panic!("{what}: prepare: {e}"));
    for i in 0..launches {
        let got = run_prepared(&mut prep);
        let report = compare_outputs(&got, reference, mode);
        assert!(report.passed(), "{what} (launch {i}, {}): {report}", prep.describe());
    }
    prep.describe()
}

/// [`check_against`] the CPU backend's output for `p`.
pub fn check(b: &CudaBackend, p: &Problem, mode: Mode, launches: usize, what: &str) -> String {
    check_against(b, p, &p.run(&CpuBackend).unwrap(), mode, launches, what)
}

/// A MoE routing of more than two waves of prefill tiles on an H100's or H200's 132 SMs, with N
/// = 4100 and K = 320: 25 X tiles of 128 rows by 17 W tiles of 256 (the last partial) make 425
/// tile groups of m256n128, so the grouped launch deals two whole waves round robin and shares
/// the rest as stream-K pieces (sm90/grouped.cuh); empty experts among the routed ones.
#[allow(dead_code)] // not every test binary launches it
pub const WAVE_COUNTS: [usize; 14] = [0, 300, 129, 1, 0, 511, 257, 128, 64, 400, 0, 350, 200, 97];
/// N and K of [`WAVE_COUNTS`]'s launch.
#[allow(dead_code)]
pub const WAVE_NK: (usize, usize) = (4100, 320);

/// The forced choice of [`with_forced`] that sends every MoE form the GEMV's `_moe` kernels can
/// read to them (`NVFP4_MOE_GEMV=on`), whatever its rows per expert.
#[allow(dead_code)] // not every test binary forces it
pub const MOE_GEMV: &str = "moe-gemv";

/// `b` routing under `op`'s forced choice `value` (as its `NVFP4_*_SM90` variable would write
/// it, or [`MOE_GEMV`]), for `f`: the overrides are an argument, so tests that force run on any thread.
pub fn with_forced<T>(b: &CudaBackend, op: Op, value: &str, f: impl FnOnce(&CudaBackend) -> T) -> T {
    if value == MOE_GEMV {
        return f(&b.with_overrides(Overrides::moe_gemv(true)));
    }
    let forced = Forced::parse(value).unwrap_or_else(|| panic!("{value}: not a forced choice"));
    let overrides = match op {
        Op::Gemm => Overrides::gemm(forced),
        Op::Dual => Overrides::dual(forced),
        Op::Grouped => Overrides::grouped(forced),
    };
    f(&b.with_overrides(overrides))
}

/// `t` with its scales replaced by pseudo-random e4m3 codes from `codes` (plain layout, seeded
/// by `salt`) and scale `nan_at` a NaN: signed random data whose f32 sums are no longer exact.
pub fn spread_scales(t: &Nvfp4Tensor, salt: u32, codes: std::ops::Range<u8>, nan_at: usize) -> Nvfp4Tensor {
    let mut scales: Vec<u8> = t.scales().to_vec();
    let span = u32::from(codes.end - codes.start);
    for (j, s) in scales.iter_mut().enumerate() {
        let h = (j as u32 ^ salt).wrapping_mul(2654435761) >> 20;
        *s = codes.start + (h % span) as u8;
    }
    scales[nan_at] = 0x7F;
    Nvfp4Tensor::new(t.l(), t.rows(), t.k(), t.values().to_vec(), scales, ScaleLayout::Plain).unwrap()
}
