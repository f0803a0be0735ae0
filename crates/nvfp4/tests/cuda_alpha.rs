//! The skeleton's epilogue rounds `alpha × the f32 sum` once (SPEC §3.2, §8) for every alpha
//! (kernels/sm90/store.cuh: in f32 when alpha is a power of two, else the product in f64 rounded
//! once). Exact-tier data makes every f32 sum exact, so the epilogue's is the only rounding and
//! each output must be bit-identical to the CPU reference's (the product in f64, rounded once).
//! Alphas with full 24-bit significands of both signs, alphas whose products fall below f32's
//! normal range or into the output type's subnormals, and alphas whose products overflow to
//! infinity; W4A16 (bf16 and f16 activations, both output types) and W4A4, on the skeleton, on a
//! shape of whole tiles (and the TMA store of a CTA's last tile) and one of edge tiles with L = 2.
//! Outputs are NaN-filled before each launch. Needs an NVIDIA GPU:
//! `cargo test --release --test cuda_alpha -- --ignored`.

use nvfp4::backend::cuda::sm90::Op;
use nvfp4::backend::cuda::{CudaBackend, DeviceOp};
use nvfp4::check::Mode;
use nvfp4::ops::Act;
use nvfp4::problem::{generate, generate16, Problem16, Rng, Shape, Tier};
use nvfp4::{Backend, CpuBackend, Gemm, OutTensor, OutputDtype};

mod common;
use common::{check, gpu, with_forced};

const TYPES: [OutputDtype; 2] = [OutputDtype::Bf16, OutputDtype::F16];

fn shapes() -> [Shape; 2] {
    [Shape::Gemm { m: 256, n: 512, k: 256, l: 1 }, Shape::Gemm { m: 130, n: 200, k: 512, l: 2 }]
}

/// User alphas: full significands of both signs, products below f32's normal range (the exact
/// tier's sums are at most a few hundred; its global scales 2^-2..2^1), products that overflow
/// f16 or both types, and a few with random significands.
fn alphas() -> Vec<f32> {
    let mut v = vec![0.7, -1.234_567_8, 3.3e-3, 0.999_999_94, -7.0e-30, 2.5e-38, 1.0e-40, 3.0e35, -1.5e38, 2.0e4];
    let mut rng = Rng::new(11);
    for _ in 0..4 {
        let significand = f32::from_bits(0x3F80_0000 | rng.below(1 << 23));
        let sign = if rng.below(2) == 1 { -1.0 } else { 1.0 };
        v.push(sign * significand * 2f32.powi(rng.below(20) as i32 - 10));
    }
    v
}

/// The first elements whose bits differ (any NaN matching any NaN), as (index, got, want).
fn differences(got: &OutTensor, want: &OutTensor) -> Vec<(usize, f32, f32)> {
    assert_eq!((got.dtype(), got.shape()), (want.dtype(), want.shape()));
    let (g, w) = (got.to_f32(), want.to_f32());
    (0..g.len())
        .filter(|&i| got.bits()[i] != want.bits()[i] && !(g[i].is_nan() && w[i].is_nan()))
        .map(|i| (i, g[i], w[i]))
        .take(8)
        .collect()
}

/// The W4A16 GEMM `g` on the GPU with outputs of `out`, NaN-filled first.
fn run16(b: &CudaBackend, g: &Gemm<OutTensor>, out: OutputDtype) -> (OutTensor, String) {
    let (a, w) = (b.upload_dense(&g.a).unwrap(), b.upload(&g.b).unwrap());
    let [l, m, _] = g.a.shape();
    let c = b.alloc_output_as([l, m, g.b.rows()], out).unwrap();
    b.poison(&c).unwrap();
    let op = b.bind(DeviceOp::Gemm { a: Act::Dense(&a.view()), b: &w.view(), alpha: g.alpha, c: &c.view() }).unwrap();
    op.launch().unwrap();
    (b.download_out(&c).unwrap(), op.describe())
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn w4a16_alpha_is_rounded_once() {
    let b = gpu();
    let mut special = 0;
    for (i, shape) in shapes().iter().enumerate() {
        for act in TYPES {
            for (j, alpha) in alphas().into_iter().enumerate() {
                let mut p = generate16(shape, act, Tier::Exact, 40 + i as u64).unwrap();
                p.set_alpha(Some(alpha)).unwrap();
                let Problem16::Gemm(g) = &p else { unreachable!("a GEMM shape") };
                let out = TYPES[j % 2];
                let want = CpuBackend.gemm16_as(g, out).unwrap();
                let (got, route) = with_forced(&b, Op::Gemm, "sm90", |b| run16(b, g, out));
                let bad = differences(&got, &want);
                let what = format!("{shape} {act} -> {out}, alpha {alpha:e} ({route})");
                assert!(bad.is_empty(), "{what}: (index, got, want) {bad:?}");
                let v = want.to_f32();
                special += v.iter().filter(|x| x.is_infinite() || (x.abs() < 1e-4 && **x != 0.0)).count();
            }
        }
    }
    // The alphas reach infinities and tiny outputs (below f16's normal range) somewhere.
    assert!(special > 0, "no output overflowed or fell below 1e-4");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn w4a4_alpha_is_rounded_once() {
    let b = gpu();
    for (i, shape) in shapes().iter().enumerate() {
        for alpha in alphas() {
            let mut p = generate(shape, 60 + i as u64).unwrap();
            if p.set_alpha(Some(alpha)).is_err() {
                continue; // a factor the scalar rules refuse (it would overflow f32)
            }
            let what = format!("{shape} W4A4, alpha {alpha:e}");
            with_forced(&b, Op::Gemm, "sm90", |b| check(b, &p, Mode::BitExact, 2, &what));
        }
    }
}
