//! The GPU quantizer against the CPU quantizer, bit for bit (values, scales, global scale): the
//! CPU's model of the GPU rule, `quantize_nan_blocks`, which is `quantize` on finite data and
//! gives a block holding a NaN or an infinity the E4M3 NaN scale (docs/FORMAT.md §1). All but
//! the first test need an NVIDIA GPU and are `#[ignore]`d: run them with
//! `cargo test --release --test cuda_quantize -- --ignored` (or gpu-bin/test-cuda_quantize).
//!
//! The kernel decides most e2m1 codes from an approximate quotient and falls back to an exact
//! division near a rounding boundary (kernels/quantize.cu); these inputs sit on, and one or two
//! ulp either side of, every boundary times the block's scale, for scales across the e4m3 range
//! (subnormal ones included) and for structured (power-of-two) and generic global scales; every
//! bf16 and f16 bit pattern (NaN, infinities, subnormals, -0) against blocks of several amaxes;
//! zero blocks, saturation and extreme global scales; random data in odd shapes, both layouts,
//! the three sources of the global scale; NaN and infinities at edge positions (first and last
//! element, both sides of a block boundary, one infinity in a tiny tensor), tiny tensors whose
//! global scale is clamped to 2^-126, a device global scale that is not finite and > 0, and the
//! opt-in check that refuses them. Outputs are poisoned before each launch.

use half::{bf16, f16};

use nvfp4::backend::cuda::{self, CudaBackend, DenseBytes, DenseType, JobGlobal};
use nvfp4::bench::quantize::first_difference;
use nvfp4::format::{
    e2m1_to_f32, e4m3_to_f32, f32_to_e4m3, quantize, quantize_nan_blocks, GlobalScale, Nvfp4Tensor, ScaleLayout,
    NAN_SCALE,
};
use nvfp4::problem::Rng;
use nvfp4::Error;

mod common;
use common::gpu;

/// E2M1 rounding boundaries (midpoints between neighbouring magnitudes), the magnitudes
/// themselves, and 6 (saturation).
const POINTS: [f32; 15] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 7.0];

/// Global scales: structured (powers of two, where quotients land exactly on boundaries) and
/// generic, small and large.
const GLOBALS: [f32; 8] = [1.0, 0.5, 0.0123456, 1.0 / 2688.0, 3.7e-3, 1.0e-20, 7.5e12, 1.0e30];

fn bytes_of(x: &[f32], dtype: DenseType) -> Vec<u8> {
    match dtype {
        DenseType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DenseType::F16 => x.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect(),
        DenseType::Bf16 => x.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect(),
    }
}

/// Quantizes `x` (values exactly representable in `dtype`) `[l, rows, k]` on the GPU twice
/// (poisoned before each launch) and on the CPU (the GPU rule's model), asserts bit-identical
/// results and returns the GPU's.
#[allow(clippy::too_many_arguments)]
fn same_as_cpu(
    b: &CudaBackend,
    x: &[f32],
    dtype: DenseType,
    shape: [usize; 3],
    global: JobGlobal,
    layout: ScaleLayout,
    what: &str,
) -> Nvfp4Tensor {
    let [l, rows, k] = shape;
    let cpu_global = match global {
        JobGlobal::Auto => GlobalScale::Auto,
        JobGlobal::Value(g) | JobGlobal::Device(g) => GlobalScale::Fixed(g),
    };
    let plain = quantize_nan_blocks(x, l, rows, k, cpu_global).unwrap();
    let want_dequant = dequantized_bits(&plain, dtype.dequant_type());
    let want = plain.into_layout(layout);
    let bytes = bytes_of(x, dtype);
    let mut job = b.prepare_quantize(DenseBytes { dtype, bytes: &bytes, shape }, global, layout).unwrap();
    for launch in 0..2 {
        job.poison().unwrap();
        job.launch_dequant().unwrap();
        let (got, g) = job.dequant_output().unwrap();
        let label = format!("{what} dequant ({dtype:?}, {shape:?}, {global:?}), launch {launch}");
        same_dequant(&got, &want_dequant, dtype.dequant_type(), &label);
        assert_eq!(g.to_bits(), want.global_scale().to_bits(), "{label}: the global scale");
        job.poison().unwrap();
        job.launch().unwrap();
        let got = job.output().unwrap();
        if let Some(d) = first_difference(&got, &want) {
            panic!("{what} ({dtype:?}, {shape:?}, {global:?}, {layout:?}, launch {launch}): {d}");
        }
    }
    job.output().unwrap()
}

/// The CPU's expectation of the dequantizing pass (plain scales): every element's e2m1 * e4m3
/// (without the global scale; exact in f32) as `ty`'s bits.
fn dequantized_bits(q: &Nvfp4Tensor, ty: DenseType) -> Vec<u16> {
    let (values, scales) = (q.values(), q.scales());
    (0..values.len() * 2)
        .map(|i| {
            let code = (values[i / 2] >> (4 * (i % 2))) & 0xF;
            let v = e2m1_to_f32(code) * e4m3_to_f32(scales[i / 16]);
            match ty {
                DenseType::F16 => f16::from_f32(v).to_bits(),
                _ => bf16::from_f32(v).to_bits(),
            }
        })
        .collect()
}

/// Asserts the dequantizing pass's bytes equal `want` bit for bit (NaN for NaN: the device's
/// NaN payload is its own); the first differences named.
fn same_dequant(got: &[u8], want: &[u16], ty: DenseType, what: &str) {
    assert_eq!(got.len(), want.len() * 2, "{what}: output size");
    let nan = |b: u16| match ty {
        DenseType::F16 => f16::from_bits(b).is_nan(),
        _ => bf16::from_bits(b).is_nan(),
    };
    let bad: Vec<String> = got
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .zip(want)
        .enumerate()
        .filter(|&(_, (g, &w))| g != w && !(nan(g) && nan(w)))
        .take(4)
        .map(|(i, (g, w))| format!("element {i}: got {g:#06x}, want {w:#06x}"))
        .collect();
    assert!(bad.is_empty(), "{what}: {}", bad.join("; "));
}

/// Pads `x` with zeros to whole 16-blocks and returns it with its shape as one row.
fn one_row(mut x: Vec<f32>) -> (Vec<f32>, [usize; 3]) {
    x.resize(x.len().next_multiple_of(16), 0.0);
    let k = x.len();
    (x, [1, 1, k])
}

/// `v` moved by `d` ulps (through the bit pattern; `v` finite and positive).
fn ulps(v: f32, d: i32) -> f32 {
    f32::from_bits((v.to_bits() as i32 + d) as u32)
}

#[test]
fn no_gpu_is_a_typed_error() {
    if cuda::is_available() {
        return; // covered by the GPU tests
    }
    assert!(CudaBackend::new().is_err());
}

/// f32 blocks whose first element fixes the scale (codes across the e4m3 range, subnormal ones
/// included, and block amaxes on e4m3 rounding midpoints) and whose other elements are every
/// boundary and magnitude times the scale, exactly and up to 2 ulp either side, both signs.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn boundaries_times_the_scale_f32() {
    let b = gpu();
    for g in GLOBALS {
        let mut x = Vec::new();
        for code in 1u8..=126 {
            // The amax on the scale code itself, and on the midpoint to the next code (e4m3
            // rounding), nudged by an ulp.
            let here = e4m3_to_f32(code);
            let next = e4m3_to_f32(code + 1);
            for a6 in [here, ulps(0.5 * (here + next), -1), 0.5 * (here + next), ulps(0.5 * (here + next), 1)] {
                let amax = 6.0 * a6 * g;
                if !amax.is_finite() || amax == 0.0 {
                    continue;
                }
                let s = e4m3_to_f32(f32_to_e4m3(amax / 6.0 / g)) * g;
                let mut block = vec![amax];
                for p in POINTS {
                    let v = p * s;
                    if v.to_bits() < 4 || !v.is_finite() {
                        continue;
                    }
                    for d in -2..=2 {
                        let u = ulps(v, d).min(amax);
                        block.push(if d % 2 == 0 { u } else { -u });
                        if block.len() == 16 {
                            x.append(&mut block);
                            block.push(-amax);
                        }
                    }
                }
                block.resize(16, -0.0);
                x.append(&mut block);
            }
        }
        let (x, shape) = one_row(x);
        for global in [JobGlobal::Value(g), JobGlobal::Device(g)] {
            same_as_cpu(&b, &x, DenseType::F32, shape, global, ScaleLayout::Plain, &format!("boundaries g={g:e}"));
        }
    }
}

/// Every bit pattern of a 16-bit type, 15 per block after a block amax taken from a list that
/// spans the type's range (so the quotient x / s covers the e2m1 grid for many scales).
fn every_pattern(to_f32: impl Fn(u16) -> f32, amaxes: &[f32]) -> Vec<f32> {
    let mut x = Vec::new();
    for &a in amaxes {
        let mut bits = 0u32;
        while bits < 1 << 16 {
            x.push(a);
            for _ in 0..15 {
                x.push(to_f32(bits.min(0xFFFF) as u16));
                bits += 1;
            }
        }
    }
    x
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn every_bf16_value() {
    let b = gpu();
    let amaxes = [1.0e-38, 3.0e-20, 0.01, 0.75, 1.0, 6.0, 7.0, 96.0, 1.0e4, 3.0e30, 1.0e38];
    let x = every_pattern(|h| bf16::from_bits(h).to_f32(), &amaxes.map(|a: f32| bf16::from_f32(a).to_f32()));
    let (x, shape) = one_row(x);
    for global in [JobGlobal::Auto, JobGlobal::Value(1.0), JobGlobal::Value(0.0123456), JobGlobal::Value(0.25)] {
        same_as_cpu(&b, &x, DenseType::Bf16, shape, global, ScaleLayout::Plain, "every bf16");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn every_f16_value() {
    let b = gpu();
    let amaxes = [6.0e-8, 1.0e-4, 0.01, 0.75, 1.0, 6.0, 7.0, 96.0, 1.0e4, 65504.0];
    let x = every_pattern(|h| f16::from_bits(h).to_f32(), &amaxes.map(|a: f32| f16::from_f32(a).to_f32()));
    let (x, shape) = one_row(x);
    for global in [JobGlobal::Auto, JobGlobal::Value(1.0), JobGlobal::Value(0.0123456), JobGlobal::Device(2.0)] {
        same_as_cpu(&b, &x, DenseType::F16, shape, global, ScaleLayout::Plain, "every f16");
    }
}

/// Zero and negative-zero blocks (scale 0), NaN and infinity inside blocks (the NaN scale, and
/// an amax global scale over the finite elements), saturation (a global
/// scale too small for the data: scale 448 and codes ±6), scales that round to 0 or to e4m3
/// subnormals, f32 subnormal inputs, and global scales at the ends of the f32 range.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn specials_f32() {
    let b = gpu();
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let mut x: Vec<f32> = Vec::new();
    let blocks: [[f32; 4]; 10] = [
        [0.0, 0.0, 0.0, 0.0],
        [-0.0, -0.0, -0.0, -0.0],
        [nan, 1.0, -2.5, 0.3],
        [nan, nan, nan, nan],
        [inf, 1.0, -1.0, 1.0e30],
        [-inf, inf, nan, 5.0],
        [1.0e-45, -1.0e-40, 1.1754942e-38, 3.0e-39],
        [3.0e38, -3.4e38, 1.0, -7.0],
        [448.0 * 6.0, 1.0e6, -2688.0, 2687.9998],
        [0.001, -0.00075, 0.00125, 0.0005],
    ];
    for blk in blocks {
        for i in 0..16 {
            x.push(blk[i % 4] * if i < 4 { 1.0 } else { 0.5 });
        }
    }
    let (x, shape) = one_row(x);
    for g in [1.0, 1.0e-3, 1.0e-40, 1.0e-30, 1.0e30, f32::MAX, f32::MIN_POSITIVE, 0.0123456] {
        same_as_cpu(
            &b,
            &x,
            DenseType::F32,
            shape,
            JobGlobal::Value(g),
            ScaleLayout::Plain,
            &format!("specials g={g:e}"),
        );
    }
    same_as_cpu(&b, &x, DenseType::F32, shape, JobGlobal::Auto, ScaleLayout::Plain, "specials amax");
    // Only zeros: the amax global scale is 1.
    same_as_cpu(&b, &[0.0; 64], DenseType::F32, [1, 2, 32], JobGlobal::Auto, ScaleLayout::Blocked, "zeros");
}

/// Random signed data in shapes that end inside a CTA tile and inside a 128-row scale tile,
/// batches, every dtype, every global source, both layouts.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn random_shapes_layouts_and_sources() {
    let b = gpu();
    let shapes = [[1, 1, 16], [1, 3, 48], [2, 130, 32], [3, 77, 272], [1, 1000, 528], [2, 257, 1040], [1, 4096, 512]];
    let mut rng = Rng::new(11);
    for (i, shape) in shapes.into_iter().enumerate() {
        let n = shape.iter().product::<usize>();
        for dtype in [DenseType::F32, DenseType::F16, DenseType::Bf16] {
            let raw: Vec<f32> = (0..n)
                .map(|_| {
                    let u = 2.0 * rng.unit_f32() - 1.0;
                    let e = rng.below(24) as i32 - 12;
                    u * 2f32.powi(e)
                })
                .collect();
            // Values exactly representable in the input type.
            let x: Vec<f32> = match dtype {
                DenseType::F32 => raw,
                DenseType::F16 => raw.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
                DenseType::Bf16 => raw.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
            };
            let g = 0.01 + 0.001 * i as f32;
            for global in [JobGlobal::Auto, JobGlobal::Value(g), JobGlobal::Device(g)] {
                for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
                    same_as_cpu(&b, &x, dtype, shape, global, layout, "random");
                }
            }
        }
    }
}

/// Elements planted in an input: (index, value).
type Planted = Vec<(usize, f32)>;

/// `x` with the elements of `bad` planted.
fn planted(mut x: Vec<f32>, bad: &[(usize, f32)]) -> Vec<f32> {
    for &(i, v) in bad {
        x[i] = v;
    }
    x
}

/// Random signed data of `n` elements, exact in `dtype`, times `scale`.
fn random(rng: &mut Rng, n: usize, dtype: DenseType, scale: f32) -> Vec<f32> {
    let x = (0..n).map(|_| (2.0 * rng.unit_f32() - 1.0) * 2f32.powi(rng.below(12) as i32 - 6) * scale);
    match dtype {
        DenseType::F32 => x.collect(),
        DenseType::F16 => x.map(|v| f16::from_f32(v).to_f32()).collect(),
        DenseType::Bf16 => x.map(|v| bf16::from_f32(v).to_f32()).collect(),
    }
}

const DTYPES: [DenseType; 3] = [DenseType::F32, DenseType::F16, DenseType::Bf16];
const LAYOUTS: [ScaleLayout; 2] = [ScaleLayout::Plain, ScaleLayout::Blocked];

/// NaN and infinities at the edges: the first and last elements, both sides of a block boundary,
/// a row's first element and the second batch, and the case, one infinity in a tiny
/// tensor (whose other blocks keep their precision: the amax global scale ignores it). Every
/// dtype, global source and layout; a small shape and one of many tiles (300 x 512: 38 tiles of
/// 256 blocks, walked backwards after the amax pass). Bit-identical to the model, and the NaN
/// scales exactly on the blocks planted.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn nan_and_infinities_mark_exactly_their_blocks() {
    let b = gpu();
    let mut rng = Rng::new(19);
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    for shape in [[2, 3, 48], [1, 300, 512]] {
        let [l, rows, k] = shape;
        let n = l * rows * k;
        let cases: [(&str, Planted, bool); 5] = [
            ("first element", vec![(0, nan)], false),
            ("last element", vec![(n - 1, inf)], false),
            ("a block boundary", vec![(15, -inf), (16, nan)], false),
            ("a row start and the last batch", vec![(k, inf), (n - k / 2, nan), (n - k / 2 + 1, -inf)], false),
            ("one infinity in a tiny tensor", vec![(n / 2 + 3, inf)], true),
        ];
        for dtype in DTYPES {
            // Tiny: far below 1 (f16 keeps 2^-12 .. 2^-24 as subnormals; f32 and bf16 go lower).
            let tiny = if dtype == DenseType::F16 { 2f32.powi(-12) } else { 2f32.powi(-100) };
            for (what, bad, small) in &cases {
                let x = planted(random(&mut rng, n, dtype, if *small { tiny } else { 1.0 }), bad);
                let mut blocks: Vec<usize> = bad.iter().map(|&(i, _)| i / 16).collect();
                blocks.dedup();
                for global in [JobGlobal::Auto, JobGlobal::Value(0.37), JobGlobal::Device(0.37)] {
                    for layout in LAYOUTS {
                        let what = format!("{what} {shape:?}");
                        let got =
                            same_as_cpu(&b, &x, dtype, shape, global, layout, &what).into_layout(ScaleLayout::Plain);
                        let marked: Vec<usize> = (0..n / 16).filter(|&j| got.scales()[j] == NAN_SCALE).collect();
                        assert_eq!(marked, blocks, "{what} {dtype:?} {global:?} {layout:?}");
                        if *small && global == JobGlobal::Auto {
                            // The global scale comes from the finite elements: no block is crushed to zero.
                            assert!(got.global_scale() < tiny, "{what} {dtype:?}: global {}", got.global_scale());
                            let zero = (0..n / 16).filter(|&j| got.scales()[j] == 0).count();
                            assert_eq!(zero, 0, "{what} {dtype:?}: {zero} blocks with a zero scale");
                        }
                    }
                }
            }
        }
    }
}

/// amax / 2688 below 2^-126 (0 for f32 1e-44): the global scale is 2^-126 on the device too,
/// for the amax pass, bit-identical to the CPU quantizer.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn tiny_tensors_get_the_smallest_normal_global_scale() {
    let b = gpu();
    let mut pattern = vec![0f32; 32];
    pattern[..3].copy_from_slice(&[2f32.powi(-130), 2f32.powi(-131), -(2f32.powi(-132))]);
    pattern[16] = 2f32.powi(-127);
    let cases = [
        (DenseType::F32, vec![1e-44; 64]),
        (DenseType::F32, [pattern.clone(), pattern.clone()].concat()),
        (DenseType::Bf16, vec![2f32.powi(-133); 64]),
        (DenseType::Bf16, [pattern.clone(), pattern].concat()),
    ];
    for (dtype, x) in cases {
        assert_eq!(quantize(&x, 1, 2, 32, GlobalScale::Auto).unwrap().global_scale(), f32::MIN_POSITIVE);
        for layout in LAYOUTS {
            let got = same_as_cpu(&b, &x, dtype, [1, 2, 32], JobGlobal::Auto, layout, "tiny");
            assert_eq!(got.global_scale(), f32::MIN_POSITIVE, "{dtype:?} {layout:?}");
        }
    }
}

/// A global scale read from the device that is not finite and > 0 makes the global scale and
/// every block scale NaN, the values +0 (the host never sees the value without the check); the
/// checked launch refuses it, naming the value.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn invalid_device_global_scale_marks_every_block() {
    let b = gpu();
    let mut rng = Rng::new(23);
    let (l, rows, k) = (2, 130, 64);
    let x = random(&mut rng, l * rows * k, DenseType::F32, 1.0);
    let bytes = bytes_of(&x, DenseType::F32);
    for g in [0.0, -0.0, -1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for layout in LAYOUTS {
            let input = DenseBytes { dtype: DenseType::F32, bytes: &bytes, shape: [l, rows, k] };
            let mut job = b.prepare_quantize(input, JobGlobal::Device(g), layout).unwrap();
            let want = Nvfp4Tensor::new(
                l,
                rows,
                k,
                vec![0; l * rows * k / 2],
                vec![NAN_SCALE; l * rows * k / 16],
                ScaleLayout::Plain,
            )
            .unwrap()
            .into_layout(layout)
            .with_global_scale(f32::NAN);
            job.poison().unwrap();
            job.launch().unwrap();
            if let Some(d) = first_difference(&job.output().unwrap(), &want) {
                panic!("device global {g} {layout:?}: {d}");
            }
            job.poison().unwrap();
            let e = job.launch_checked().expect_err("the check refuses it");
            let msg = format!("invalid argument: the global scale on the device is {g}: it must be finite and > 0");
            assert_eq!(e.to_string(), msg, "{layout:?}");
            assert!(first_difference(&job.output().unwrap(), &want).is_none(), "checked {g} {layout:?}");
        }
    }
}

/// The opt-in check: it waits for the stream and names the first NaN or infinity (the smallest
/// index, wherever the launch met it first: the amax form walks the tiles backwards), as the
/// CPU quantizer does; the outputs are written as without it; repeated launches re-arm it; finite
/// data pass; a bad device global scale is named before any element.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn checked_launch_names_the_first_nan_or_infinity() {
    let b = gpu();
    let mut rng = Rng::new(29);
    let shape = [2, 300, 512]; // 19200 blocks: 75 tiles
    let [l, rows, k] = shape;
    let n = l * rows * k;
    let cases: [(Planted, usize, [usize; 3], f32); 3] = [
        (vec![(200_000, f32::INFINITY), (5_000, f32::NAN), (150_001, f32::NEG_INFINITY)], 5_000, [0, 9, 392], f32::NAN),
        (vec![(n - 1, f32::NEG_INFINITY)], n - 1, [1, 299, 511], f32::NEG_INFINITY),
        (vec![(153_600 + 16, f32::INFINITY), (153_600 + 15, f32::INFINITY)], 153_615, [1, 0, 15], f32::INFINITY),
    ];
    for dtype in DTYPES {
        for (bad, index, at, value) in &cases {
            let x = planted(random(&mut rng, n, dtype, 1.0), bad);
            let bytes = bytes_of(&x, dtype);
            for global in [JobGlobal::Auto, JobGlobal::Value(0.37), JobGlobal::Device(0.37)] {
                let cpu_global = match global {
                    JobGlobal::Auto => GlobalScale::Auto,
                    JobGlobal::Value(g) | JobGlobal::Device(g) => GlobalScale::Fixed(g),
                };
                // The CPU quantizer names the same element.
                match quantize(&x, l, rows, k, cpu_global) {
                    Err(Error::NonFinite { index: i, at: a, .. }) => assert_eq!((i, a), (*index, *at)),
                    r => panic!("the CPU quantizer: {r:?}"),
                }
                let want = quantize_nan_blocks(&x, l, rows, k, cpu_global).unwrap();
                let mut job =
                    b.prepare_quantize(DenseBytes { dtype, bytes: &bytes, shape }, global, ScaleLayout::Plain).unwrap();
                for launch in 0..2 {
                    job.poison().unwrap();
                    match job.launch_checked() {
                        Err(Error::NonFinite { index: i, at: a, value: v }) => {
                            assert_eq!((i, a), (*index, *at), "{dtype:?} {global:?} launch {launch}");
                            assert!(v.to_bits() == value.to_bits() || (v.is_nan() && value.is_nan()), "{v}");
                        }
                        r => panic!("{dtype:?} {global:?} launch {launch}: {r:?}"),
                    }
                    if let Some(d) = first_difference(&job.output().unwrap(), &want) {
                        panic!("checked {dtype:?} {global:?} launch {launch}: {d}");
                    }
                }
                // An unchecked launch after checked ones is unchanged.
                job.poison().unwrap();
                job.launch().unwrap();
                assert!(first_difference(&job.output().unwrap(), &want).is_none(), "{dtype:?} {global:?}");
            }
            // A bad device global scale is named first.
            let mut job = b
                .prepare_quantize(
                    DenseBytes { dtype, bytes: &bytes, shape },
                    JobGlobal::Device(0.0),
                    ScaleLayout::Plain,
                )
                .unwrap();
            assert!(matches!(job.launch_checked(), Err(Error::Invalid(_))), "{dtype:?}");
        }
        // Finite data pass the check, twice, bit-identical to the CPU quantizer.
        let x = random(&mut rng, n, dtype, 1.0);
        let bytes = bytes_of(&x, dtype);
        let want = quantize(&x, l, rows, k, GlobalScale::Auto).unwrap();
        let mut job = b
            .prepare_quantize(DenseBytes { dtype, bytes: &bytes, shape }, JobGlobal::Auto, ScaleLayout::Plain)
            .unwrap();
        for _ in 0..2 {
            job.poison().unwrap();
            job.launch_checked().unwrap();
            assert!(first_difference(&job.output().unwrap(), &want).is_none(), "finite {dtype:?}");
        }
    }
}
