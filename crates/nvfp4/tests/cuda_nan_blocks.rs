//! A 16-block the GPU quantizer marks (it held a NaN or an infinity: scale 0x7F, the E4M3 NaN,
//! docs/FORMAT.md §1) makes NaN exactly the outputs whose sums use it, on every kernel family:
//! the rows of the output for a marked block of A, the columns for one of B (the whole batch for
//! the GEMV's one-row B), and nothing else. The operands are quantized by the CPU model of the
//! GPU rule (`quantize_nan_blocks`; tests/cuda_quantize.rs holds the kernel to it bit for bit),
//! the expected NaN positions are computed from where the bad elements were planted, and every
//! output is also compared with the CPU reference (SPEC §4: values within the tolerance, NaN
//! status equal). Needs an NVIDIA GPU: run with
//! `cargo test --release --test cuda_nan_blocks -- --ignored`.

use nvfp4::backend::cuda::sm90::Op;
use nvfp4::backend::cuda::CudaBackend;
use nvfp4::check::{compare_outputs, Mode};
use nvfp4::format::{quantize_nan_blocks, GlobalScale, Nvfp4Tensor, ScaleLayout};
use nvfp4::problem::{Problem, Rng};
use nvfp4::{CpuBackend, DualGemm, Gemm, Gemv, GroupedGemm, MoeGemm};

mod common;
use common::{gpu, run_prepared, with_forced};

/// A bad element planted in an operand: (batch, row, k, value).
type Bad = (usize, usize, usize, f32);

/// `[l, rows, k]` random signed data below 1 in magnitude (no sum, nor a gated product, comes
/// near f16 overflow) with `bad` planted, quantized by the GPU rule with the ModelOpt global
/// scale.
fn operand(rng: &mut Rng, [l, rows, k]: [usize; 3], bad: &[Bad]) -> Nvfp4Tensor {
    let mut x: Vec<f32> =
        (0..l * rows * k).map(|_| (2.0 * rng.unit_f32() - 1.0) * 2f32.powi(rng.below(4) as i32 - 3)).collect();
    for &(b, r, c, v) in bad {
        x[(b * rows + r) * k + c] = v;
    }
    quantize_nan_blocks(&x, l, rows, k, GlobalScale::Auto).unwrap()
}

/// Whether output `[l, m, n]` must be NaN: its row holds a bad element of A, or its column one of
/// B (B's every row for the GEMV).
fn hit(bad_a: &[Bad], bad_b: &[Bad], l: usize, m: usize, n: usize, gemv: bool) -> bool {
    bad_a.iter().any(|&(b, r, _, _)| b == l && r == m) || bad_b.iter().any(|&(b, r, _, _)| b == l && (gemv || r == n))
}

/// Asserts that output tensor `t` (`[L, M, N]`) is NaN exactly where `nan` says.
#[track_caller]
fn assert_nan_at(t: &nvfp4::format::F16Tensor, nan: impl Fn(usize, usize, usize) -> bool, what: &str) {
    let [l, m, n] = t.shape();
    let mut count = 0;
    for (i, v) in t.data().iter().enumerate() {
        let (b, r, c) = (i / (m * n), i / n % m, i % n);
        assert_eq!(v.is_nan(), nan(b, r, c), "{what}: output [{b}, {r}, {c}] = {v}");
        assert!(v.is_nan() || v.is_finite(), "{what}: output [{b}, {r}, {c}] = {v}");
        count += nan(b, r, c) as usize;
    }
    assert!(count > 0 && count < l * m * n, "{what}: {count} NaN outputs of {}", l * m * n);
}

/// Runs `p` on the GPU in both scale layouts (outputs poisoned first) and checks each output
/// against the expected NaN positions (per output tensor) and the CPU reference.
fn check(b: &CudaBackend, p: &Problem, nan: &dyn Fn(usize, usize, usize, usize) -> bool, what: &str) {
    let reference = p.run(&CpuBackend).unwrap();
    for (g, t) in reference.tensors().iter().enumerate() {
        assert_nan_at(t, |l, m, n| nan(g, l, m, n), &format!("{what}: the CPU reference"));
    }
    for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
        let p = p.with_layout(layout);
        let got = match &p {
            Problem::Moe(_) => p.run(b).unwrap(),
            _ => run_prepared(&mut b.prepare(&p).unwrap()),
        };
        let what = format!("{what} {layout:?}");
        for (g, t) in got.tensors().iter().enumerate() {
            assert_nan_at(t, |l, m, n| nan(g, l, m, n), &what);
        }
        let report = compare_outputs(&got, &reference, Mode::Tolerance);
        assert!(report.passed(), "{what}: {report}");
        println!("ok {what}");
    }
}

/// Bad elements at the first and last element, a block boundary, and in the second batch.
fn bads(l: usize, rows: usize, k: usize, row_step: usize) -> Vec<Bad> {
    let mut v = vec![(0, 0, 0, f32::NAN), (l - 1, rows - 1, k - 1, f32::INFINITY)];
    if rows > row_step {
        v.push((0, row_step, 15, f32::NEG_INFINITY));
        v.push((0, row_step + 1, 16, f32::NAN));
    }
    if l > 1 {
        v.push((1, rows / 2, k / 2, f32::INFINITY));
    }
    v
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemv_nan_blocks_reach_their_rows() {
    let b = gpu();
    let mut rng = Rng::new(31);
    let (m, k, l) = (300, 1024, 3);
    let bad_a = bads(l, m, k, 37);
    // B: a NaN in batch 2 only (every output of that batch).
    let bad_b = [(2, 0, 500, f32::NAN)];
    let p = Problem::Gemv(
        Gemv::new(operand(&mut rng, [l, m, k], &bad_a), operand(&mut rng, [l, 1, k], &bad_b), Some(0.5)).unwrap(),
    );
    check(&b, &p, &|_, l, r, c| hit(&bad_a, &bad_b, l, r, c, true), "gemv");
}

/// The GEMM on each family: the small kernel, the skeleton, the mma.sync fallback.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gemm_nan_blocks_reach_their_rows_and_columns() {
    let b = gpu();
    let mut rng = Rng::new(32);
    for (family, (m, n, k, l)) in
        [("small", (128, 256, 256, 1)), ("sm90", (256, 512, 1024, 2)), ("off", (72, 40, 160, 2))]
    {
        let bad_a = bads(l, m, k, 9);
        let bad_b = bads(l, n, k, 21);
        let p = Problem::Gemm(
            Gemm::new(operand(&mut rng, [l, m, k], &bad_a), operand(&mut rng, [l, n, k], &bad_b), Some(0.75)).unwrap(),
        );
        with_forced(&b, Op::Gemm, family, |b| {
            check(b, &p, &|_, l, r, c| hit(&bad_a, &bad_b, l, r, c, false), &format!("gemm {family} {m}x{n}x{k}x{l}"))
        });
    }
}

/// The dual GEMM (skeleton, and the fallback for K % 32 != 0): a NaN in x1 or x2 makes the
/// gated output NaN.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn dual_gemm_nan_blocks_reach_their_rows_and_columns() {
    let b = gpu();
    let mut rng = Rng::new(33);
    for (m, n, k, l) in [(128, 256, 512, 1), (40, 72, 48, 2)] {
        let bad_a = bads(l, m, k, 7);
        let bad_b1 = [(0, 3, 20, f32::NAN)];
        let bad_b2 = [(l - 1, n - 2, k - 16, f32::NEG_INFINITY)];
        let (a, b1, b2) = (
            operand(&mut rng, [l, m, k], &bad_a),
            operand(&mut rng, [l, n, k], &bad_b1),
            operand(&mut rng, [l, n, k], &bad_b2),
        );
        let p = Problem::DualGemm(DualGemm::new(a, b1, b2, None).unwrap());
        let nan = |_, l, r, c| hit(&bad_a, &bad_b1, l, r, c, false) || hit(&[], &bad_b2, l, r, c, false);
        check(&b, &p, &nan, &format!("dual {m}x{n}x{k}x{l}"));
    }
}

/// The grouped GEMM (one launch) and its MoE form: a marked block reaches its own group's (its
/// own expert's) rows and columns only.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn grouped_nan_blocks_reach_their_group_only() {
    let b = gpu();
    let mut rng = Rng::new(34);
    let shapes = [(96, 128, 256), (72, 384, 512), (40, 256, 256)];
    let bad: Vec<(Vec<Bad>, Vec<Bad>)> = vec![
        (vec![(0, 5, 0, f32::NAN)], vec![]),
        (vec![], vec![(0, 383, 511, f32::INFINITY), (0, 0, 16, f32::NAN)]),
        (vec![(0, 39, 255, f32::NEG_INFINITY)], vec![(0, 100, 100, f32::NAN)]),
    ];
    let groups = shapes
        .iter()
        .zip(&bad)
        .map(|(&(m, n, k), (ba, bb))| {
            Gemm::new(operand(&mut rng, [1, m, k], ba), operand(&mut rng, [1, n, k], bb), None).unwrap()
        })
        .collect();
    let p = Problem::GroupedGemm(GroupedGemm::new(groups).unwrap());
    check(&b, &p, &|g, l, r, c| hit(&bad[g].0, &bad[g].1, l, r, c, false), "grouped");

    // MoE: 4 experts, expert 1 without tokens; tokens 30..80 are expert 2's.
    let (t, n, k) = (100, 192, 256);
    let offsets = vec![30, 30, 80, 100];
    let bad_a = [(0, 10, 31, f32::NAN), (0, 85, 200, f32::INFINITY)];
    let bad_w = [(2, 5, 0, f32::NAN), (1, 7, 7, f32::NAN)]; // expert 1's has no token to reach
    let expert = |row: usize| offsets.iter().position(|&o| row < o as usize).unwrap();
    let p = Problem::Moe(
        MoeGemm::new(operand(&mut rng, [1, t, k], &bad_a), operand(&mut rng, [4, n, k], &bad_w), offsets.clone(), None)
            .unwrap(),
    );
    let nan = |_, _, r, c| bad_a.iter().any(|a| a.1 == r) || bad_w.iter().any(|w| w.0 == expert(r) && w.1 == c);
    check(&b, &p, &nan, "moe");
}
