//! bf16 output on the CUDA backend against the CPU reference's bf16 output: bit-identical on the
//! exact generators (GEMV, GEMM, grouped GEMM and its MoE form; every kernel path: the wgmma
//! skeleton with its TMA, paired and element stores, split-K, f32 and f64 alpha; the GEMV with and
//! without split-K; the mma.sync fallback), and within `1e-3 + 2^-7 |ref|` for the dual GEMM: its
//! SiLU is approximate in f32, so a few f32 ulp can cross a bf16 rounding boundary (one bf16 ulp
//! is at most 2^-7 relative), and e^-x flushes to zero a little earlier than the CPU's (values
//! below 1e-30, which bf16 keeps). Outputs are poisoned with bf16 NaN before each launch, so an
//! unwritten element fails. Needs an NVIDIA GPU:
//! `cargo test --release --test cuda_bf16 -- --ignored`.

use nvfp4::backend::cuda::{CudaBackend, DeviceOp};
use nvfp4::problem::{generate, Problem, Shape};
use nvfp4::{Backend, CpuBackend, DualGemm, Gemm, GroupedGemm, MoeGemm, OutTensor, OutputDtype, ScaleLayout};

mod common;
use common::gpu;

const BF16: OutputDtype = OutputDtype::Bf16;

/// How outputs are compared.
#[derive(Clone, Copy)]
enum Rule {
    /// Every bit.
    Exact,
    /// `|got - ref| <= 1e-3 + 2^-7 |ref|`, both finite: SPEC §4's rule with bf16's resolution.
    Bf16Tolerance,
}

/// The first elements that fail `rule`, as (index, got, want).
fn differences(got: &OutTensor, want: &OutTensor, rule: Rule) -> Vec<(usize, f32, f32)> {
    assert_eq!((got.dtype(), want.dtype()), (BF16, BF16));
    assert_eq!(got.shape(), want.shape());
    let (gf, wf) = (got.to_f32(), want.to_f32());
    let passes = |i: usize| match rule {
        Rule::Exact => got.bits()[i] == want.bits()[i],
        Rule::Bf16Tolerance => {
            let (g, w) = (gf[i] as f64, wf[i] as f64);
            g.is_finite() && w.is_finite() && (g - w).abs() <= 1e-3 + w.abs() / 128.0
        }
    };
    (0..gf.len()).filter(|&i| !passes(i)).map(|i| (i, gf[i], wf[i])).take(8).collect()
}

/// Prepares `p` with bf16 outputs, runs it twice (poisoned each time) and compares each output
/// with the CPU's bf16 outputs.
fn check(b: &CudaBackend, p: &Problem, rule: Rule, what: &str) {
    let want: Vec<OutTensor> = match p {
        Problem::Gemv(g) => vec![CpuBackend.gemv_as(g, BF16).unwrap()],
        Problem::Gemm(g) => vec![CpuBackend.gemm_as(g, BF16).unwrap()],
        Problem::DualGemm(d) => vec![CpuBackend.dual_gemm_as(d, BF16).unwrap()],
        Problem::GroupedGemm(g) => CpuBackend.grouped_gemm_as(g, BF16).unwrap(),
        Problem::Moe(_) => unreachable!("the MoE form has its own test"),
    };
    let mut prep = b.prepare_as(p, BF16).unwrap_or_else(|e| panic!("{what}: prepare: {e}"));
    for launch in 0..2 {
        prep.poison().unwrap();
        prep.launch().unwrap();
        let got = prep.outputs().unwrap();
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let bad = differences(g, w, rule);
            assert!(
                bad.is_empty(),
                "{what} ({}), launch {launch}, output {i}: (index, got, want) {bad:?}",
                prep.describe()
            );
        }
    }
    println!("ok {what}: {}", prep.describe());
}

fn with_alpha(p: Problem, alpha: Option<f32>, layout: ScaleLayout) -> Problem {
    let p = match p {
        Problem::Gemv(g) => Problem::Gemv(nvfp4::Gemv::new(g.a, g.b, alpha).unwrap()),
        Problem::Gemm(g) => Problem::Gemm(Gemm::new(g.a, g.b, alpha).unwrap()),
        Problem::DualGemm(d) => Problem::DualGemm(DualGemm::new(d.a, d.b1, d.b2, alpha).unwrap()),
        Problem::GroupedGemm(g) => Problem::GroupedGemm(
            GroupedGemm::new(g.groups.into_iter().map(|g| Gemm::new(g.a, g.b, alpha).unwrap()).collect()).unwrap(),
        ),
        other => other,
    };
    p.into_layout(layout)
}

/// Every shape in both scale layouts, with no alpha, a power-of-two alpha (f32 path) and 1/3
/// (f64 path).
fn sweep(b: &CudaBackend, shapes: &[Shape], rule: Rule) {
    for (i, shape) in shapes.iter().enumerate() {
        for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
            for alpha in [None, Some(0.5), Some(1.0 / 3.0)] {
                let p = with_alpha(generate(shape, 20 + i as u64).unwrap(), alpha, layout);
                check(b, &p, rule, &format!("{shape} {layout:?} alpha {alpha:?}"));
            }
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemv_bf16_bit_exact() {
    let shapes = [
        Shape::Gemv { m: 128, k: 256, l: 1 },
        Shape::Gemv { m: 256, k: 7168, l: 1 },
        Shape::Gemv { m: 2432, k: 4608, l: 2 },
        Shape::Gemv { m: 130, k: 48, l: 3 },
    ];
    sweep(&gpu(), &shapes, Rule::Exact);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemm_bf16_bit_exact() {
    let shapes = [
        Shape::Gemm { m: 128, n: 256, k: 256, l: 1 },
        Shape::Gemm { m: 128, n: 3072, k: 1536, l: 1 },
        Shape::Gemm { m: 512, n: 512, k: 2048, l: 1 },
        Shape::Gemm { m: 100, n: 129, k: 256, l: 2 },
        Shape::Gemm { m: 70, n: 33, k: 48, l: 1 },
    ];
    sweep(&gpu(), &shapes, Rule::Exact);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn dual_gemm_bf16_within_tolerance() {
    let shapes = [
        Shape::DualGemm { m: 256, n: 512, k: 256, l: 1 },
        Shape::DualGemm { m: 512, n: 768, k: 1536, l: 1 },
        Shape::DualGemm { m: 64, n: 40, k: 48, l: 2 },
    ];
    sweep(&gpu(), &shapes, Rule::Bf16Tolerance);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn grouped_gemm_bf16_bit_exact() {
    let shapes = [
        Shape::GroupedGemm { groups: vec![(40, 512, 256), (56, 384, 256), (384, 256, 256), (512, 128, 256)] },
        Shape::GroupedGemm { groups: vec![(64, 128, 512), (72, 384, 512), (96, 512, 256)] },
        Shape::GroupedGemm { groups: vec![(33, 40, 48), (17, 24, 48)] },
    ];
    sweep(&gpu(), &shapes, Rule::Exact);
}

/// The MoE form with device offsets: routed rows equal the CPU's bf16 rows; rows past the last
/// offset stay as poisoned (the kernel does not write them).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn moe_bf16_bit_exact() {
    let b = gpu();
    let Problem::Moe(m) = generate(&Shape::Moe { n: 384, k: 512, counts: vec![40, 0, 76, 168] }, 31).unwrap() else {
        unreachable!()
    };
    let t = m.tokens();
    let routed = m.routed_tokens();
    let extra = 5;
    let a = nvfp4::Nvfp4Tensor::new(
        1,
        t + extra,
        512,
        [m.a.values(), &vec![0x22u8; extra * 256][..]].concat(),
        [m.a.scales(), &vec![0x38u8; extra * 32][..]].concat(),
        ScaleLayout::Plain,
    )
    .unwrap();
    for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
        let p = MoeGemm::new(a.to_layout(layout), m.b.to_layout(layout), m.offsets.clone(), Some(0.25)).unwrap();
        let want = CpuBackend.moe_gemm_as(&p, BF16).unwrap();
        let (da, dw) = (b.upload(&p.a).unwrap(), b.upload(&p.b).unwrap());
        let off = b.upload_i32(&p.offsets).unwrap();
        let alphas = p.alpha.as_ref().try_map(|v| b.upload_f32(v)).unwrap();
        let c = b.alloc_output_as([1, t + extra, 384], BF16).unwrap();
        let op = DeviceOp::MoeGemm {
            a: nvfp4::ops::Act::Nvfp4(&da.view()),
            b: &dw.view(),
            offsets: &off,
            alpha: alphas.as_ref(),
            c: &c.view(),
        };
        let bound = b.bind(op).unwrap();
        for launch in 0..2 {
            b.poison(&c).unwrap();
            bound.launch().unwrap();
            let got = b.download_out(&c).unwrap();
            let n = 384;
            assert_eq!(&got.bits()[..routed * n], &want.bits()[..routed * n], "{layout:?} launch {launch}");
            assert!(got.bits()[routed * n..].iter().all(|&v| v == BF16.nan_bits()), "rows past the offsets written");
        }
        // The host path (one launch, fresh zeroed output) agrees too.
        assert_eq!(b.moe_gemm_as(&p, BF16).unwrap(), want, "{layout:?}: Backend::moe_gemm_as");
    }
    println!("ok MoE bf16, T = {}, routed {routed}", t + extra);
}
