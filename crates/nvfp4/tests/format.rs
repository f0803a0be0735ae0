//! Number formats, nibble packing, scale layouts, tensor validation and the quantizer, checked
//! against the SPEC §1/§2 tables and formulas re-derived here (never against the library itself).

use half::{bf16, f16};
use nvfp4::format::{
    blocked_dims, blocked_offset, blocked_to_plain, e2m1_to_f32, e4m3_is_nan, e4m3_to_f32, f32_to_e2m1, f32_to_e4m3,
    nibble, pack_nibbles, plain_to_blocked, quantize, unpack_nibbles, GlobalScale, Nvfp4Tensor, ScaleLayout,
};
use nvfp4::Error;

// ---------------------------------------------------------------------------------------------
// Independent helpers (SPEC §1 and §2, written out again here).

/// SPEC §1 E2M1 table, codes 0..=7.
const E2M1_TABLE: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// E2M1 per the SPEC: codes 8..=15 are the negatives of 0..=7.
fn e2m1_spec(code: u8) -> f32 {
    let m = E2M1_TABLE[(code & 7) as usize];
    if code >= 8 {
        -m
    } else {
        m
    }
}

/// E4M3 per the SPEC: sign, 4 exponent bits (bias 7), 3 mantissa bits, subnormals m/8 * 2^-6,
/// 0x7F / 0xFF NaN.
fn e4m3_spec(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0f64 } else { 1.0 };
    let e = ((code >> 3) & 0xF) as i32;
    let m = (code & 7) as f64;
    if e == 15 && m == 7.0 {
        return f32::NAN;
    }
    let mag = if e == 0 { m / 8.0 * 2f64.powi(-6) } else { (1.0 + m / 8.0) * 2f64.powi(e - 7) };
    (sign * mag) as f32
}

/// SPEC §2 blocked offset, spelled out with its named sub-terms.
fn spec_blocked_offset(rows: usize, sf_cols: usize, i: usize, j: usize, b: usize) -> usize {
    let r_tiles = rows.div_ceil(128);
    let c_tiles = sf_cols.div_ceil(4);
    let batch_stride = r_tiles * c_tiles * 512;
    let row_tile = i / 128;
    let col_tile = j / 4;
    let row_in_32 = i % 32;
    let quarter = (i % 128) / 32;
    let col_in_4 = j % 4;
    b * batch_stride + row_tile * (c_tiles * 512) + col_tile * 512 + row_in_32 * 16 + quarter * 4 + col_in_4
}

/// xorshift64* stream for test data.
struct TestRng(u64);

impl TestRng {
    fn new(seed: u64) -> Self {
        TestRng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
}

/// Index of the nearest entry of ascending `table` to `mag` (ties to the even index, beyond the
/// end saturating), by brute force over every entry.
fn brute_nearest(table: &[f32], mag: f32) -> usize {
    let mut best = 0;
    let mut best_d = f64::INFINITY;
    for (i, &v) in table.iter().enumerate() {
        let d = (mag as f64 - v as f64).abs();
        if d < best_d || (d == best_d && i.is_multiple_of(2)) {
            best = i;
            best_d = d;
        }
    }
    best
}

fn next_up(x: f32) -> f32 {
    assert!(x > 0.0 && x.is_finite());
    f32::from_bits(x.to_bits() + 1)
}

fn next_down(x: f32) -> f32 {
    assert!(x > 0.0 && x.is_finite());
    f32::from_bits(x.to_bits() - 1)
}

// ---------------------------------------------------------------------------------------------
// E2M1

#[test]
fn e2m1_decode_all_16_codes_match_spec_table() {
    // Written out from the SPEC table by hand, codes 0..=15.
    let expected: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
    for code in 0u8..16 {
        let got = e2m1_to_f32(code);
        assert_eq!(got.to_bits(), expected[code as usize].to_bits(), "code {code}: got {got}");
        assert_eq!(got.to_bits(), e2m1_spec(code).to_bits());
    }
    // -0 is code 8: zero with the sign bit set.
    assert_eq!(e2m1_to_f32(8), 0.0);
    assert!(e2m1_to_f32(8).is_sign_negative());
    assert!(e2m1_to_f32(0).is_sign_positive());
}

#[test]
fn e2m1_encode_round_trips_every_code() {
    for code in 0u8..16 {
        let v = e2m1_spec(code);
        assert_eq!(f32_to_e2m1(v), code, "value {v}");
    }
}

#[test]
fn e2m1_encode_midpoints_round_to_even_code() {
    // (input, expected code): each a midpoint of two neighbours, resolved to the even code.
    let cases: [(f32, u8); 7] = [
        (0.25, 0), // 0 (code 0) | 0.5 (code 1)
        (0.75, 2), // 0.5 (1) | 1.0 (2)
        (1.25, 2), // 1.0 (2) | 1.5 (3)
        (1.75, 4), // 1.5 (3) | 2.0 (4)
        (2.5, 4),  // 2 (4) | 3 (5)
        (3.5, 6),  // 3 (5) | 4 (6)
        (5.0, 6),  // 4 (6) | 6 (7)
    ];
    for (x, code) in cases {
        assert_eq!(f32_to_e2m1(x), code, "midpoint {x}");
        assert_eq!(f32_to_e2m1(-x), code | 8, "midpoint {}", -x);
        // Just off the midpoint, the nearer neighbour wins.
        assert_eq!(f32_to_e2m1(next_down(x)) as usize, brute_nearest(&E2M1_TABLE, next_down(x)));
        assert_eq!(f32_to_e2m1(next_up(x)) as usize, brute_nearest(&E2M1_TABLE, next_up(x)));
    }
    assert_eq!(f32_to_e2m1(0.26), 1);
    assert_eq!(f32_to_e2m1(0.24), 0);
    assert_eq!(f32_to_e2m1(4.99), 6);
    assert_eq!(f32_to_e2m1(5.01), 7);
    assert_eq!(f32_to_e2m1(-5.01), 15);
}

#[test]
fn e2m1_encode_saturates_and_keeps_sign() {
    for x in [6.0f32, 6.5, 7.0, 100.0, 1e30, f32::MAX, f32::INFINITY] {
        assert_eq!(f32_to_e2m1(x), 7, "{x}");
        assert_eq!(f32_to_e2m1(-x), 15, "{}", -x);
    }
    assert_eq!(f32_to_e2m1(0.0), 0);
    assert_eq!(f32_to_e2m1(-0.0), 8);
    // Small negatives round to -0, not +0.
    assert_eq!(f32_to_e2m1(-0.1), 8);
    assert_eq!(f32_to_e2m1(-1e-30), 8);
}

#[test]
fn e2m1_encode_matches_brute_force_on_a_grid() {
    for i in -1000i32..=1000 {
        let x = i as f32 / 128.0;
        let mag_code = brute_nearest(&E2M1_TABLE, x.abs()) as u8;
        let want = if x.is_sign_negative() { mag_code | 8 } else { mag_code };
        assert_eq!(f32_to_e2m1(x), want, "x = {x}");
    }
}

// ---------------------------------------------------------------------------------------------
// E4M3

#[test]
fn e4m3_decode_all_256_codes_match_formula() {
    for code in 0u8..=255 {
        let got = e4m3_to_f32(code);
        let want = e4m3_spec(code);
        if want.is_nan() {
            assert!(got.is_nan(), "code {code:#04x} must be NaN, got {got}");
            assert!(e4m3_is_nan(code));
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "code {code:#04x}: got {got}, want {want}");
            assert!(!e4m3_is_nan(code), "code {code:#04x}");
        }
    }
    // Only the two SPEC NaN codes.
    let nans: Vec<u8> = (0u8..=255).filter(|&c| e4m3_to_f32(c).is_nan()).collect();
    assert_eq!(nans, vec![0x7F, 0xFF]);
}

#[test]
fn e4m3_decode_hand_checked_codes() {
    let cases: [(u8, f32); 12] = [
        (0x00, 0.0),
        (0x01, 1.0 / 512.0), // smallest subnormal: 1/8 * 2^-6
        (0x07, 7.0 / 512.0), // largest subnormal
        (0x08, 1.0 / 64.0),  // smallest normal 2^-6
        (0x30, 0.5),         // e = 6
        (0x38, 1.0),         // e = 7
        (0x3C, 1.5),         // 1 + 4/8
        (0x40, 2.0),         // e = 8
        (0x77, 240.0),       // e = 14, m = 7: 1.875 * 128
        (0x7D, 416.0),       // e = 15, m = 5: 1.625 * 256
        (0x7E, 448.0),       // max finite
        (0xB8, -1.0),        // sign bit
    ];
    for (code, v) in cases {
        assert_eq!(e4m3_to_f32(code), v, "code {code:#04x}");
    }
    assert_eq!(e4m3_to_f32(0x80), 0.0);
    assert!(e4m3_to_f32(0x80).is_sign_negative());
    assert_eq!(e4m3_to_f32(0xFE), -448.0);
}

#[test]
fn e4m3_encode_round_trips_every_finite_code() {
    for code in 0u8..=255 {
        if code & 0x7F == 0x7F {
            continue;
        }
        let v = e4m3_spec(code);
        assert_eq!(f32_to_e4m3(v), code, "value {v} (code {code:#04x})");
    }
    assert_eq!(f32_to_e4m3(-0.0), 0x80);
    assert_eq!(f32_to_e4m3(0.0), 0x00);
}

#[test]
fn e4m3_encode_ties_to_even_hand_checked() {
    let cases: [(f32, u8); 9] = [
        (1.0625, 0x38),       // 1.0 (0x38) | 1.125 (0x39)
        (1.1875, 0x3A),       // 1.125 (0x39) | 1.25 (0x3A)
        (1.9375, 0x40),       // 1.875 (0x3F) | 2.0 (0x40), across a binade
        (1.0 / 1024.0, 0x00), // 0 | 2^-9: half the smallest subnormal
        (1.5 / 512.0, 0x02),  // subnormals 1/8 | 2/8 (x 2^-6)
        (2.5 / 512.0, 0x02),  // 2/8 | 3/8
        (7.5 / 512.0, 0x08),  // largest subnormal | smallest normal
        (400.0, 0x7C),        // 384 (0x7C) | 416 (0x7D)
        (432.0, 0x7E),        // 416 (0x7D) | 448 (0x7E)
    ];
    for (x, code) in cases {
        assert_eq!(f32_to_e4m3(x), code, "{x}");
        assert_eq!(f32_to_e4m3(-x), code | 0x80, "{}", -x);
    }
    // Just above half the smallest subnormal rounds up.
    assert_eq!(f32_to_e4m3(next_up(1.0 / 1024.0)), 0x01);
}

#[test]
fn e4m3_encode_every_midpoint_and_its_neighbours() {
    let values: Vec<f32> = (0u8..0x7F).map(e4m3_spec).collect();
    for c in 0..values.len() - 1 {
        let (lo, hi) = (values[c], values[c + 1]);
        let mid = (lo + hi) / 2.0; // at most 5 significant bits: exact
        assert_eq!(mid as f64, (lo as f64 + hi as f64) / 2.0);
        let even = if c.is_multiple_of(2) { c } else { c + 1 } as u8;
        assert_eq!(f32_to_e4m3(mid), even, "midpoint of {lo} and {hi}");
        assert_eq!(f32_to_e4m3(next_down(mid)), c as u8, "just below {mid}");
        assert_eq!(f32_to_e4m3(next_up(mid)), c as u8 + 1, "just above {mid}");
        assert_eq!(f32_to_e4m3(-mid), even | 0x80);
    }
}

#[test]
fn e4m3_encode_saturates_and_maps_nan_to_nan() {
    for x in [448.0f32, 449.0, 464.0, 480.0, 1000.0, 1e6, f32::MAX, f32::INFINITY] {
        assert_eq!(f32_to_e4m3(x), 0x7E, "{x}");
        assert_eq!(f32_to_e4m3(-x), 0xFE, "{}", -x);
    }
    for x in [f32::NAN, -f32::NAN] {
        let c = f32_to_e4m3(x);
        assert!(e4m3_is_nan(c), "NaN encoded as {c:#04x}");
        assert!(e4m3_to_f32(c).is_nan());
    }
}

#[test]
fn e4m3_encode_matches_brute_force_on_random_values() {
    let table: Vec<f32> = (0u8..0x7F).map(e4m3_spec).collect();
    let mut rng = TestRng::new(11);
    for _ in 0..50_000 {
        // Log-uniform magnitudes over the whole range, subnormals to beyond saturation.
        let e = rng.uniform(-12.0, 10.0);
        let x = 2f32.powf(e);
        let mag = brute_nearest(&table, x) as u8;
        assert_eq!(f32_to_e4m3(x), mag, "{x}");
        assert_eq!(f32_to_e4m3(-x), mag | 0x80, "{}", -x);
    }
}

// ---------------------------------------------------------------------------------------------
// Nibble packing

/// Probe positions in a row of `k` elements.
fn k_probes(k: usize) -> Vec<usize> {
    let mut p: Vec<usize> = [0, 1, 15, 16, 31, 32, 127, 128].into_iter().filter(|&x| x < k).collect();
    p.push(k - 2);
    p.push(k - 1);
    p
}

#[test]
fn nibble_packing_puts_even_k_in_low_nibble() {
    let k = 256;
    let mut rng = TestRng::new(3);
    let codes: Vec<u8> = (0..k).map(|_| rng.below(16) as u8).collect();
    let packed = pack_nibbles(&codes);
    assert_eq!(packed.len(), k / 2);
    for kk in k_probes(k) {
        let byte = packed[kk / 2];
        let want = codes[kk];
        let got = if kk.is_multiple_of(2) { byte & 0x0F } else { byte >> 4 };
        assert_eq!(got, want, "k = {kk}: byte {byte:#04x}");
        assert_eq!(nibble(&packed, kk), want, "nibble() at k = {kk}");
    }
    // Every byte by hand: low = codes[2t], high = codes[2t + 1].
    for (t, &byte) in packed.iter().enumerate() {
        assert_eq!(byte, codes[2 * t] | (codes[2 * t + 1] << 4), "byte {t}");
    }
    assert_eq!(unpack_nibbles(&packed), codes);
}

#[test]
fn nibble_order_seen_through_tensor_decode() {
    // Two rows, K = 256; a single nonzero code at each probe k, scale 1.0 (0x38).
    let (rows, k) = (2usize, 256usize);
    for kk in k_probes(k) {
        let mut values = vec![0u8; rows * k / 2];
        // Row 1, element kk: code 5 (3.0) placed by hand.
        let byte = &mut values[k / 2 + kk / 2];
        *byte |= if kk.is_multiple_of(2) { 5 } else { 5 << 4 };
        let scales = vec![0x38u8; rows * k / 16];
        let t = Nvfp4Tensor::new(1, rows, k, values, scales, ScaleLayout::Plain).unwrap();
        let deq = t.dequantize();
        for (idx, &v) in deq.iter().enumerate() {
            let want = if idx == k + kk { 3.0 } else { 0.0 };
            assert_eq!(v, want, "probe k = {kk}, element {idx}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Blocked scale layout

const LAYOUT_SHAPES: [(usize, usize, usize); 6] = [
    // (L, rows, K)
    (1, 130, 48),
    (2, 257, 80),
    (3, 1, 16),
    (1, 128, 64),
    (2, 129, 272),
    (1, 300, 48),
];

fn i_probes(rows: usize) -> Vec<usize> {
    let mut p: Vec<usize> = [0, 1, 15, 16, 31, 32, 127, 128].into_iter().filter(|&x| x < rows).collect();
    p.push(rows - 1);
    p
}

fn j_probes(sf_cols: usize) -> Vec<usize> {
    let mut p: Vec<usize> = [0, 1, 3, 4].into_iter().filter(|&x| x < sf_cols).collect();
    p.push(sf_cols - 1);
    p
}

#[test]
fn blocked_offset_matches_spec_formula_at_probes() {
    for (l, rows, k) in LAYOUT_SHAPES {
        let sf = k / 16;
        for b in [0, l - 1] {
            for i in i_probes(rows) {
                for j in j_probes(sf) {
                    let want = spec_blocked_offset(rows, sf, i, j, b);
                    assert_eq!(blocked_offset(rows, sf, i, j, b), want, "rows {rows} K {k}: ({i}, {j}, {b})");
                    assert_eq!(ScaleLayout::Blocked.offset(rows, sf, i, j, b), want);
                    assert_eq!(ScaleLayout::Plain.offset(rows, sf, i, j, b), (b * rows + i) * sf + j);
                }
            }
        }
    }
    // A few fully hand-computed offsets for rows = 257 (R = 3), K = 80 (K/16 = 5, C = 2):
    // batch stride 3 * 2 * 512 = 3072, row-tile stride 2 * 512 = 1024.
    assert_eq!(blocked_offset(257, 5, 0, 0, 0), 0);
    assert_eq!(blocked_offset(257, 5, 1, 0, 0), 16);
    assert_eq!(blocked_offset(257, 5, 32, 0, 0), 4);
    assert_eq!(blocked_offset(257, 5, 0, 1, 0), 1);
    assert_eq!(blocked_offset(257, 5, 0, 4, 0), 512);
    assert_eq!(blocked_offset(257, 5, 128, 0, 0), 1024);
    // i = 127: tile 0, i%32 = 31, quarter 3; j = 3.
    assert_eq!(blocked_offset(257, 5, 127, 3, 0), 31 * 16 + 3 * 4 + 3);
    // i = 256 (tile 2), j = 4 (col tile 1), batch 1.
    assert_eq!(blocked_offset(257, 5, 256, 4, 1), 3072 + 2 * 1024 + 512);
}

#[test]
fn blocked_buffer_length_is_r_c_512_l() {
    for (l, rows, k) in LAYOUT_SHAPES {
        let sf = k / 16;
        let (r, c) = (rows.div_ceil(128), sf.div_ceil(4));
        assert_eq!(blocked_dims(rows, sf), (r, c));
        assert_eq!(ScaleLayout::Blocked.len(l, rows, k), r * c * 512 * l, "L {l} rows {rows} K {k}");
        assert_eq!(ScaleLayout::Plain.len(l, rows, k), l * rows * sf);
        assert_eq!(plain_to_blocked(&vec![1u8; l * rows * sf], l, rows, sf).len(), r * c * 512 * l);
    }
    // Hand-computed: rows 130, K 48 -> R = 2, C = 1 -> 1024 bytes.
    assert_eq!(ScaleLayout::Blocked.len(1, 130, 48), 1024);
    // rows 257, K 80, L 2 -> R = 3, C = 2 -> 6144 bytes.
    assert_eq!(ScaleLayout::Blocked.len(2, 257, 80), 6144);
}

#[test]
fn plain_blocked_round_trip_and_zero_padding() {
    for (l, rows, k) in LAYOUT_SHAPES {
        let sf = k / 16;
        let mut rng = TestRng::new((rows * 1000 + k) as u64);
        // Nonzero bytes so every written position is recognisable.
        let plain: Vec<u8> = (0..l * rows * sf).map(|_| 1 + rng.below(255) as u8).collect();
        let blocked = plain_to_blocked(&plain, l, rows, sf);
        let mut used = vec![false; blocked.len()];
        for b in 0..l {
            for i in 0..rows {
                for j in 0..sf {
                    let off = spec_blocked_offset(rows, sf, i, j, b);
                    assert!(!used[off], "offset {off} used twice");
                    used[off] = true;
                    assert_eq!(blocked[off], plain[(b * rows + i) * sf + j], "({i}, {j}, {b})");
                }
            }
        }
        for (off, &u) in used.iter().enumerate() {
            if !u {
                assert_eq!(blocked[off], 0, "padding byte {off} not zero (L {l} rows {rows} K {k})");
            }
        }
        assert_eq!(blocked_to_plain(&blocked, l, rows, sf), plain);

        // Padding is don't-care on input: garbage there changes nothing.
        let mut dirty = blocked.clone();
        for (off, &u) in used.iter().enumerate() {
            if !u {
                dirty[off] = 0x7F;
            }
        }
        assert_eq!(blocked_to_plain(&dirty, l, rows, sf), plain);
    }
}

// ---------------------------------------------------------------------------------------------
// Tensor validation and layout conversion

#[test]
fn tensor_new_rejects_wrong_buffer_sizes() {
    let (l, rows, k) = (2usize, 130usize, 48usize);
    let values = vec![0u8; l * rows * k / 2];
    let plain = vec![0x38u8; l * rows * k / 16];
    let blocked = vec![0x38u8; 2 * 512 * l];
    assert!(Nvfp4Tensor::new(l, rows, k, values.clone(), plain.clone(), ScaleLayout::Plain).is_ok());
    assert!(Nvfp4Tensor::new(l, rows, k, values.clone(), blocked.clone(), ScaleLayout::Blocked).is_ok());

    let short = values[1..].to_vec();
    match Nvfp4Tensor::new(l, rows, k, short, plain.clone(), ScaleLayout::Plain) {
        Err(Error::BufferSize { expected, got, .. }) => {
            assert_eq!((expected, got), (l * rows * k / 2, l * rows * k / 2 - 1))
        }
        other => panic!("short values: {other:?}"),
    }
    let mut long = plain.clone();
    long.push(0);
    match Nvfp4Tensor::new(l, rows, k, values.clone(), long, ScaleLayout::Plain) {
        Err(Error::BufferSize { expected, got, .. }) => assert_eq!((expected, got), (l * rows * 3, l * rows * 3 + 1)),
        other => panic!("long plain scales: {other:?}"),
    }
    // Plain-sized scales declared blocked are refused, and the other way round.
    match Nvfp4Tensor::new(l, rows, k, values.clone(), plain.clone(), ScaleLayout::Blocked) {
        Err(Error::BufferSize { expected, got, .. }) => assert_eq!((expected, got), (2048, plain.len())),
        other => panic!("plain buffer as blocked: {other:?}"),
    }
    assert!(matches!(Nvfp4Tensor::new(l, rows, k, values, blocked, ScaleLayout::Plain), Err(Error::BufferSize { .. })));
}

#[test]
fn tensor_new_rejects_k_not_multiple_of_16_and_zero_dims() {
    for k in [8usize, 24, 40, 100] {
        let r = Nvfp4Tensor::new(1, 4, k, vec![0; 4 * k / 2], vec![0; 4 * k.div_ceil(16)], ScaleLayout::Plain);
        match r {
            Err(Error::KNotMultipleOf16 { k: kk }) => assert_eq!(kk, k),
            other => panic!("K = {k}: {other:?}"),
        }
    }
    assert!(matches!(Nvfp4Tensor::new(1, 0, 16, vec![], vec![], ScaleLayout::Plain), Err(Error::Shape(_))));
    assert!(matches!(Nvfp4Tensor::new(0, 1, 16, vec![], vec![], ScaleLayout::Plain), Err(Error::Shape(_))));
    assert!(matches!(Nvfp4Tensor::new(1, 1, 0, vec![], vec![], ScaleLayout::Plain), Err(Error::Shape(_))));
}

#[test]
fn tensor_to_layout_round_trips_and_scale_reads_agree() {
    for (l, rows, k) in LAYOUT_SHAPES {
        let sf = k / 16;
        let mut rng = TestRng::new((l * rows + k) as u64);
        let values: Vec<u8> = (0..l * rows * k / 2).map(|_| rng.below(256) as u8).collect();
        let scales: Vec<u8> = (0..l * rows * sf).map(|_| rng.below(0x7F) as u8).collect();
        let plain =
            Nvfp4Tensor::new(l, rows, k, values, scales.clone(), ScaleLayout::Plain).unwrap().with_global_scale(0.25);
        let blocked = plain.to_layout(ScaleLayout::Blocked);
        assert_eq!(blocked.layout(), ScaleLayout::Blocked);
        assert_eq!(blocked.scales().len(), ScaleLayout::Blocked.len(l, rows, k));
        assert_eq!(blocked.values(), plain.values());
        assert_eq!(blocked.global_scale(), 0.25);
        for b in 0..l {
            for i in 0..rows {
                for j in 0..sf {
                    let want = scales[(b * rows + i) * sf + j];
                    assert_eq!(plain.scale(b, i, j), want);
                    assert_eq!(blocked.scale(b, i, j), want, "({b}, {i}, {j})");
                    assert_eq!(blocked.scales()[spec_blocked_offset(rows, sf, i, j, b)], want);
                }
            }
        }
        assert_eq!(blocked.to_layout(ScaleLayout::Plain), plain);
        assert_eq!(blocked.to_layout(ScaleLayout::Blocked), blocked);
        assert_eq!(plain.dequantize(), blocked.dequantize());
    }
}

#[test]
fn tensor_built_from_blocked_buffer_with_garbage_padding() {
    let (l, rows, k) = (2usize, 130usize, 80usize);
    let sf = k / 16;
    let mut rng = TestRng::new(99);
    let plain: Vec<u8> = (0..l * rows * sf).map(|_| rng.below(0x7F) as u8).collect();
    let (r, c) = (rows.div_ceil(128), sf.div_ceil(4));
    let mut blocked = vec![0xFFu8; l * r * c * 512]; // NaN everywhere, then the real entries
    for b in 0..l {
        for i in 0..rows {
            for j in 0..sf {
                blocked[spec_blocked_offset(rows, sf, i, j, b)] = plain[(b * rows + i) * sf + j];
            }
        }
    }
    let values: Vec<u8> = (0..l * rows * k / 2).map(|_| rng.below(256) as u8).collect();
    let tb = Nvfp4Tensor::new(l, rows, k, values.clone(), blocked, ScaleLayout::Blocked).unwrap();
    let tp = Nvfp4Tensor::new(l, rows, k, values, plain, ScaleLayout::Plain).unwrap();
    assert_eq!(tb.to_layout(ScaleLayout::Plain), tp);
    let deq = tb.dequantize();
    assert!(deq.iter().all(|v| !v.is_nan()), "a padding scale leaked into the values");
    assert_eq!(deq, tp.dequantize());
    // Converting back produces zero padding, not the garbage.
    let re = tp.to_layout(ScaleLayout::Blocked);
    assert_eq!(re.scales().iter().filter(|&&s| s == 0xFF).count(), 0);
}

// ---------------------------------------------------------------------------------------------
// Quantizer

/// Reads a quantized tensor back with the test's own decoders: `(codes, scales)` per element and
/// per block, plain layout.
fn raw_codes(t: &Nvfp4Tensor) -> Vec<u8> {
    t.values().iter().flat_map(|&b| [b & 0xF, b >> 4]).collect()
}

#[test]
fn quantize_exactly_representable_inputs_round_trip() {
    let (l, rows, k) = (2usize, 5usize, 64usize);
    let mut rng = TestRng::new(5);
    let mut data = Vec::with_capacity(l * rows * k);
    for _ in 0..l * rows * k / 16 {
        // One power of two per block; 2^p in [2^-3, 2^5] keeps the scale 2^p / global a normal
        // E4M3 value for every global tried below.
        let p = rng.below(9) as i32 - 3;
        let pow = 2f32.powi(p);
        let forced = rng.below(16) as usize; // this element is ±6 * 2^p, so the scale is 2^p
        for e in 0..16 {
            let code = if e == forced { 7 | (rng.below(2) as u8 * 8) } else { rng.below(16) as u8 };
            data.push(e2m1_spec(code) * pow);
        }
    }
    for global in [GlobalScale::None, GlobalScale::Fixed(0.125), GlobalScale::Fixed(4.0)] {
        let t = quantize(&data, l, rows, k, global).unwrap();
        assert_eq!(t.layout(), ScaleLayout::Plain);
        assert_eq!((t.l(), t.rows(), t.k()), (l, rows, k));
        let deq = t.dequantize();
        for (i, (&x, &d)) in data.iter().zip(&deq).enumerate() {
            assert_eq!(x.to_bits(), d.to_bits(), "{global:?}: element {i}: {x} became {d}");
        }
        // The codes themselves, decoded by the test, times the decoded scale and global.
        let g = t.global_scale();
        let codes = raw_codes(&t);
        for (i, &x) in data.iter().enumerate() {
            let s = e4m3_spec(t.scales()[i / 16]);
            assert_eq!(e2m1_spec(codes[i]) * s * g, x);
        }
    }
}

/// The largest error the E2M1 grid allows at |x| / s = `r` (half the gap there, or the overshoot
/// beyond 6 when saturating).
fn e2m1_error_bound(r: f64) -> f64 {
    if r <= 2.0 {
        0.25
    } else if r <= 4.0 {
        0.5
    } else if r <= 6.0 {
        1.0
    } else {
        r - 6.0
    }
}

fn check_quantized_bound(data: &[f32], t: &Nvfp4Tensor, what: &str) {
    let g = t.global_scale() as f64;
    let deq = t.dequantize();
    for (bi, block) in data.chunks_exact(16).enumerate() {
        let s = e4m3_spec(t.scales()[bi]) as f64;
        assert!(s > 0.0, "{what}: block {bi} got a zero scale");
        let eff = s * g;
        // The block max lands within E4M3 rounding of 6 * scale.
        let amax = block.iter().fold(0f64, |m, &x| m.max((x as f64).abs()));
        let target = amax / 6.0 / g;
        let half_gap = 2f64.powi(s.log2().floor() as i32) / 16.0;
        assert!((target - s).abs() <= half_gap * (1.0 + 1e-6), "{what}: block {bi}: amax/6/g = {target}, scale {s}");
        for (e, &x) in block.iter().enumerate() {
            let d = deq[bi * 16 + e] as f64;
            let err = (x as f64 - d).abs();
            assert!(err <= eff * (1.0 + 1e-6), "{what}: element {}: {x} -> {d}, scale*global {eff}", bi * 16 + e);
            // Slack for the f32 rounding of the dequantized product (a non-power-of-two global).
            let tight = eff * e2m1_error_bound((x as f64).abs() / eff) + (x as f64).abs() * 1e-6;
            assert!(err <= tight, "{what}: element {}: {x} -> {d}, error {err} > {tight}", bi * 16 + e);
        }
    }
}

#[test]
fn quantize_random_inputs_within_nvfp4_bound() {
    let (l, rows, k) = (2usize, 33usize, 96usize);
    let mut rng = TestRng::new(17);
    // Blocks with amplitudes over a few decades, all large enough that GlobalScale::None keeps
    // the block scale in the normal E4M3 range (amax / 6 >= 2^-6).
    let data: Vec<f32> = (0..l * rows * k / 16)
        .flat_map(|_| {
            let amp = 2f32.powf(rng.uniform(-2.0, 8.0));
            (0..16).map(|_| rng.uniform(-amp, amp)).collect::<Vec<_>>()
        })
        .collect();
    let t = quantize(&data, l, rows, k, GlobalScale::None).unwrap();
    assert_eq!(t.global_scale(), 1.0);
    check_quantized_bound(&data, &t, "None");

    let t = quantize(&data, l, rows, k, GlobalScale::Auto).unwrap();
    let amax = data.iter().fold(0f32, |m, x| m.max(x.abs()));
    let want_g = amax / (6.0 * 448.0);
    assert!((t.global_scale() - want_g).abs() <= want_g * 1e-6, "global {} vs {want_g}", t.global_scale());
    check_quantized_bound(&data, &t, "Auto");
    // The block holding the tensor max gets the largest scale, 448.
    let max_block = data.iter().position(|x| x.abs() == amax).unwrap() / 16;
    assert_eq!(e4m3_spec(t.scales()[max_block]), 448.0);
}

#[test]
fn quantize_accepts_f16_and_bf16() {
    let (l, rows, k) = (1usize, 3usize, 32usize);
    let mut rng = TestRng::new(23);
    let base: Vec<f32> = (0..l * rows * k).map(|_| rng.uniform(-10.0, 10.0)).collect();
    let h: Vec<f16> = base.iter().map(|&x| f16::from_f32(x)).collect();
    let b: Vec<bf16> = base.iter().map(|&x| bf16::from_f32(x)).collect();
    let hw: Vec<f32> = h.iter().map(|x| x.to_f32()).collect();
    let bw: Vec<f32> = b.iter().map(|x| x.to_f32()).collect();
    for global in [GlobalScale::None, GlobalScale::Auto] {
        let th = quantize(&h, l, rows, k, global).unwrap();
        assert_eq!(th, quantize(&hw, l, rows, k, global).unwrap());
        check_quantized_bound(&hw, &th, "f16");
        let tb = quantize(&b, l, rows, k, global).unwrap();
        assert_eq!(tb, quantize(&bw, l, rows, k, global).unwrap());
        check_quantized_bound(&bw, &tb, "bf16");
    }
}

#[test]
fn quantize_all_zero_input_gives_zeros() {
    let data = vec![0f32; 2 * 4 * 32];
    for global in [GlobalScale::None, GlobalScale::Auto] {
        let t = quantize(&data, 2, 4, 32, global).unwrap();
        assert!(t.dequantize().iter().all(|&v| v == 0.0), "{global:?}");
        assert!(raw_codes(&t).iter().all(|&c| c & 7 == 0), "{global:?}");
        assert!(t.scales().iter().all(|&s| e4m3_spec(s) == 0.0));
        assert!(t.global_scale().is_finite() && t.global_scale() > 0.0);
    }
}

#[test]
fn quantize_rejects_bad_shapes() {
    assert!(matches!(quantize(&[0f32; 40], 1, 1, 40, GlobalScale::None), Err(Error::KNotMultipleOf16 { k: 40 })));
    assert!(matches!(quantize(&[0f32; 31], 1, 1, 32, GlobalScale::None), Err(Error::BufferSize { .. })));
}
