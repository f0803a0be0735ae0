//! W4A16 on the Hopper skeleton (SPEC §8, issue 21): bf16 and f16 activations times NVFP4
//! weights, for the GEMM, the dual GEMM, the grouped list and its MoE form, in both scale layouts,
//! against the CPU reference's W4A16 form (`CpuBackend::*16_as`).
//!
//! Tiers: exact data (activations {0, ±0.5, ±1, ±1.5, ±2} x 2^-1..1, weights with scale codes
//! 0..3: every f32 sum is exact) bit-identical, with odd sizes (M and N off the tiles, K a
//! multiple of 32 but not of 64 or 256: the direct-copy plain scales and a half sub-stage) and
//! every tile variant, split and stream-K, CTA pairs and the cluster sum of K pieces forced;
//! random data (Gaussian-like activations, weights quantized with a ModelOpt global scale, an
//! alpha) within SPEC §4's tolerance (bf16 outputs: 2^-7 relative, one bf16 rounding); a NaN
//! scale poisons exactly its weight row's output column, and NaN in the blocked layout's padding
//! past K poisons nothing; launches on a busy side stream; a W4A16 GEMM chained (programmatic
//! dependent launch) behind the W4A4 GEMM that writes its activation; the MoE form's per-expert
//! alphas (cuda_w4a16/moe_alpha.rs). Outputs are NaN-filled before every launch, so an unwritten
//! element fails. Needs an NVIDIA GPU:
//! `cargo test --release --test cuda_w4a16 -- --ignored`.

use cudarc::driver::CudaStream;
use nvfp4::backend::cuda::gemv16_moe::takes_by_default;
use nvfp4::backend::cuda::sm90::Op;
use nvfp4::backend::cuda::{CudaBackend, DeviceF16, DeviceNvfp4, DeviceOp, DevicePacked, GemmViews, Nvfp4View};
use nvfp4::format::{quantize, GlobalScale, PackAct};
use nvfp4::ops::Act;
use nvfp4::problem::{generate, Problem, Rng, Shape};
use nvfp4::{
    Backend, CpuBackend, DualGemm, Gemm, GroupedGemm, MoeGemm, Nvfp4Tensor, OutTensor, OutputDtype, ScaleLayout,
};

mod common;
use common::{gpu, with_forced, MOE_GEMV, WAVE_COUNTS, WAVE_NK};

// The mma.sync fallback's shapes (cuda_w4a16/fallback.rs).
#[path = "cuda_w4a16/fallback.rs"]
mod fallback;
// The weights' packed form (cuda_w4a16/packed.rs).
#[path = "cuda_w4a16/packed.rs"]
mod packed;
// The MoE form's per-expert alphas on both routes (cuda_w4a16/moe_alpha.rs).
#[path = "cuda_w4a16/moe_alpha.rs"]
mod moe_alpha;

const TYPES: [OutputDtype; 2] = [OutputDtype::Bf16, OutputDtype::F16];
const LAYOUTS: [ScaleLayout; 2] = [ScaleLayout::Plain, ScaleLayout::Blocked];

/// `[l, rows, k]` activations whose products with exact weights sum exactly in f32.
fn exact_activation(rng: &mut Rng, [l, rows, k]: [usize; 3], dtype: OutputDtype) -> OutTensor {
    const MAG: [f32; 5] = [0.0, 0.5, 1.0, 1.5, 2.0];
    let bits = (0..l * rows * k)
        .map(|_| {
            let v = MAG[rng.below(5) as usize] * 2f32.powi(rng.below(3) as i32 - 1);
            dtype.round_f32(if rng.below(2) == 1 { -v } else { v })
        })
        .collect();
    OutTensor::new(dtype, [l, rows, k], bits).unwrap()
}

/// `[l, rows, k]` Gaussian-like activations (a sum of four uniforms), rounded to `dtype`.
fn random_activation(rng: &mut Rng, [l, rows, k]: [usize; 3], dtype: OutputDtype) -> OutTensor {
    let bits =
        (0..l * rows * k).map(|_| dtype.round_f32((0..4).map(|_| rng.unit_f32()).sum::<f32>() * 1.7 - 3.4)).collect();
    OutTensor::new(dtype, [l, rows, k], bits).unwrap()
}

/// `[l, rows, k]` weights: every e2m1 code (-0 included), scale codes 0..3 (so that sums stay
/// exact), in `layout`.
fn exact_weights(rng: &mut Rng, [l, rows, k]: [usize; 3], layout: ScaleLayout) -> Nvfp4Tensor {
    let values = (0..l * rows * k / 2).map(|_| rng.below(256) as u8).collect();
    let scales = (0..l * rows * k / 16).map(|_| rng.below(4) as u8).collect();
    Nvfp4Tensor::new(l, rows, k, values, scales, ScaleLayout::Plain).unwrap().to_layout(layout)
}

/// `[l, rows, k]` weights quantized from Gaussian-like data with the ModelOpt global scale.
fn random_weights(rng: &mut Rng, [l, rows, k]: [usize; 3], layout: ScaleLayout) -> Nvfp4Tensor {
    let x: Vec<f32> = (0..l * rows * k).map(|_| (0..4).map(|_| rng.unit_f32()).sum::<f32>() - 2.0).collect();
    quantize(&x, l, rows, k, GlobalScale::Auto).unwrap().to_layout(layout)
}

/// One W4A16 operation on host data.
enum W16 {
    Gemm(Gemm<OutTensor>),
    Dual(DualGemm<OutTensor>),
    Grouped(GroupedGemm<OutTensor>),
    Moe(MoeGemm<OutTensor>),
}

/// The data of a case: exact (bit-identical tier) or random (tolerance tier).
#[derive(Clone, Copy, PartialEq)]
enum Data {
    Exact,
    Random,
}

impl W16 {
    /// `shape` with activations of `dtype` and weights in `layout`, from `seed`.
    fn make(shape: &Shape, dtype: OutputDtype, layout: ScaleLayout, data: Data, seed: u64) -> W16 {
        let mut rng = Rng::new(seed);
        let act = |rng: &mut Rng, s| match data {
            Data::Exact => exact_activation(rng, s, dtype),
            Data::Random => random_activation(rng, s, dtype),
        };
        let weights = |rng: &mut Rng, s| match data {
            Data::Exact => exact_weights(rng, s, layout),
            Data::Random => random_weights(rng, s, layout),
        };
        let alpha = if data == Data::Random { Some(0.7) } else { None };
        match *shape {
            Shape::Gemm { m, n, k, l } => {
                W16::Gemm(Gemm::new(act(&mut rng, [l, m, k]), weights(&mut rng, [l, n, k]), alpha).unwrap())
            }
            Shape::DualGemm { m, n, k, l } => {
                let a = act(&mut rng, [l, m, k]);
                let (b1, b2) = (weights(&mut rng, [l, n, k]), weights(&mut rng, [l, n, k]));
                W16::Dual(DualGemm::new(a, b1, b2, alpha).unwrap())
            }
            Shape::GroupedGemm { ref groups } => W16::Grouped(
                GroupedGemm::new(
                    groups
                        .iter()
                        .map(|&(m, n, k)| Gemm::new(act(&mut rng, [1, m, k]), weights(&mut rng, [1, n, k]), alpha))
                        .collect::<nvfp4::Result<_>>()
                        .unwrap(),
                )
                .unwrap(),
            ),
            Shape::Moe { n, k, ref counts } => {
                let t = counts.iter().sum();
                let ends = counts.iter().scan(0, |end, &c| {
                    *end += c as i32;
                    Some(*end)
                });
                let (a, b) = (act(&mut rng, [1, t, k]), weights(&mut rng, [counts.len(), n, k]));
                W16::Moe(MoeGemm::new(a, b, ends.collect(), alpha).unwrap())
            }
            Shape::Gemv { .. } => unreachable!("the GEMV has its own kernels"),
        }
    }

    /// The CPU reference's outputs in `out`.
    fn reference(&self, out: OutputDtype) -> Vec<OutTensor> {
        match self {
            W16::Gemm(g) => vec![CpuBackend.gemm16_as(g, out).unwrap()],
            W16::Dual(d) => vec![CpuBackend.dual_gemm16_as(d, out).unwrap()],
            W16::Grouped(g) => CpuBackend.grouped_gemm16_as(g, out).unwrap(),
            W16::Moe(m) => vec![CpuBackend.moe_gemm16_as(m, out).unwrap()],
        }
    }

    /// Uploads the operands, binds the operation with outputs of `out` and launches it twice on
    /// `stream` (the backend's own when `None`), the outputs NaN-filled before each launch:
    /// both launches' outputs and the route.
    /// `packed`: every weight also carries its packed form for the activation's type
    /// (format/w16_pack.rs), which the GEMM and grouped kernels then read.
    fn run(
        &self,
        b: &CudaBackend,
        out: OutputDtype,
        stream: Option<&CudaStream>,
        packed: bool,
    ) -> (Vec<Vec<OutTensor>>, String) {
        let alloc = |shape| b.alloc_output_as(shape, out).unwrap();
        let dense = |t: &OutTensor| b.upload_dense(t).unwrap();
        let act = if self.activation_dtype() == OutputDtype::Bf16 { PackAct::Bf16 } else { PackAct::F16 };
        // Packed on the device (kernels/pack_w16.cu; its bytes against the host's: packed.rs).
        let nv = |t: &Nvfp4Tensor| {
            let d = b.upload(t).unwrap();
            let p = packed.then(|| b.pack(&d.view(), act).unwrap());
            Weight(d, p, None)
        };
        let (outs, op): (Vec<DeviceF16>, _) = match self {
            W16::Gemm(g) => {
                let (a, w) = (dense(&g.a), nv(&g.b));
                let [l, m, _] = g.a.shape();
                let c = alloc([l, m, g.b.rows()]);
                let op =
                    b.bind(DeviceOp::Gemm { a: Act::Dense(&a.view()), b: &w.view(), alpha: g.alpha, c: &c.view() });
                (vec![c], op)
            }
            W16::Dual(d) => {
                let (a, mut w1, mut w2) = (dense(&d.a), nv(&d.b1), nv(&d.b2));
                if packed {
                    // The pair packed together, attached to both operands.
                    let pair = b.pack_dual(&w1.0.view(), &w2.0.view(), act).unwrap();
                    w1.1 = Some(pair);
                    w2.1 = None;
                    w2.2 = w1.1.as_ref().map(|p| w2.0.view().with_packed(p).unwrap());
                }
                let [l, m, _] = d.a.shape();
                let c = alloc([l, m, d.b1.rows()]);
                let op = DeviceOp::DualGemm {
                    a: Act::Dense(&a.view()),
                    b1: &w1.view(),
                    b2: &w2.view(),
                    alpha: d.alpha,
                    c: &c.view(),
                };
                (vec![c], b.bind(op))
            }
            W16::Grouped(gg) => {
                let ups: Vec<_> = gg.groups.iter().map(|g| (dense(&g.a), nv(&g.b))).collect();
                let cs: Vec<DeviceF16> = gg.groups.iter().map(|g| alloc([1, g.a.shape()[1], g.b.rows()])).collect();
                let views: Vec<_> = ups.iter().zip(&cs).map(|((a, w), c)| (a.view(), w.view(), c.view())).collect();
                let gv: Vec<GemmViews<'_>> = views
                    .iter()
                    .zip(&gg.groups)
                    .map(|((a, w, c), g)| GemmViews { a: Act::Dense(a), b: w, alpha: g.alpha, c })
                    .collect();
                let op = b.bind(DeviceOp::GroupedGemm(gv));
                (cs, op)
            }
            W16::Moe(m) => {
                let (a, w, offsets) = (dense(&m.a), nv(&m.b), b.upload_i32(&m.offsets).unwrap());
                let alphas = m.alpha.as_ref().try_map(|v| b.upload_f32(v)).unwrap();
                let c = alloc([1, m.a.shape()[1], m.b.rows()]);
                let op = DeviceOp::MoeGemm {
                    a: Act::Dense(&a.view()),
                    b: &w.view(),
                    offsets: &offsets,
                    alpha: alphas.as_ref(),
                    c: &c.view(),
                };
                (vec![c], b.bind(op))
            }
        };
        let op = op.unwrap_or_else(|e| panic!("bind: {e}"));
        let mut got = Vec::new();
        for _ in 0..2 {
            for c in &outs {
                b.poison(c).unwrap();
            }
            b.sync().unwrap();
            match stream {
                Some(s) => {
                    op.launch_on_stream(s).unwrap();
                    s.synchronize().unwrap();
                }
                None => op.launch().unwrap(),
            }
            got.push(outs.iter().map(|c| b.download_out(c).unwrap()).collect());
        }
        (got, op.describe())
    }
}

/// An uploaded weight and, optionally, its packed form: its view carries both.
/// (A dual GEMM's B2 shares B1's packed pair: its view is made once, in the third field.)
struct Weight(DeviceNvfp4, Option<DevicePacked>, Option<Nvfp4View>);

impl Weight {
    fn view(&self) -> Nvfp4View {
        match (&self.2, &self.1) {
            (Some(v), _) => v.clone(),
            (None, Some(p)) => self.0.view().with_packed(p).unwrap(),
            (None, None) => self.0.view(),
        }
    }
}

impl W16 {
    /// The activations' type.
    fn activation_dtype(&self) -> OutputDtype {
        match self {
            W16::Gemm(g) => g.a.dtype(),
            W16::Dual(d) => d.a.dtype(),
            W16::Grouped(g) => g.groups[0].a.dtype(),
            W16::Moe(m) => m.a.dtype(),
        }
    }
}

/// How outputs are compared.
#[derive(Clone, Copy)]
enum Rule {
    /// Every bit.
    Exact,
    /// SPEC §4 (`1e-3 + 1e-3 |ref|`, 2^-7 relative for bf16 outputs: one bf16 rounding of an f32
    /// sum that differs from the exact one in the last f32 bits), NaN and infinity status equal.
    Tolerance,
}

/// The first elements of `got` that fail `rule` against `want`, as (index, got, want).
fn differences(got: &OutTensor, want: &OutTensor, rule: Rule) -> Vec<(usize, f32, f32)> {
    assert_eq!((got.dtype(), got.shape()), (want.dtype(), want.shape()));
    let (gf, wf) = (got.to_f32(), want.to_f32());
    let rel = if want.dtype() == OutputDtype::Bf16 { 1.0 / 128.0 } else { 1e-3 };
    let passes = |i: usize| match rule {
        Rule::Exact => got.bits()[i] == want.bits()[i],
        Rule::Tolerance => {
            let (g, w) = (gf[i] as f64, wf[i] as f64);
            if w.is_finite() {
                g.is_finite() && (g - w).abs() <= 1e-3 + rel * w.abs()
            } else {
                g.is_nan() == w.is_nan() && (w.is_nan() || g == w)
            }
        }
    };
    (0..gf.len()).filter(|&i| !passes(i)).map(|i| (i, gf[i], wf[i])).take(8).collect()
}

/// Runs `w` with outputs of `out` and compares both launches with the reference under `rule`
/// (the dual GEMM under the tolerance always: its SiLU is approximate in f32, so a few f32 ulp
/// can cross a rounding boundary of the output type).
fn check(b: &CudaBackend, w: &W16, out: OutputDtype, rule: Rule, what: &str) -> Vec<OutTensor> {
    check_as(b, w, out, rule, what, false)
}

/// [`check`], with the weights' packed forms attached when `packed`.
fn check_as(b: &CudaBackend, w: &W16, out: OutputDtype, rule: Rule, what: &str, packed: bool) -> Vec<OutTensor> {
    let rule = if matches!(w, W16::Dual(_)) { Rule::Tolerance } else { rule };
    let want = w.reference(out);
    let (got, route) = w.run(b, out, None, packed);
    for (launch, outs) in got.iter().enumerate() {
        assert_eq!(outs.len(), want.len(), "{what}");
        for (i, (g, x)) in outs.iter().zip(&want).enumerate() {
            let bad = differences(g, x, rule);
            assert!(bad.is_empty(), "{what} ({route}), launch {launch}, output {i}: (index, got, want) {bad:?}");
        }
    }
    println!("ok {what}: {route}");
    want
}

/// A MoE form the route sends to the GEMV's `_moe` kernels (K % 32 == 0 and the route's rule on
/// rows per expert), not the skeleton.
fn moe_decode(shape: &Shape) -> bool {
    let Shape::Moe { n, k, counts } = shape else { return false };
    k % 32 == 0 && takes_by_default((counts.iter().sum::<usize>(), *n, *k, counts.len()))
}

/// Odd sizes: M and N off every tile, K % 64 == 32 (plain scales by direct copy, the last
/// sub-stage half past K), K % 256 != 0, batches, one token; and tile-filling ones. Up to 8 rows
/// take the W4A16 GEMV's `_cols` kernels: K % 32 == 16 (8-byte chunks), split-K, batches.
fn shapes() -> Vec<Shape> {
    let gemm = |m, n, k, l| Shape::Gemm { m, n, k, l };
    let dual = |m, n, k, l| Shape::DualGemm { m, n, k, l };
    vec![
        gemm(1, 256, 256, 1),
        gemm(7, 300, 96, 3),
        gemm(2, 1000, 4112, 1),
        gemm(3, 130, 48, 2),
        gemm(8, 4096, 2048, 1),
        gemm(33, 130, 224, 1),
        gemm(130, 257, 160, 2),
        gemm(257, 520, 288, 1),
        gemm(512, 1024, 1024, 1),
        gemm(1000, 72, 512, 1),
        dual(5, 72, 96, 1),
        dual(130, 200, 224, 2),
        dual(512, 256, 512, 1),
        Shape::GroupedGemm { groups: vec![(40, 512, 256), (512, 384, 96), (7, 130, 160)] },
        Shape::GroupedGemm { groups: vec![(128, 128, 64); 4] },
        Shape::Moe { n: 384, k: 224, counts: vec![40, 0, 76, 8] },
        Shape::Moe { n: 520, k: 512, counts: vec![1, 300, 0, 71, 129] },
        // A batch-1 decode routing (2 rows over 20 experts): the `_moe` kernels, K of one
        // partial K-step. Routings of a few rows per expert, experts of 8, 9 and 17 rows: the
        // grouped launch (moe_decode_routings_on_the_gemv forces them onto the `_moe` kernels).
        Shape::Moe { n: 130, k: 800, counts: vec![0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0] },
        // The same with K % 128 == 0: plain scales copied per warp (the last warp's chunks past K).
        Shape::Moe { n: 130, k: 896, counts: vec![0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0] },
        Shape::Moe { n: 130, k: 800, counts: vec![0, 1, 8, 9, 0, 17, 2, 0, 0, 1, 0, 3, 0, 0, 0, 0, 0, 1, 0, 0] },
        Shape::Moe { n: 300, k: 6176, counts: vec![8, 0, 3, 9, 0, 0, 0, 1] },
        // More than two waves of m256n128 tile groups: whole waves dealt round robin, the rest
        // stream-K pieces.
        Shape::Moe { n: WAVE_NK.0, k: WAVE_NK.1, counts: WAVE_COUNTS.to_vec() },
    ]
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn exact_data_is_bit_identical() {
    let b = gpu();
    for (i, shape) in shapes().iter().enumerate() {
        for dtype in TYPES {
            for layout in LAYOUTS {
                let w = W16::make(shape, dtype, layout, Data::Exact, 100 + i as u64);
                check(&b, &w, dtype, Rule::Exact, &format!("{shape} {dtype} {layout:?}"));
            }
        }
        // The other output type than the activation's.
        let w = W16::make(shape, OutputDtype::Bf16, ScaleLayout::Plain, Data::Exact, 200 + i as u64);
        check(&b, &w, OutputDtype::F16, Rule::Exact, &format!("{shape} bf16 -> f16"));
    }
}

/// One shape per operation with every tile variant and K schedule to force on it: the W4A16
/// kernels' every instantiation and their split-K, stream-K, CTA-pair and cluster-sum paths.
fn variant_cases() -> Vec<(Op, Shape, Vec<&'static str>)> {
    let tiles = ["m256n16", "m256n32", "m256n64", "m256n128", "m128n128", "m128n256"];
    let schedules = ["m256n64s3", "m128n128sk", "m256n64c2", "m256n32c2sk", "m128n128s2d", "m256n16s4d"];
    vec![
        (Op::Gemm, Shape::Gemm { m: 200, n: 1100, k: 1056, l: 1 }, tiles.iter().chain(&schedules).copied().collect()),
        // The dual GEMM has no W4A16 m128n256 (W16_SKIPPED).
        (
            Op::Dual,
            Shape::DualGemm { m: 150, n: 600, k: 544, l: 1 },
            tiles[..5].iter().copied().chain(["m256n64s3", "m128n128sk", "m256n64c2"]).collect(),
        ),
        (Op::Grouped, Shape::GroupedGemm { groups: vec![(40, 520, 544), (300, 130, 288)] }, tiles.to_vec()),
        (Op::Grouped, Shape::Moe { n: 520, k: 544, counts: vec![40, 0, 300, 9] }, tiles.to_vec()),
    ]
}

/// [`variant_cases`], each forced, on exact data (`seed`), checked by `check` (bit-identical).
fn every_variant(b: &CudaBackend, seed: u64, check: impl Fn(&CudaBackend, &W16, OutputDtype, &str)) {
    for (op, shape, forced) in variant_cases() {
        for value in forced {
            for (dtype, layout) in [(OutputDtype::Bf16, ScaleLayout::Blocked), (OutputDtype::F16, ScaleLayout::Plain)] {
                let w = W16::make(&shape, dtype, layout, Data::Exact, seed);
                let what = format!("{shape} {dtype} {layout:?} forced {value}");
                with_forced(b, op, value, |b| check(b, &w, dtype, &what));
            }
        }
    }
}

/// Routings of a few rows per expert forced onto the `_moe` kernels: experts of 8, 9 and 17 rows
/// (segments of 8 and their remainders), K of one partial K-step, K = 6176 (a partial last K-step
/// after full ones, four windows for 8 rows), and N = 4096 x K = 7168 so that
/// CTAs each walk several tiles through the weight ring and a segment's staged rows serve several
/// tiles (four windows for 8 rows); the `_moe` route asserted; exact data, bit-identical, both
/// activation types.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn moe_decode_routings_on_the_gemv() {
    let b = gpu();
    let shapes = [
        (Shape::Moe { n: 130, k: 800, counts: vec![0, 1, 8, 9, 0, 17, 2, 0, 0, 1, 0, 3, 0, 0, 0, 0, 0, 1, 0, 0] }, 42),
        (Shape::Moe { n: 300, k: 6176, counts: vec![8, 0, 3, 9, 0, 0, 0, 1] }, 21),
        (Shape::Moe { n: 4096, k: 7168, counts: vec![8, 9, 17, 0, 1, 0, 2, 3, 0, 16, 1, 0, 0, 4, 0, 1] }, 62),
    ];
    for (i, (shape, t)) in shapes.iter().enumerate() {
        for (dtype, layout) in [(OutputDtype::Bf16, ScaleLayout::Blocked), (OutputDtype::F16, ScaleLayout::Plain)] {
            let w = W16::make(shape, dtype, layout, Data::Exact, 1300 + i as u64);
            with_forced(&b, Op::Grouped, MOE_GEMV, |b| {
                let (_, route) = w.run(b, dtype, None, false);
                assert!(route.contains(&format!("_moe T={t} ")), "{route}");
                check(b, &w, dtype, Rule::Exact, &format!("{shape} {dtype} {layout:?}"));
            });
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn every_variant_and_schedule_is_bit_identical() {
    every_variant(&gpu(), 7, |b, w, dtype, what| {
        check(b, w, dtype, Rule::Exact, what);
    });
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn random_data_is_within_tolerance() {
    let b = gpu();
    for (i, shape) in shapes().iter().enumerate() {
        for dtype in TYPES {
            for layout in LAYOUTS {
                let w = W16::make(shape, dtype, layout, Data::Random, 300 + i as u64);
                check(&b, &w, dtype, Rule::Tolerance, &format!("random {shape} {dtype} {layout:?}"));
            }
        }
    }
}

/// `t` with the scale of row `row`, block `block` of batch `batch` set to `code` (its layout
/// kept).
fn with_scale(t: &Nvfp4Tensor, (batch, row, block): (usize, usize, usize), code: u8) -> Nvfp4Tensor {
    let plain = t.to_layout(ScaleLayout::Plain);
    let mut scales = plain.scales().to_vec();
    scales[(batch * t.rows() + row) * (t.k() / 16) + block] = code;
    Nvfp4Tensor::new(t.l(), t.rows(), t.k(), plain.values().to_vec(), scales, ScaleLayout::Plain)
        .unwrap()
        .with_global_scale(t.global_scale())
        .to_layout(t.layout())
}

/// `w` with one NaN scale in its weights: the last batch's (expert's) row 1 in the block holding
/// K element 40 (sub-stage 0, step 2); for the dual GEMM in B2, for a list in its last group. A
/// one-row weight's row 0, a K of one or two blocks its last block.
fn plant_nan(w: W16) -> W16 {
    let nan = |t: &Nvfp4Tensor| with_scale(t, (t.l() - 1, t.rows().min(2) - 1, (t.k() / 16).min(3) - 1), 0x7F);
    match w {
        W16::Gemm(g) => W16::Gemm(Gemm::new(g.a, nan(&g.b), g.alpha).unwrap()),
        W16::Dual(d) => W16::Dual(DualGemm::new(d.a, d.b1.clone(), nan(&d.b2), d.alpha).unwrap()),
        W16::Grouped(gg) => {
            let last = gg.groups.len() - 1;
            let groups = gg
                .groups
                .into_iter()
                .enumerate()
                .map(|(i, g)| {
                    let b = if i == last { nan(&g.b) } else { g.b };
                    Gemm::new(g.a, b, g.alpha).unwrap()
                })
                .collect();
            W16::Grouped(GroupedGemm::new(groups).unwrap())
        }
        W16::Moe(m) => W16::Moe(MoeGemm::new(m.a, nan(&m.b), m.offsets, m.alpha).unwrap()),
    }
}

/// A NaN scale makes NaN exactly the outputs whose sums use it (the reference's NaN positions:
/// column 1 of the last batch, of the last group, of the last expert's tokens; every column of
/// the dual GEMM's gated product that reads B2's row 1), and no other.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_nan_scale_poisons_exactly_its_outputs() {
    let b = gpu();
    for (i, shape) in shapes().iter().enumerate() {
        for dtype in TYPES {
            for layout in LAYOUTS {
                let w = plant_nan(W16::make(shape, dtype, layout, Data::Exact, 500 + i as u64));
                let want = check(&b, &w, dtype, Rule::Tolerance, &format!("NaN scale {shape} {dtype} {layout:?}"));
                let nans: usize = want.iter().map(|t| t.to_f32().iter().filter(|v| v.is_nan()).count()).sum();
                let all: usize = want.iter().map(|t| t.bits().len()).sum();
                // The last expert of a MoE shape may have no tokens: then nothing reads the row.
                let reads = !matches!(shape, Shape::Moe { counts, .. } if counts.last() == Some(&0));
                assert!((nans > 0) == reads && nans < all, "{shape}: {nans} NaN of {all}");
            }
        }
    }
}

/// The GEMM of `shape` on exact data with the scale of row 0, block `block` set to `code`.
fn gemm_with_scale(shape: [usize; 4], dtype: OutputDtype, layout: ScaleLayout, block: usize, code: u8) -> W16 {
    let [m, n, k, l] = shape;
    let mut rng = Rng::new(11);
    let a = exact_activation(&mut rng, [l, m, k], dtype);
    let w = with_scale(&exact_weights(&mut rng, [l, n, k], layout), (0, 0, block), code);
    W16::Gemm(Gemm::new(a, w, None).unwrap())
}

/// The blocked layout pads the scale columns to a multiple of 4 (don't-care on input, SPEC §2):
/// NaN there, past K, must not reach any output.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn nan_in_the_blocked_padding_past_k_is_ignored() {
    let b = gpu();
    let (m, n, k) = (40, 200, 96); // 6 scale columns: columns 6 and 7 of each row are padding
    for dtype in TYPES {
        let W16::Gemm(g) = gemm_with_scale([m, n, k, 1], dtype, ScaleLayout::Blocked, 0, 1) else { unreachable!() };
        let rows_pad = n.next_multiple_of(128);
        let mut scales = g.b.scales().to_vec();
        // Offsets of row i, column j (SPEC §2) with C = 2 column groups.
        for i in 0..rows_pad {
            for j in 6..8 {
                let off = (i / 128) * (2 * 512) + (j / 4) * 512 + (i % 32) * 16 + ((i % 128) / 32) * 4 + (j % 4);
                scales[off] = 0x7F;
            }
        }
        let w = Nvfp4Tensor::new(1, n, k, g.b.values().to_vec(), scales, ScaleLayout::Blocked).unwrap();
        let w16 = W16::Gemm(Gemm::new(g.a.clone(), w, None).unwrap());
        let want = check(&b, &w16, dtype, Rule::Exact, &format!("blocked padding NaN {dtype}"));
        assert!(want[0].to_f32().iter().all(|v| v.is_finite()));
    }
}

/// Queues about `launches` large W4A4 GEMMs on `stream` (milliseconds of work) and returns what
/// they use.
fn make_busy(b: &CudaBackend, stream: &CudaStream, launches: usize) -> Busy {
    let Problem::Gemm(g) = generate(&Shape::Gemm { m: 4096, n: 4096, k: 4096, l: 1 }, 1).unwrap() else {
        unreachable!()
    };
    let (a, w) = (b.upload(&g.a).unwrap(), b.upload(&g.b).unwrap());
    let c = b.alloc_output_as([1, 4096, 4096], OutputDtype::F16).unwrap();
    let op = b.bind(DeviceOp::Gemm { a: Act::Nvfp4(&a.view()), b: &w.view(), alpha: None, c: &c.view() }).unwrap();
    for _ in 0..launches {
        op.launch_on_stream(stream).unwrap();
    }
    Busy { _keep: vec![Box::new((a, w, c, op))] }
}

/// What queued work uses, alive until dropped.
struct Busy {
    _keep: Vec<Box<dyn std::any::Any>>,
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn launches_behind_busy_work_on_a_side_stream() {
    let b = gpu();
    let side = b.stream().context().new_stream().expect("a second stream");
    for (i, shape) in shapes().iter().enumerate().filter(|(i, _)| i % 3 == 0) {
        let dtype = TYPES[i % 2];
        let w = W16::make(shape, dtype, LAYOUTS[i % 2], Data::Exact, 400 + i as u64);
        let want = w.reference(dtype);
        let busy = make_busy(&b, &side, 10);
        let (got, route) = w.run(&b, dtype, Some(&side), false);
        drop(busy);
        // The dual GEMM's gate is not exact in f32 (silu's exponential): SPEC §4's tolerance,
        // as in `check`.
        let rule = if matches!(w, W16::Dual(_)) { Rule::Tolerance } else { Rule::Exact };
        for outs in got {
            for (g, x) in outs.iter().zip(&want) {
                let bad = differences(g, x, rule);
                assert!(bad.is_empty(), "busy stream {shape} ({route}): {bad:?}");
            }
        }
    }
}

/// A W4A16 GEMM launched as a programmatic dependent of the W4A4 GEMM that writes its
/// activation: its weights may stream in early, its activation only after the wait.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_chained_launch_reads_the_activation_its_predecessor_writes() {
    let b = gpu();
    let side = b.stream().context().new_stream().expect("a second stream");
    for dtype in TYPES {
        // x = A·B1ᵀ (W4A4, [1, 96, 512] in dtype), then c = x·Wᵀ (W4A16).
        let Problem::Gemm(first) = generate(&Shape::Gemm { m: 96, n: 512, k: 2048, l: 1 }, 5).unwrap() else {
            unreachable!()
        };
        let x_host = CpuBackend.gemm_as(&first, dtype).unwrap();
        let w = exact_weights(&mut Rng::new(6), [1, 4096, 512], ScaleLayout::Plain);
        let want = CpuBackend.gemm16_as(&Gemm::new(x_host, w.clone(), None).unwrap(), dtype).unwrap();
        let (a1, b1) = (b.upload(&first.a).unwrap(), b.upload(&first.b).unwrap());
        let x = b.alloc_output_as([1, 96, 512], dtype).unwrap();
        let wd = b.upload(&w).unwrap();
        let c = b.alloc_output_as([1, 96, 4096], dtype).unwrap();
        let op1 =
            b.bind(DeviceOp::Gemm { a: Act::Nvfp4(&a1.view()), b: &b1.view(), alpha: None, c: &x.view() }).unwrap();
        let op2 =
            b.bind(DeviceOp::Gemm { a: Act::Dense(&x.view()), b: &wd.view(), alpha: None, c: &c.view() }).unwrap();
        assert!(op2.chains(), "{}", op2.describe());
        for round in 0..3 {
            b.poison(&x).unwrap();
            b.poison(&c).unwrap();
            b.sync().unwrap();
            op1.launch_on_stream(&side).unwrap();
            op2.launch_chained_on_stream(&side).unwrap();
            side.synchronize().unwrap();
            // The activation is a rounded GEMM output: its W4A16 sums are not exact in f32.
            let bad = differences(&b.download_out(&c).unwrap(), &want, Rule::Tolerance);
            assert!(bad.is_empty(), "{dtype} round {round} ({}): {bad:?}", op2.describe());
        }
    }
}
