//! The quantizer at the edges of f32 (docs/FORMAT.md §1): a NaN or an infinity is refused naming
//! the first (`quantize`), or gives its block the E4M3 NaN scale (`quantize_nan_blocks`, the GPU
//! quantizer's rule, which the GPU tests compare the kernels with); the ModelOpt global scale is
//! taken over the finite elements and is at least 2^-126, so that a tensor of tiny values still
//! gives a global scale the checkpoint readers accept.

use half::{bf16, f16};

use nvfp4::format::{
    modelopt_global_scale, quantize, quantize_nan_blocks, GlobalScale, Nvfp4Tensor, MIN_GLOBAL_SCALE, NAN_SCALE,
};
use nvfp4::Error;

const GLOBALS: [GlobalScale; 3] = [GlobalScale::None, GlobalScale::Auto, GlobalScale::Fixed(0.5)];

/// Finite data exact in f16 and bf16: small multiples of 1/4 in -2 .. 2.
fn finite(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 % 17) as f32 - 8.0) / 4.0).collect()
}

/// The e2m1 code of each element, in element order.
fn codes(t: &Nvfp4Tensor) -> Vec<u8> {
    t.values().iter().flat_map(|&b| [b & 0xF, b >> 4]).collect()
}

/// Asserts that `r` is the refusal of element `index` at `at` holding `bad`.
#[track_caller]
fn assert_refused(r: nvfp4::Result<Nvfp4Tensor>, index: usize, at: [usize; 3], bad: f32, what: &str) {
    let e = r.expect_err(what);
    let shown = if bad.is_nan() {
        "NaN"
    } else if bad > 0.0 {
        "inf"
    } else {
        "-inf"
    };
    assert_eq!(
        e.to_string(),
        format!(
            "element {index} ([l, row, k] = {at:?}) is {shown}: NVFP4 has no NaN or infinity, refusing to quantize"
        ),
        "{what}"
    );
    match e {
        Error::NonFinite { index: i, at: a, value } => {
            assert_eq!((i, a), (index, at), "{what}");
            assert_eq!(value.is_nan(), bad.is_nan(), "{what}");
            assert!(bad.is_nan() || value == bad, "{what}: {value}");
        }
        e => panic!("{what}: {e:?}"),
    }
}

#[test]
fn quantize_refuses_nan_and_infinities_naming_the_first() {
    let [l, rows, k] = [2usize, 3, 48]; // 18 blocks, 144 elements per batch
    let n = l * rows * k;
    // The first and last elements, both sides of a block boundary, a row's first element, an
    // element of the second batch.
    let places =
        [(0, [0, 0, 0]), (n - 1, [1, 2, 47]), (15, [0, 0, 15]), (16, [0, 0, 16]), (48, [0, 1, 0]), (150, [1, 0, 6])];
    for (index, at) in places {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x = finite(n);
            x[index] = bad;
            // A later NaN is not the one named.
            if index + 1 < n {
                x[n - 1] = f32::NAN;
            }
            let h: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
            let b: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
            for global in GLOBALS {
                let what = format!("{bad} at {index}, {global:?}");
                assert_refused(quantize(&x, l, rows, k, global), index, at, bad, &format!("f32 {what}"));
                assert_refused(quantize(&h, l, rows, k, global), index, at, bad, &format!("f16 {what}"));
                assert_refused(quantize(&b, l, rows, k, global), index, at, bad, &format!("bf16 {what}"));
            }
        }
    }
}

/// The case: a tiny tensor with one infinity (and a NaN) no longer crushes the other
/// blocks. Rows of two blocks, values e2m1 magnitudes times 2^-10 (block 1: times 2^-11), so that
/// every code and scale is known exactly.
#[test]
fn nan_blocks_get_the_nan_scale_and_the_rest_ignores_them() {
    let (l, rows, k) = (1usize, 2usize, 32usize);
    // Codes 0..15 in order: +0, 0.5, 1, 1.5, 2, 3, 4, 6, then the same negated.
    let grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
    let row: Vec<f32> = (0..32).map(|i| grid[i % 16] * 2f32.powi(if i < 16 { -10 } else { -11 })).collect();
    let mut x = [row.clone(), row].concat();
    x[32 + 5] = f32::INFINITY; // block 2
    x[63] = f32::NAN; // block 3, its last element
    let t = quantize_nan_blocks(&x, l, rows, k, GlobalScale::Auto).unwrap();
    // amax over the finite elements: 6 * 2^-10.
    let g = 6.0 * 2f32.powi(-10) / 2688.0;
    assert_eq!(t.global_scale(), g);
    // Block 0: amax / 6 / g = 448 (0x7E) up to f32 rounding; block 1: 224 (0x76). So s is
    // 2^-10 and 2^-11 up to an ulp, and each element's quotient is its grid value.
    assert_eq!(t.scales(), &[0x7E, 0x76, NAN_SCALE, NAN_SCALE]);
    let want: Vec<u8> = (0..64).map(|i| if i < 32 { (i % 16) as u8 } else { 0 }).collect();
    assert_eq!(codes(&t), want);
    assert!(t.dequantize()[32..].iter().all(|v| v.is_nan()));

    // A given global scale is kept; the blocks with NaN or infinities are marked the same way.
    for global in [GlobalScale::None, GlobalScale::Fixed(2f32.powi(-10) / 448.0)] {
        let t = quantize_nan_blocks(&x, l, rows, k, global).unwrap();
        assert_eq!(&t.scales()[2..], &[NAN_SCALE, NAN_SCALE], "{global:?}");
        assert!(codes(&t)[32..].iter().all(|&c| c == 0), "{global:?}");
    }
    assert_eq!(quantize_nan_blocks(&x, l, rows, k, GlobalScale::None).unwrap().global_scale(), 1.0);
    // Every block bad: the global scale is 1 and every scale NaN.
    let t = quantize_nan_blocks(&[f32::NAN, f32::INFINITY].repeat(16), 1, 2, 16, GlobalScale::Auto).unwrap();
    assert_eq!((t.global_scale(), t.scales()), (1.0, &[NAN_SCALE, NAN_SCALE][..]));
}

/// On finite data the GPU rule is the quantizer itself, every dtype and global source.
#[test]
fn nan_blocks_equal_quantize_on_finite_data() {
    let (l, rows, k) = (2usize, 5usize, 64usize);
    let x: Vec<f32> = (0..l * rows * k).map(|i| ((i * 37 % 101) as f32 - 50.0) * 2f32.powi(i as i32 % 9 - 4)).collect();
    let h: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
    for global in GLOBALS {
        assert_eq!(quantize_nan_blocks(&x, l, rows, k, global).unwrap(), quantize(&x, l, rows, k, global).unwrap());
        assert_eq!(quantize_nan_blocks(&h, l, rows, k, global).unwrap(), quantize(&h, l, rows, k, global).unwrap());
    }
}

#[test]
fn modelopt_global_scale_ignores_nan_and_infinities() {
    assert_eq!(modelopt_global_scale(&[f32::NAN, -5376.0, f32::NEG_INFINITY, 1.0]), 2.0);
    assert_eq!(modelopt_global_scale(&[2688.0, f32::INFINITY]), 1.0);
    // Nothing finite and nonzero: 1.
    assert_eq!(modelopt_global_scale(&[f32::NAN, f32::INFINITY, -0.0]), 1.0);
    assert_eq!(modelopt_global_scale(&[0.0; 16]), 1.0);
}

/// amax / 2688 below 2^-126 (a subnormal, or 0 for amax = 1e-44) gives 2^-126.
#[test]
fn modelopt_global_scale_is_at_least_the_smallest_normal_f32() {
    let min = 2f32.powi(-126);
    assert_eq!(MIN_GLOBAL_SCALE, min);
    assert_eq!(modelopt_global_scale(&[1e-44; 16]), min);
    assert_eq!(modelopt_global_scale(&[f32::from_bits(1)]), min);
    assert_eq!(modelopt_global_scale(&[-2f32.powi(-130)]), min);
    // 2688 * 2^-126 is the smallest amax whose quotient is normal: exactly 2^-126 there, and
    // larger quotients are kept as they are.
    assert_eq!(modelopt_global_scale(&[2688.0 * min]), min);
    let above = f32::from_bits((2688.0 * min).to_bits() + 1);
    assert_eq!(modelopt_global_scale(&[above]), above / 2688.0);
    assert!(above / 2688.0 > min);
}

/// A tensor of subnormals (1e-44 underflowed amax / 2688 to 0: a global scale the readers
/// refuse) quantizes with global 2^-126: to zeros when its values are below what that global
/// can hold, and exactly per the rule otherwise.
#[test]
fn tiny_tensors_quantize_with_the_smallest_normal_global_scale() {
    let min = 2f32.powi(-126);
    let t = quantize(&[1e-44f32; 64], 1, 2, 32, GlobalScale::Auto).unwrap();
    assert_eq!(t.global_scale(), min);
    assert!(t.scales().iter().all(|&s| s == 0) && t.values().iter().all(|&v| v == 0));

    // amax 2^-130: scale e4m3(2^-130 / 6 / 2^-126) = e4m3(0.0104..) = 5 * 2^-9 (code 0x05, an
    // e4m3 subnormal), s = 5 * 2^-135; quotients 6.4 -> 6 (code 7), 3.2 -> 3 (code 5), -1.6 ->
    // -1.5 (code 11), 0 -> 0.
    let mut x = vec![0f32; 32];
    x[..3].copy_from_slice(&[2f32.powi(-130), 2f32.powi(-131), -(2f32.powi(-132))]);
    // Block 1, amax 2^-127: e4m3(2^-1 / 6 = 0.0833..) = 11/128 (code 0x1B), s = 11 * 2^-133;
    // 64/11 = 5.8.. -> 6.
    x[16] = 2f32.powi(-127);
    let b: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    for t in [quantize(&x, 1, 1, 32, GlobalScale::Auto).unwrap(), quantize(&b, 1, 1, 32, GlobalScale::Auto).unwrap()] {
        assert_eq!(t.global_scale(), min);
        assert_eq!(t.scales(), &[0x05, 0x1B]);
        let mut want = vec![0u8; 32];
        want[..3].copy_from_slice(&[7, 5, 11]);
        want[16] = 7;
        assert_eq!(codes(&t), want);
    }
}
