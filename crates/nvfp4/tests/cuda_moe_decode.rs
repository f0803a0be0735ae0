//! The MoE form at decode sizes (a few routed rows per expert) on the GEMV's `_moe` kernels, W4A4
//! (NVFP4 tokens; the W4A16 cases are in cuda_w4a16.rs): bit-identical to the CPU reference on
//! the SPEC generator's data, outputs poisoned before every launch, the route asserted. The route
//! takes batch-1-like routings by default (one of them checked so); the others are forced onto
//! the kernels (`NVFP4_MOE_GEMV=on`'s override). Routings with empty experts (first, in the
//! middle, last), experts of 1, 8, 9, 16 and 17 rows (segments of 8 and their remainders), rows
//! past the last offset, K of one partial K-step and K that needs several windows for 8 rows; one
//! alpha and per-expert alphas with non-trivial global scales; both scale layouts and output
//! types; and one bound operation whose offsets are rewritten on the device between launches
//! (the kernels lay out the experts' rows from them on every launch). Needs an NVIDIA GPU:
//! `cargo test --release --test cuda_moe_decode -- --ignored`.

use nvfp4::backend::cuda::{DeviceOp, Overrides};
use nvfp4::check::Mode;
use nvfp4::ops::Act;
use nvfp4::problem::{generate, Shape};
use nvfp4::{Backend, CpuBackend, MoeAlpha, MoeGemm, OutputDtype, Problem, ScaleLayout};

mod common;
use common::gpu;

/// (N, K, tokens per expert), at most 4 rows per expert on average. Qwen3-30B-A3B's gate/up
/// projection with one token's top 8 (the route's own choice); one expert;
/// 100 experts (the table's scan carries over warps) and 512 (its limit); N = 4096 (CTAs walk
/// several tiles: the weight ring runs across tile edges, a segment's rows staged once for several
/// tiles) with K = 7168 (four windows for 8 rows).
/// The last case is the route's own choice, the others are forced.
fn cases() -> Vec<(usize, usize, Vec<usize>)> {
    vec![
        (130, 800, vec![0, 1, 8, 9, 0, 17, 2, 0, 0, 1, 0, 3, 0, 0, 0, 0, 0, 1, 0, 0]),
        (300, 6176, vec![8, 0, 3, 9, 0, 0, 0, 1]),
        (1536, 2048, (0..100).map(|e| [2, 0, 1, 4, 3][e % 5]).collect()),
        (256, 64, vec![16, 0, 0, 0, 0]),
        (96, 32, vec![3]),
        // Plain scales ending on a half word: their last pair read alone (memcheck: nothing past them).
        (97, 32, vec![3]),
        (64, 64, (0..512).map(|e| [0, 1, 0, 2, 9][e % 5]).collect()),
        (4096, 7168, vec![8, 9, 17, 0, 1, 0, 2, 3, 0, 16, 1, 0, 0, 4, 0, 1]),
        // K % 128 == 0 but not of 1024: plain scales copied per warp, the last warp's chunks past
        // K (zeros); N off the 32-row tiles (the copied rows past N clamped).
        (130, 896, vec![0, 2, 0, 1, 9, 0, 0, 1]),
        (1536, 2048, (0..128).map(|e| usize::from(e % 16 == 3)).collect()),
    ]
}

/// The large case runs one alpha (its CPU reference is the slow part).
fn large(n: usize, k: usize) -> bool {
    n * k > 1 << 24
}

fn problem(n: usize, k: usize, counts: &[usize], seed: u64) -> MoeGemm {
    let Problem::Moe(m) = generate(&Shape::Moe { n, k, counts: counts.to_vec() }, seed).unwrap() else {
        unreachable!()
    };
    m
}

/// One factor per expert: distinct, both signs, 0, powers of two and not.
fn alphas(e: usize) -> Vec<f32> {
    (0..e).map(|i| [0.8125, -1.3, 2.0, 3.1e-3, 0.0, -0.71, 5.5][i % 7]).collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn decode_routings_are_bit_exact() {
    let b = gpu();
    let on = b.with_overrides(Overrides::moe_gemv(true));
    let cases = cases();
    let last = cases.len() - 1;
    for (i, (n, k, counts)) in cases.into_iter().enumerate() {
        let b = if i == last { &b } else { &on };
        let m = problem(n, k, &counts, 70 + i as u64);
        let e = counts.len();
        let per = MoeGemm::new(
            m.a.clone().with_global_scale(0.75),
            m.b.clone().with_global_scale(1.5),
            m.offsets.clone(),
            alphas(e),
        )
        .unwrap();
        let one = MoeGemm { alpha: Some(0.375f32).into(), ..m.clone() };
        let alphas = if large(n, k) { 1 } else { 3 };
        for (p, alpha) in [(&m, "none"), (&one, "0.375"), (&per, "per expert")].into_iter().take(alphas) {
            for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
                let what = format!("N={n} K={k} counts {counts:?} alpha {alpha} {layout:?}");
                let q = Problem::Moe(p.clone()).into_layout(layout);
                let cfg = common::check(b, &q, Mode::BitExact, 2, &what);
                assert!(cfg.starts_with("gemv16_nvfp4_sm90_nvfp4_") && cfg.contains("_moe"), "{what}: {cfg}");
                let Problem::Moe(q) = &q else { unreachable!() };
                let bf16 = OutputDtype::Bf16;
                let (got, want) = (b.moe_gemm_as(q, bf16).unwrap(), CpuBackend.moe_gemm_as(q, bf16).unwrap());
                assert_eq!(got.bits(), want.bits(), "{what} bf16");
                println!("ok {what}: {cfg}");
            }
        }
    }
}

/// One bound operation, its offsets rewritten on the device between launches: all rows to one
/// expert (many segments of 8), none routed, some past the last offset, and back; each launch
/// bit-identical to the reference of its routing, the output poisoned before each, so that a row
/// a launch leaves unwritten is NaN (and the reference zero: past the last offset only).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn offsets_rewritten_on_the_device_between_launches() {
    let b = gpu().with_overrides(Overrides::moe_gemv(true));
    let (n, k) = (384, 512);
    let m = problem(n, k, &[3, 0, 5, 9, 0, 1, 2, 0], 80);
    let t = m.tokens();
    let (da, dw, off) = (b.upload(&m.a).unwrap(), b.upload(&m.b).unwrap(), b.upload_i32(&m.offsets).unwrap());
    let c = b.alloc_output([1, t, n]).unwrap();
    let alpha = MoeAlpha::One(None);
    let op = DeviceOp::MoeGemm { a: Act::Nvfp4(&da.view()), b: &dw.view(), offsets: &off, alpha, c: &c.view() };
    let bound = b.bind(op).unwrap();
    assert!(bound.describe().contains("_moe"), "{}", bound.describe());
    let t32 = t as i32;
    // Device offsets are not checked: the kernels clamp them into the T rows as the grouped
    // launch does. Decreasing ones give unspecified rows: such a launch must only stay in bounds
    // (compute-sanitizer) and leave the next launch right.
    b.write_values(&off, &[5, 2, 9, -4, 30, 1, t32 + 7, 3]).unwrap();
    bound.launch().unwrap();
    b.sync().unwrap();
    for (offsets, clamped) in [
        (m.offsets.clone(), m.offsets.clone()),
        (vec![0, 0, 0, t32, t32, t32, t32, t32], vec![0, 0, 0, t32, t32, t32, t32, t32]),
        (vec![0; 8], vec![0; 8]),
        (vec![1, 1, 4, 4, 9, 10, 12, 12], vec![1, 1, 4, 4, 9, 10, 12, 12]),
        (vec![-3, 2, 4, 4, 9, 10, t32 + 40, t32 + 41], vec![0, 2, 4, 4, 9, 10, t32, t32]),
        (m.offsets.clone(), m.offsets.clone()),
    ] {
        b.write_values(&off, &offsets).unwrap();
        b.poison(&c).unwrap();
        bound.launch().unwrap();
        let got = b.download(&c).unwrap();
        let p = MoeGemm::new(m.a.clone(), m.b.clone(), clamped.clone(), None).unwrap();
        let want = CpuBackend.moe_gemm(&p).unwrap();
        let routed = *clamped.last().unwrap() as usize * n;
        let (g, w) = (got.data(), want.data());
        let same = (0..routed).all(|i| g[i].to_bits() == w[i].to_bits());
        assert!(same, "offsets {offsets:?}: a routed row differs");
        assert!(g[routed..].iter().all(|v| v.is_nan()), "offsets {offsets:?}: a row past the last offset was written");
        println!("ok offsets {offsets:?}");
    }
}
