//! The W4A16 GEMV (kernels/gemv16.cu, family "gemv16") against the CPU reference
//! (`CpuBackend::gemv16_as`), through both operations that are this computation: `Op::Gemv` with
//! a 16-bit vector and `Op::Gemm` with one 16-bit activation row. Bit-identical on data whose FP32
//! sums are exact (activations {0, ±0.5, ±1, ±1.5, ±2} times a power of two, every E2M1 code,
//! scales of one or two significant bits), in both activation types, both output types, both
//! scale layouts, with and without alpha and a weight global scale, K % 32 == 16 included, L > 1,
//! split-K and several activation windows per slice; within SPEC §4's tolerance (bf16 output: its
//! resolution) on random data; NaN scales, infinite activations and one-hot probes at edge
//! indices; on a busy side stream with everything but the output dropped. Outputs are poisoned
//! before each launch and every case launches twice (split-K counters reset). Needs an NVIDIA
//! GPU: `cargo test --release --test cuda_gemv16 -- --ignored`.

use nvfp4::backend::cuda::{CudaBackend, DeviceOp};
use nvfp4::ops::Act;
use nvfp4::problem::{generate, Rng, Shape};
use nvfp4::{Backend, CpuBackend, Gemv, Nvfp4Tensor, OutTensor, OutputDtype, ScaleLayout};

mod common;
use common::gpu;

const F16: OutputDtype = OutputDtype::F16;
const BF16: OutputDtype = OutputDtype::Bf16;
const TYPES: [OutputDtype; 2] = [F16, BF16];
const LAYOUTS: [ScaleLayout; 2] = [ScaleLayout::Plain, ScaleLayout::Blocked];

/// Which operation carries the computation.
#[derive(Clone, Copy, Debug)]
enum Form {
    /// `Op::Gemv { a: weight, b: Act::Dense(x) }`, output `[L, N, 1]`.
    Gemv,
    /// `Op::Gemm { a: Act::Dense(x), b: weight }`, output `[L, 1, N]`.
    Gemm,
}

/// Weights `[L, N, K]`: every E2M1 code, scale bytes drawn from `scales`, global scale `global`.
fn weights(rng: &mut Rng, (n, k, l): (usize, usize, usize), scales: &[u8], global: f32) -> Nvfp4Tensor {
    let values = (0..l * n * k / 2).map(|_| rng.below(256) as u8).collect();
    let sf = (0..l * n * k / 16).map(|_| scales[rng.below(scales.len() as u32) as usize]).collect();
    Nvfp4Tensor::new(l, n, k, values, sf, ScaleLayout::Plain).unwrap().with_global_scale(global)
}

/// An activation `[L, 1, K]` of `dtype`: each element one of `values` times 2^p, p one of `exps`.
fn activation(rng: &mut Rng, (k, l): (usize, usize), dtype: OutputDtype, values: &[f32], exps: &[i32]) -> OutTensor {
    let bits = (0..l * k)
        .map(|_| {
            let v = values[rng.below(values.len() as u32) as usize];
            let p = exps[rng.below(exps.len() as u32) as usize];
            let x = v * 2f32.powi(p);
            let b = dtype.round_f32(x);
            assert_eq!(dtype.to_f32(b), x, "activations are exact in {dtype}");
            b
        })
        .collect();
    OutTensor::new(dtype, [l, 1, k], bits).unwrap()
}

/// Uploads `w` (in `layout`) and `x`, binds `form` with an output of `out`, and launches twice,
/// poisoning the output before each; returns both outputs and the plan. The route must be the
/// W4A16 GEMV's.
fn run(
    b: &CudaBackend,
    (w, x): (&Nvfp4Tensor, &OutTensor),
    alpha: Option<f32>,
    form: Form,
    out: OutputDtype,
) -> ([OutTensor; 2], String) {
    let (l, n) = (w.l(), w.rows());
    let (wd, xd) = (b.upload(w).unwrap(), b.upload_dense(x).unwrap());
    let shape = match form {
        Form::Gemv => [l, n, 1],
        Form::Gemm => [l, 1, n],
    };
    let c = b.alloc_output_as(shape, out).unwrap();
    let (wv, xv, cv) = (wd.view(), xd.view(), c.view());
    let op = match form {
        Form::Gemv => DeviceOp::Gemv { a: &wv, b: Act::Dense(&xv), alpha, c: &cv },
        Form::Gemm => DeviceOp::Gemm { a: Act::Dense(&xv), b: &wv, alpha, c: &cv },
    };
    let bound = b.bind(op).unwrap_or_else(|e| panic!("bind {form:?}: {e}"));
    assert_eq!(bound.route().family(), "gemv16", "{}", bound.describe());
    let launch = || {
        b.poison(&c).unwrap();
        bound.launch().unwrap();
        b.download_out(&c).unwrap()
    };
    ([launch(), launch()], bound.describe())
}

/// How outputs are compared.
#[derive(Clone, Copy, PartialEq)]
enum Rule {
    /// Every bit (NaN: both NaN).
    Exact,
    /// SPEC §4 (`1e-3 + 1e-3 |ref|`; bf16 output: `1e-3 + 2^-7 |ref|`, its resolution), the same
    /// NaN/inf status.
    Tolerance,
}

/// The first elements that fail `rule` (the same memory order in both forms), as (index, got, want).
fn differences(got: &OutTensor, want: &OutTensor, rule: Rule) -> Vec<(usize, f32, f32)> {
    assert_eq!((got.dtype(), got.bits().len()), (want.dtype(), want.bits().len()));
    let (g, w) = (got.to_f32(), want.to_f32());
    let rel = if got.dtype() == BF16 { 1.0 / 128.0 } else { 1e-3 };
    let passes = |i: usize| {
        let (gv, wv) = (f64::from(g[i]), f64::from(w[i]));
        match (rule, gv.is_nan() || wv.is_nan()) {
            (_, true) => gv.is_nan() && wv.is_nan(),
            (Rule::Exact, false) => got.bits()[i] == want.bits()[i],
            (Rule::Tolerance, false) if gv.is_infinite() || wv.is_infinite() => gv == wv,
            (Rule::Tolerance, false) => (gv - wv).abs() <= 1e-3 + rel * wv.abs(),
        }
    };
    (0..g.len()).filter(|&i| !passes(i)).map(|i| (i, g[i], w[i])).take(8).collect()
}

/// Runs every form and layout of `(w, x)` with outputs of `out` and compares each launch with the
/// CPU reference under `rule`.
fn check(
    b: &CudaBackend,
    (w, x): (&Nvfp4Tensor, &OutTensor),
    alpha: Option<f32>,
    out: OutputDtype,
    rule: Rule,
    what: &str,
) {
    let want = CpuBackend.gemv16_as(&Gemv::new(w.clone(), x.clone(), alpha).unwrap(), out).unwrap();
    for layout in LAYOUTS {
        let w = w.to_layout(layout);
        for form in [Form::Gemv, Form::Gemm] {
            let (got, plan) = run(b, (&w, x), alpha, form, out);
            for (launch, g) in got.iter().enumerate() {
                let bad = differences(g, &want, rule);
                assert!(
                    bad.is_empty(),
                    "{what} {layout:?} {form:?} launch {launch} ({plan}): (index, got, want) {bad:?}"
                );
            }
            println!("ok {what} {layout:?} {form:?}: {plan}");
        }
    }
}

/// Exact activations: {0, ±0.5, ±1, ±1.5, ±2} times 2^-1, 2^0 or 2^1.
const EXACT_X: [f32; 9] = [0.0, 0.5, -0.5, 1.0, -1.0, 1.5, -1.5, 2.0, -2.0];
const EXACT_EXPS: [i32; 3] = [-1, 0, 1];
/// Scale bytes of 0, 0.5, 1 and 2: with EXACT_X every product is a multiple of 2^-4 below 48, so
/// every partial sum below 2^20 is exact in f32: any K up to 21845, and the longer K here by far
/// (random signs keep the partial sums near a thousand).
const EXACT_SCALES: [u8; 4] = [0x00, 0x30, 0x38, 0x40];

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn exact_data_is_bit_identical() {
    let b = gpu();
    // (N, K, L): decode sizes, one row, odd N, K % 32 == 16, L > 1, split-K over a long K, and
    // K longer than one activation window without a split (4224 rows fill the slots).
    let shapes = [
        (8192, 8192, 1),
        (1, 16, 1),
        (7, 48, 3),
        (40, 4112, 1),
        (130, 64, 3),
        (257, 4128, 2),
        (2432, 4608, 2),
        (128, 16384, 1),
        (4224, 40960, 1),
        (2200, 36880, 2),
    ];
    for (i, &(n, k, l)) in shapes.iter().enumerate() {
        let mut rng = Rng::new(100 + i as u64);
        let w = weights(&mut rng, (n, k, l), &EXACT_SCALES, 1.0);
        for act in TYPES {
            let x = activation(&mut rng, (k, l), act, &EXACT_X, &EXACT_EXPS);
            for out in TYPES {
                check(&b, (&w, &x), None, out, Rule::Exact, &format!("{n}x{k}x{l} {act} -> {out}"));
            }
        }
    }
}

/// Alpha and the weight's global scale: the factor alpha x global in f32, applied in f64 before
/// the one rounding, as the reference does (1/3 is not a power of two: a second rounding would
/// show).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn alpha_and_global_scale_round_once() {
    let b = gpu();
    let mut rng = Rng::new(7);
    for (global, alpha) in [(0.5, Some(1.0 / 3.0)), (1.0 / 3.0, None), (1.0, Some(0.375)), (3.0e-3, Some(7.0))] {
        let w = weights(&mut rng, (1000, 4096, 2), &EXACT_SCALES, global);
        for act in TYPES {
            let x = activation(&mut rng, (4096, 2), act, &EXACT_X, &EXACT_EXPS);
            for out in TYPES {
                check(
                    &b,
                    (&w, &x),
                    alpha,
                    out,
                    Rule::Exact,
                    &format!("global {global} alpha {alpha:?} {act} -> {out}"),
                );
            }
        }
    }
}

/// Tiny scales (e4m3 subnormals 2^-9, 2^-8 and 2^-7): the f16 decode's products e2m1 * e4m3 * 2^-7
/// are f16 subnormals that the MMA must take as they are; still exact.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn tiny_scales_stay_exact() {
    let b = gpu();
    let mut rng = Rng::new(8);
    let w = weights(&mut rng, (300, 1040, 2), &[0x01, 0x02, 0x08], 1.0);
    for act in TYPES {
        let x = activation(&mut rng, (1040, 2), act, &EXACT_X, &[0]);
        for out in TYPES {
            check(&b, (&w, &x), Some(4096.0), out, Rule::Exact, &format!("tiny scales {act} -> {out}"));
        }
    }
}

/// Random activations and scales: FP32 sums round, so SPEC §4's tolerance. Alpha scales the
/// outputs to a few units, as a layer's are: the absolute part of the tolerance (1e-3) then bounds
/// the FP32 rounding of partial sums of that size, even where an output cancels to near zero.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn random_data_within_tolerance() {
    let b = gpu();
    let scales: Vec<u8> = (0x18..0x50).collect(); // 2^-4 .. 12
    let values: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) / 7.0).collect();
    for (i, &(n, k, l)) in [(4096, 4096, 1), (1000, 4112, 3), (7, 48, 2), (4224, 40960, 1)].iter().enumerate() {
        let mut rng = Rng::new(200 + i as u64);
        let w = weights(&mut rng, (n, k, l), &scales, 0.25);
        for act in TYPES {
            // Each value rounded to the activation's type: the reference reads the same bits.
            let bits: Vec<u16> =
                (0..l * k).map(|_| act.round_f32(values[rng.below(64) as usize] * (1.0 + rng.unit_f32()))).collect();
            let x = OutTensor::new(act, [l, 1, k], bits).unwrap();
            for out in TYPES {
                let alpha = 0.5 / (k as f32).sqrt();
                check(&b, (&w, &x), Some(alpha), out, Rule::Tolerance, &format!("random {n}x{k}x{l} {act} -> {out}"));
            }
        }
    }
}

/// A NaN scale makes exactly its row NaN (in its batch); an infinite activation makes every row
/// of its batch whose weight there is nonzero infinite, and NaN where that weight is zero
/// (0 x inf); everything else stays bit-identical.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn nan_scales_and_infinite_activations() {
    let b = gpu();
    let (n, k, l) = (260, 4128, 2);
    let mut rng = Rng::new(9);
    let w = weights(&mut rng, (n, k, l), &EXACT_SCALES, 1.0);
    let mut scales = w.scales().to_vec();
    let sf_cols = k / 16;
    scales[(n + 77) * sf_cols + 3] = 0x7F; // batch 1, row 77, block 3
    scales[(n - 1) * sf_cols + sf_cols - 1] = 0xFF; // batch 0, the last row's last block
    let w = Nvfp4Tensor::new(l, n, k, w.values().to_vec(), scales, ScaleLayout::Plain).unwrap();
    for act in TYPES {
        let mut x = activation(&mut rng, (k, l), act, &EXACT_X, &EXACT_EXPS);
        let mut bits = x.bits().to_vec();
        bits[1000] = act.round_f32(f32::INFINITY); // batch 0
        x = OutTensor::new(act, [l, 1, k], bits).unwrap();
        let want = CpuBackend.gemv16_as(&Gemv::new(w.clone(), x.clone(), None).unwrap(), act).unwrap();
        let wf = want.to_f32();
        assert!(wf[n + 77].is_nan() && wf[n - 1].is_nan(), "the reference marks the NaN rows");
        assert!(wf[..n].iter().any(|v| v.is_infinite()) && wf[n..].iter().filter(|v| v.is_nan()).count() == 1);
        check(&b, (&w, &x), None, act, Rule::Exact, &format!("NaN scales, inf activation, {act}"));
    }
}

/// One-hot activations at edge indices of K (nibble order, chunk, block and window boundaries):
/// the output is that column of the weight times its scale, in every row.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn one_hot_probes_at_edge_indices() {
    let b = gpu();
    let (n, k, l) = (130, 4128, 2);
    let mut rng = Rng::new(10);
    let w = weights(&mut rng, (n, k, l), &EXACT_SCALES, 1.0);
    for act in TYPES {
        for idx in [0, 1, 7, 8, 15, 16, 31, 32, 127, 128, 1023, 1024, k - 17, k - 16, k - 1] {
            let mut bits = vec![act.round_f32(0.0); l * k];
            bits[idx] = act.round_f32(1.5);
            bits[k + idx] = act.round_f32(-0.5);
            let x = OutTensor::new(act, [l, 1, k], bits).unwrap();
            check(&b, (&w, &x), None, act, Rule::Exact, &format!("one-hot k = {idx}, {act}"));
        }
    }
}

/// Bound and launched on a side stream kept busy by large GEMMs, the operands and the bound
/// operation dropped at once: the launch still reads live memory.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_busy_side_stream_and_dropped_operands() {
    let b = gpu();
    let side = b.stream().context().new_stream().expect("a second stream");
    let big = generate(&Shape::Gemm { m: 4096, n: 4096, k: 4096, l: 1 }, 1).unwrap();
    let nvfp4::problem::Problem::Gemm(g) = &big else { unreachable!() };
    let (ga, gb) = (b.upload(&g.a).unwrap(), b.upload(&g.b).unwrap());
    let gc = b.alloc_output([1, 4096, 4096]).unwrap();
    let busy = b.bind(DeviceOp::Gemm { a: Act::Nvfp4(&ga.view()), b: &gb.view(), alpha: None, c: &gc.view() }).unwrap();
    let mut rng = Rng::new(11);
    let cases: Vec<(Nvfp4Tensor, OutTensor, OutputDtype)> = [(8192, 8192, 1, BF16), (300, 4112, 3, F16)]
        .into_iter()
        .map(|(n, k, l, act)| {
            let w = weights(&mut rng, (n, k, l), &EXACT_SCALES, 1.0);
            let x = activation(&mut rng, (k, l), act, &EXACT_X, &EXACT_EXPS);
            (w, x, act)
        })
        .collect();
    for _ in 0..20 {
        busy.launch_on_stream(&side).unwrap();
    }
    let mut outs = Vec::new();
    for (w, x, act) in &cases {
        let (wd, xd) = (b.upload(w).unwrap(), b.upload_dense(x).unwrap());
        let c = b.alloc_output_as([w.l(), w.rows(), 1], *act).unwrap();
        b.poison(&c).unwrap();
        b.sync().unwrap();
        let op =
            b.bind(DeviceOp::Gemv { a: &wd.view(), b: Act::Dense(&xd.view()), alpha: None, c: &c.view() }).unwrap();
        op.launch_on_stream(&side).unwrap();
        drop((op, wd, xd));
        outs.push(c);
    }
    side.synchronize().unwrap();
    for ((w, x, act), c) in cases.iter().zip(&outs) {
        let want = CpuBackend.gemv16_as(&Gemv::new(w.clone(), x.clone(), None).unwrap(), *act).unwrap();
        let bad = differences(&b.download_out(c).unwrap(), &want, Rule::Exact);
        assert!(bad.is_empty(), "{:?} {act}: {bad:?}", (w.rows(), w.k(), w.l()));
    }
    drop((busy, ga, gb, gc));
}

/// The host path (`Backend::gemv16_as` / `gemm16_as` on the CUDA backend) gives the reference's
/// bits too, in the activation's type and in the other.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn the_host_path_matches() {
    let b = gpu();
    let mut rng = Rng::new(12);
    let w = weights(&mut rng, (515, 4112, 2), &EXACT_SCALES, 0.5);
    for act in TYPES {
        let x = activation(&mut rng, (4112, 2), act, &EXACT_X, &EXACT_EXPS);
        for out in TYPES {
            let gemv = Gemv::new(w.clone(), x.clone(), Some(0.75)).unwrap();
            let want = CpuBackend.gemv16_as(&gemv, out).unwrap();
            assert_eq!(differences(&b.gemv16_as(&gemv, out).unwrap(), &want, Rule::Exact), vec![]);
            let gemm = nvfp4::Gemm::new(x.clone(), w.clone(), Some(0.75)).unwrap();
            let got = b.gemm16_as(&gemm, out).unwrap();
            assert_eq!(got.shape(), [2, 1, 515]);
            assert_eq!(differences(&got, &want, Rule::Exact), vec![]);
        }
    }
}
