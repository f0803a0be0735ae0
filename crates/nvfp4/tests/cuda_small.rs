//! GPU tests of the one-launch small GEMM (kernels/gemm_small.cu), forced onto every case through
//! `NVFP4_GEMM_SM90=small`: bit-identical to the CPU reference on the exact generator (ragged M
//! and N at every tile edge, K tails of 16, 32 and 48 elements, K shorter and longer than one
//! chunk per warp, L > 1, both scale layouts and mixed, alpha, f16 and bf16 outputs; outputs
//! poisoned first, two launches each), random signed data with NaN scales in tolerance mode, and
//! the automatic choice on the shape the binding's host-cost script uses. Needs an NVIDIA GPU:
//! `cargo test --release --test cuda_small -- --ignored`.

use nvfp4::backend::cuda::sm90::Op;
use nvfp4::backend::cuda::{small, CudaBackend};
use nvfp4::check::Mode;
use nvfp4::format::ScaleLayout;
use nvfp4::ops::Gemm;
use nvfp4::problem::{generate, Problem, Shape};
use nvfp4::{Backend, CpuBackend, OutputDtype};

mod common;
use common::{check, gpu, spread_scales};

/// `b` with every GEMM forced onto the small kernel (`NVFP4_GEMM_SM90=small`), for `f`.
fn forced<T>(b: &CudaBackend, f: impl FnOnce(&CudaBackend) -> T) -> T {
    common::with_forced(b, Op::Gemm, "small", f)
}

fn gemm(m: usize, n: usize, k: usize, l: usize, seed: u64) -> Problem {
    generate(&Shape::Gemm { m, n, k, l }, seed).unwrap()
}

/// The layouts of A and B per case: plain, blocked, and each mixed.
fn relayout(p: &Problem, i: usize) -> Problem {
    let Problem::Gemm(g) = p else { unreachable!() };
    let (la, lb) = [
        (ScaleLayout::Plain, ScaleLayout::Plain),
        (ScaleLayout::Blocked, ScaleLayout::Blocked),
        (ScaleLayout::Plain, ScaleLayout::Blocked),
        (ScaleLayout::Blocked, ScaleLayout::Plain),
    ][i % 4];
    let alpha = [None, Some(0.375), None, Some(-3.0)][i % 4];
    Problem::Gemm(Gemm::new(g.a.to_layout(la), g.b.to_layout(lb), alpha).unwrap())
}

const SHAPES: [(usize, usize, usize, usize); 12] = [
    (1, 1, 16, 1),
    (16, 32, 64, 1),
    (17, 33, 48, 1),
    (15, 31, 80, 2),
    (128, 256, 256, 1),
    (100, 300, 1040, 1),
    (33, 65, 512, 3),
    (64, 7, 4096, 1),
    (3, 200, 272, 1),
    (250, 9, 96, 2),
    (48, 96, 1008, 1),
    (129, 129, 144, 1),
];

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn small_gemm_bit_exact_every_edge() {
    let b = gpu();
    for (i, &(m, n, k, l)) in SHAPES.iter().enumerate() {
        let p = relayout(&gemm(m, n, k, l, 7000 + i as u64), i);
        let cfg = forced(&b, |b| check(b, &p, Mode::BitExact, 2, &format!("small {m}x{n}x{k}x{l} case {i}")));
        assert!(cfg.starts_with(small::SMALL_SYMBOL), "{cfg}");
        println!("ok {m}x{n}x{k}x{l} case {i}: {cfg}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn small_gemm_bf16_bit_exact() {
    let b = gpu();
    for (i, &(m, n, k, l)) in SHAPES.iter().enumerate().filter(|(i, _)| i % 3 == 1) {
        let p = relayout(&gemm(m, n, k, l, 7100 + i as u64), i);
        let Problem::Gemm(g) = &p else { unreachable!() };
        let want = CpuBackend.gemm_as(g, OutputDtype::Bf16).unwrap();
        forced(&b, |b| {
            let mut prep = b.prepare_as(&p, OutputDtype::Bf16).unwrap();
            assert!(prep.describe().starts_with(small::SMALL_SYMBOL), "{}", prep.describe());
            for launch in 0..2 {
                prep.poison().unwrap();
                prep.launch().unwrap();
                let got = prep.outputs().unwrap();
                assert_eq!(got.len(), 1);
                let bad = (0..want.bits().len()).filter(|&j| got[0].bits()[j] != want.bits()[j]).take(4);
                let bad: Vec<_> = bad.map(|j| (j, got[0].bits()[j], want.bits()[j])).collect();
                assert!(bad.is_empty(), "bf16 {m}x{n}x{k}x{l} launch {launch}: {bad:?}");
            }
        });
        println!("ok bf16 {m}x{n}x{k}x{l}");
    }
}

/// Signed random data with scales spread over 0.125 .. 15 and a NaN scale in each operand: f32
/// sums are no longer exact (tolerance mode), NaN must reach its row and column.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn small_gemm_random_data_and_nan() {
    let b = gpu();
    for (i, &(m, n, k, l)) in [(128, 256, 512, 1), (40, 72, 1024, 2)].iter().enumerate() {
        let Problem::Gemm(g) = gemm(m, n, k, l, 60 + i as u64) else { unreachable!() };
        // e4m3 codes 0x20..0x57 (0.125 .. 15).
        let a = spread_scales(&g.a, 3, 0x20..0x58, 5 * g.a.sf_cols() + 3);
        let bt = spread_scales(&g.b, 4, 0x20..0x58, 17 * g.b.sf_cols());
        let p = Problem::Gemm(Gemm::new(a, bt, Some(0.375)).unwrap());
        for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
            let what = format!("random {m}x{n}x{k}x{l} {layout:?}");
            forced(&b, |b| check(b, &p.with_layout(layout), Mode::Tolerance, 1, &what));
            println!("ok {what}");
        }
    }
}

/// Without forcing, the host-cost script's shape (128x256x256) runs on the small kernel (the rule
/// itself is unit-tested in `small::tests`).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn small_gemm_automatic_choice() {
    let b = gpu();
    let cfg = check(&b, &gemm(128, 256, 256, 1, 5), Mode::BitExact, 1, "128x256x256");
    assert!(cfg.starts_with(small::SMALL_SYMBOL), "{cfg}");
}
