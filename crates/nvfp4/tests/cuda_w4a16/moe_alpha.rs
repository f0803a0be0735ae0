//! Per-expert alphas in the W4A16 MoE form (issue 21, item 4): distinct factors (both signs, 0,
//! empty experts among them) on exact data, bit-identical to the CPU reference on the skeleton's
//! grouped launch and on the mma.sync fallback (its own shapes, and the skeleton's forced off),
//! both activation and output types, both scale layouts, outputs NaN-filled before every launch
//! (`W16::run`); and the factors rewritten on the device between two launches of one bound
//! operation, on both routes; and on the GEMV's `_moe` kernels (by default for a batch-1
//! routing, forced for others).

use nvfp4::backend::cuda::sm90::Op;
use nvfp4::backend::cuda::{CudaBackend, DeviceOp};
use nvfp4::ops::Act;
use nvfp4::problem::Shape;
use nvfp4::{Backend, CpuBackend, MoeAlpha, MoeGemm, OutTensor, OutputDtype};

use super::{check, differences, gpu, with_forced, Data, Rule, LAYOUTS, MOE_GEMV, TYPES, W16};

/// One factor per expert (the first E of these): distinct, of both signs, 0, one power of two.
const ALPHAS: [f32; 6] = [0.8125, -1.3, 0.0, 3.1e-3, 2.0, -0.71];

/// `w` (the MoE form) with the first E of `alphas`, one per expert.
fn with_alphas(w: W16, alphas: &[f32]) -> W16 {
    let W16::Moe(m) = w else { unreachable!("the MoE form") };
    let e = m.offsets.len();
    W16::Moe(MoeGemm::new(m.a, m.b, m.offsets, alphas[..e].to_vec()).unwrap())
}

/// The kernel family's marker in a route: the skeleton's (`_ws`), the fallback's (`_mma`) or the
/// GEMV's MoE form (`moe`: a `_moe` kernel, its plan printed after the symbol).
fn route_of(kernel: &str, act: OutputDtype) -> String {
    let act = if act == OutputDtype::Bf16 { "bf16" } else { "f16" };
    match kernel {
        "moe" => format!("gemv16_nvfp4_sm90_{act}_"),
        _ => format!("grouped_gemm_w4a16{act}_sm90_{kernel}"),
    }
}

/// [`check`] of `w` (exact data) on `b`, asserting the route's kernel.
fn check_on(b: &CudaBackend, w: &W16, act: OutputDtype, kernel: &str, what: &str) {
    for out in TYPES {
        let (_, route) = w.run(b, out, None, false);
        assert!(route.contains(&route_of(kernel, act)), "{what}: not {kernel}: {route}");
        assert_eq!(kernel == "moe", route.contains("_moe T="), "{what}: {route}");
        check(b, w, out, Rule::Exact, &format!("{what} -> {out}"));
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn per_expert_alphas_are_bit_identical_on_both_routes() {
    let b = gpu();
    // (shape, forced skeleton choice, the route's kernel)
    let cases = [
        (Shape::Moe { n: 384, k: 224, counts: vec![40, 0, 76, 8] }, None, "ws"),
        (Shape::Moe { n: 520, k: 512, counts: vec![1, 300, 0, 71, 129, 0] }, None, "ws"),
        (Shape::Moe { n: 130, k: 48, counts: vec![40, 0, 7, 1, 130] }, None, "mma"),
        (Shape::Moe { n: 40, k: 4112, counts: vec![7, 1, 0] }, None, "mma"),
        (Shape::Moe { n: 200, k: 256, counts: vec![40, 0, 300, 9, 64, 65] }, Some("off"), "mma"),
        (Shape::Moe { n: 130, k: 800, counts: vec![0, 9, 1, 0, 11, 2] }, Some(MOE_GEMV), "moe"),
        (Shape::Moe { n: 130, k: 2048, counts: vec![0, 1, 0, 0, 0, 0] }, None, "moe"),
    ];
    for (i, (shape, forced, kernel)) in cases.iter().enumerate() {
        for act in TYPES {
            for layout in LAYOUTS {
                let w = with_alphas(W16::make(shape, act, layout, Data::Exact, 1100 + i as u64), &ALPHAS);
                let what = format!("per-expert alphas {shape} {act} {layout:?}");
                match forced {
                    Some(f) => with_forced(&b, Op::Grouped, f, |b| check_on(b, &w, act, kernel, &what)),
                    None => check_on(&b, &w, act, kernel, &what),
                }
            }
        }
    }
}

/// One bound operation per route, its factors rewritten on the device between two launches:
/// each launch gives its factors' result, every routed row compared bit for bit.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn per_expert_alphas_rewritten_on_the_device_between_launches() {
    let b = gpu();
    let prefill = Shape::Moe { n: 200, k: 256, counts: vec![40, 0, 300, 9, 64, 65] };
    let decode = Shape::Moe { n: 200, k: 256, counts: vec![0, 9, 1, 0, 11, 2] };
    let other = [1.0, 0.37, -4.0, -2.25, 1.1, 6.0e-2];
    for (shape, forced, kernel) in
        [(&prefill, None, "ws"), (&prefill, Some("off"), "mma"), (&decode, Some(MOE_GEMV), "moe")]
    {
        for act in TYPES {
            let W16::Moe(m) = with_alphas(W16::make(shape, act, LAYOUTS[1], Data::Exact, 1200), &ALPHAS) else {
                unreachable!()
            };
            let run = |b: &CudaBackend| {
                let (a, w) = (b.upload_dense(&m.a).unwrap(), b.upload(&m.b).unwrap());
                let (off, alphas) = (b.upload_i32(&m.offsets).unwrap(), b.upload_f32(&ALPHAS).unwrap());
                let c = b.alloc_output_as([1, m.tokens(), 200], act).unwrap();
                let op = DeviceOp::MoeGemm {
                    a: Act::Dense(&a.view()),
                    b: &w.view(),
                    offsets: &off,
                    alpha: MoeAlpha::PerExpert(&alphas),
                    c: &c.view(),
                };
                let bound = b.bind(op).unwrap();
                let mut got = Vec::new();
                for values in [&ALPHAS, &other] {
                    b.write_values(&alphas, values).unwrap();
                    b.poison(&c).unwrap();
                    bound.launch().unwrap();
                    got.push(b.download_out(&c).unwrap());
                }
                (got, bound.describe())
            };
            let (got, route) = match forced {
                Some(f) => with_forced(&b, Op::Grouped, f, run),
                None => run(&b),
            };
            assert!(route.contains(&route_of(kernel, act)), "{act}: not {kernel}: {route}");
            for (g, values) in got.iter().zip([ALPHAS, other]) {
                let p = MoeGemm { alpha: values.to_vec().into(), ..m.clone() };
                let want: OutTensor = CpuBackend.moe_gemm16_as(&p, act).unwrap();
                let bad = differences(g, &want, Rule::Exact);
                assert!(bad.is_empty(), "{act} {route} alphas {values:?}: {bad:?}");
            }
        }
    }
}
