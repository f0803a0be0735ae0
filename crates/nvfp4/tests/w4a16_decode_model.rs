//! A host model of the bit tricks of the W4A16 GEMV (kernels/nvfp4.cuh's W4A16 decoders and
//! kernels/gemv16.cu's staging of the activation): the same integer operations in Rust, each
//! hardware arithmetic step as IEEE rounding of the exact result, checked against SPEC §1 decoding
//! for every code, every nibble position and every scale byte. The tables are read from the
//! kernel header itself, so a change there is a change here.

use half::{bf16, f16};
use nvfp4::format::{e2m1_to_f32, e4m3_to_f32};

const HEADER: &str = include_str!("../kernels/nvfp4.cuh");
const GEMV16: &str = include_str!("../kernels/gemv16.cu");

/// The value of `constexpr u32 NAME = 0x...u;` in nvfp4.cuh.
fn header_const(name: &str) -> u32 {
    let line = HEADER
        .lines()
        .find(|l| l.starts_with(&format!("constexpr u32 {name} = ")))
        .unwrap_or_else(|| panic!("{name} not in nvfp4.cuh"));
    let hex = line.split("0x").nth(1).and_then(|h| h.split('u').next()).expect("hex constant");
    u32::from_str_radix(hex, 16).expect("hex")
}

/// PTX `prmt.b32` (default mode): byte i of the result is byte (sel >> 4i) & 7 of {b, a}, or that
/// byte's sign replicated when bit 3 of the selector nibble is set.
fn prmt(a: u32, b: u32, sel: u32) -> u32 {
    let bytes = (u64::from(b) << 32 | u64::from(a)).to_le_bytes();
    (0..4).fold(0u32, |r, i| {
        let s = (sel >> (4 * i)) & 0xF;
        let byte = bytes[(s & 7) as usize];
        let out = if s & 8 != 0 {
            if byte & 0x80 != 0 {
                0xFF
            } else {
                0
            }
        } else {
            byte
        };
        r | u32::from(out) << (8 * i)
    })
}

fn halves(x: u32) -> [u16; 2] {
    [x as u16, (x >> 16) as u16]
}
fn pack(lo: u16, hi: u16) -> u32 {
    u32::from(lo) | u32::from(hi) << 16
}

// ---- f16 ------------------------------------------------------------------------------------------

fn hmul2(a: u32, b: u32) -> u32 {
    let [a0, a1] = halves(a).map(|h| f16::from_bits(h).to_f64());
    let [b0, b1] = halves(b).map(|h| f16::from_bits(h).to_f64());
    // The product of two f16 values is exact in f64: one rounding, as the hardware's.
    pack(f16::from_f64(a0 * b0).to_bits(), f16::from_f64(a1 * b1).to_bits())
}

/// `cvt.rn.f16x2.e4m3x2`: exact (SPEC §1 E4M3 values are f16 values).
fn e4m3x2_f16x2(two_bytes: u32) -> u32 {
    let v = |b: u32| f16::from_f32(e4m3_to_f32(b as u8)).to_bits();
    pack(v(two_bytes & 0xFF), v(two_bytes >> 8 & 0xFF))
}

/// nvfp4.cuh `e2m1x8_spread`.
fn spread(w: u32) -> (u32, u32) {
    let (te, to) = (w << 1, w >> 3);
    let f = |t: u32| (t & 0x0E0E_0E0E).wrapping_add((t & 0x1010_1010).wrapping_mul(8));
    (f(te), f(to))
}

/// nvfp4.cuh `scale_f16x2_x128` (one byte) and gemv16.cu's two-block form.
fn scale_x128(byte: u32) -> u32 {
    hmul2(e4m3x2_f16x2(byte * 0x0101), 0x5800_5800)
}

/// nvfp4.cuh `w4a16_f16x8`.
fn w4a16_f16x8(w: u32, s2: u32) -> [u32; 4] {
    let (even, odd) = spread(w);
    [
        hmul2(prmt(even, 0, 0x2404), s2),
        hmul2(prmt(odd, 0, 0x2404), s2),
        hmul2(prmt(even, 0, 0x3414), s2),
        hmul2(prmt(odd, 0, 0x3414), s2),
    ]
}

// ---- bf16 -----------------------------------------------------------------------------------------

/// `mul.rn.bf16x2`: the product of two bf16 values is exact in f64; one rounding, subnormal
/// inputs kept.
fn hmul2_bf16(a: u32, b: u32) -> u32 {
    let f = |x: u32| halves(x).map(|h| bf16::from_bits(h).to_f64());
    let ([a0, a1], [b0, b1]) = (f(a), f(b));
    pack(bf16::from_f64(a0 * b0).to_bits(), bf16::from_f64(a1 * b1).to_bits())
}

/// nvfp4.cuh `e4m3x2_to_bf16x2` and `w4a16_bf16_scale`.
fn bf16_scale(two_bytes: u32, block: u32) -> u32 {
    let v = |b: u32| bf16::from_f32(e4m3_to_f32(b as u8)).to_bits();
    let s01 = pack(v(two_bytes & 0xFF), v(two_bytes >> 8 & 0xFF));
    hmul2_bf16(prmt(s01, s01, if block != 0 { 0x3232 } else { 0x1010 }), header_const("BF16X2_2POW119"))
}

/// nvfp4.cuh `w4a16_bf16x8`.
fn w4a16_bf16x8(w: u32, s2: u32) -> [u32; 4] {
    let (mag, sign) = (0x01C0_01C0, 0x8000_8000);
    [
        hmul2_bf16((w << 6) & mag | (w << 12) & sign, s2),
        hmul2_bf16((w << 2) & mag | (w << 8) & sign, s2),
        hmul2_bf16((w >> 2) & mag | (w << 4) & sign, s2),
        hmul2_bf16((w >> 6) & mag | w & sign, s2),
    ]
}

// ---- the order of pairs ----------------------------------------------------------------------------

/// The element of each half of the decoders' 4 pairs: (e0, e4), (e1, e5), (e2, e6), (e3, e7).
const PAIR_ORDER: [[usize; 2]; 4] = [[0, 4], [1, 5], [2, 6], [3, 7]];

/// gemv16.cu's `stage_x`: 8 activations (as 4 words of 2) to the decoders' pair order.
fn stage_word(x: [u16; 8]) -> [u32; 4] {
    let w: Vec<u32> = x.chunks(2).map(|p| pack(p[0], p[1])).collect();
    [prmt(w[0], w[2], 0x5410), prmt(w[0], w[2], 0x7632), prmt(w[1], w[3], 0x5410), prmt(w[1], w[3], 0x7632)]
}

/// Every word that puts `code` at nibble `pos` and other codes elsewhere, plus a spread of others.
fn words() -> Vec<u32> {
    let mut out = Vec::new();
    for pos in 0..8 {
        for code in 0..16u32 {
            for fill in [0u32, 0x8, 0x7, 0xF, 0x5, 0xA] {
                let rest = (0..8).fold(0u32, |w, i| w | fill << (4 * i));
                out.push(rest & !(0xF << (4 * pos)) | code << (4 * pos));
            }
        }
    }
    let mut x = 0x9E37_79B9u32;
    for _ in 0..4096 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        out.push(x);
    }
    out
}

fn element(w: u32, i: usize) -> f64 {
    f64::from(e2m1_to_f32((w >> (4 * i) & 0xF) as u8))
}

#[test]
fn the_tables_are_the_kernels() {
    assert!(GEMV16.contains("nvfp4::w4a16_f16x8(w, s2, out)"));
    assert!(GEMV16.contains("nvfp4::w4a16_bf16x8(w, s2, out)"));
    // `stage_x`'s four words, whatever the formatter's line breaks.
    let gemv16: String = GEMV16.split_whitespace().collect();
    assert!(gemv16.contains(
        "make_uint4(ptx::prmt(x.x,x.z,0x5410u),ptx::prmt(x.x,x.z,0x7632u),ptx::prmt(x.y,x.w,0x5410u),ptx::prmt(x.y,x.w,0x7632u))"
    ));
    for line in [
        "out[0] = ptx::hmul2(ptx::prmt(even, 0u, 0x2404u), s2);",
        "out[3] = ptx::hmul2(ptx::prmt(odd, 0u, 0x3414u), s2);",
        "constexpr u32 MAG = 0x01C001C0u, SIGN = 0x80008000u;",
        "out[0] = ptx::hmul2_bf16(ptx::lop3_and_or(w << 6, MAG, (w << 12) & SIGN), s2);",
        "out[3] = ptx::hmul2_bf16(ptx::lop3_and_or(w >> 6, MAG, w & SIGN), s2);",
        "const u32 te = w << 1;",
    ] {
        assert!(HEADER.contains(line), "nvfp4.cuh no longer has `{line}`: update this model");
    }
    assert!(HEADER.contains("constexpr double W4A16_F16_UNBIAS = 128.0;"));
    assert!(HEADER.contains("constexpr double W4A16_BF16_UNBIAS = 128.0;"));
    assert_eq!(prmt(0x0403_0201, 0x0807_0605, 0x7654), 0x0807_0605);
    assert_eq!(prmt(0x0403_0201, 0x0807_0605, 0x0527), 0x0106_0308);
    assert_eq!(prmt(0x0000_0080, 0, 0x4448), 0x0000_00FF); // sign replication, then zeros
}

/// f16: every decoded element is exactly e2m1 * e4m3 * 2^-7, for every scale byte (NaN codes NaN).
#[test]
fn f16_decode_is_exact_for_every_code_position_and_scale() {
    let words = words();
    for byte in 0..=255u32 {
        let s2 = scale_x128(byte);
        let scale = f64::from(e4m3_to_f32(byte as u8));
        for &w in &words {
            let out = w4a16_f16x8(w, s2);
            for (pair, elems) in out.iter().zip(PAIR_ORDER) {
                for (h, e) in halves(*pair).into_iter().zip(elems) {
                    let got = f16::from_bits(h).to_f64();
                    let want = element(w, e) * scale / 128.0;
                    if scale.is_nan() {
                        assert!(got.is_nan(), "w {w:08x} scale {byte:02x} element {e}: {got}");
                    } else {
                        assert_eq!(got, want, "w {w:08x} scale {byte:02x} element {e}");
                    }
                }
            }
        }
    }
}

/// bf16: every decoded element is exactly e2m1 * e4m3 * 2^-7, in both blocks of a two-byte scale.
#[test]
fn bf16_decode_is_exact_for_every_code_position_and_scale() {
    let words = words();
    for byte in 0..=255u32 {
        for (block, two_bytes) in [(0, byte | 0x3800), (1, 0x38 | byte << 8)] {
            let s2 = bf16_scale(two_bytes, block);
            let scale = f64::from(e4m3_to_f32(byte as u8));
            for &w in &words {
                let out = w4a16_bf16x8(w, s2);
                for (pair, elems) in out.iter().zip(PAIR_ORDER) {
                    for (h, e) in halves(*pair).into_iter().zip(elems) {
                        let got = bf16::from_bits(h).to_f64();
                        if scale.is_nan() {
                            assert!(got.is_nan(), "w {w:08x} scale {byte:02x} element {e}: {got}");
                        } else {
                            assert_eq!(got, element(w, e) * scale / 128.0, "w {w:08x} scale {byte:02x} element {e}");
                        }
                    }
                }
            }
        }
    }
}

/// The staged activations meet the decoded weights element for element: the sum of pair products
/// over one word (what the MMA adds for a thread's k slots) is the word's dot product.
#[test]
fn staged_activations_pair_with_decoded_weights() {
    let xs: [u16; 8] = [1.0f32, -2.0, 0.5, 3.0, -0.25, 8.0, 1.5, -4.0].map(|v| f16::from_f32(v).to_bits());
    let xb: [u16; 8] = [1.0f32, -2.0, 0.5, 3.0, -0.25, 8.0, 1.5, -4.0].map(|v| bf16::from_f32(v).to_bits());
    let (sf, sb) = (stage_word(xs), stage_word(xb));
    let s2 = scale_x128(0x38); // scale 1.0
    let b2 = bf16_scale(0x3838, 0);
    for w in words() {
        let want: f64 = (0..8).map(|i| element(w, i) * f64::from(f16::from_bits(xs[i]).to_f32())).sum();
        let dot = |a: [u32; 4], b: [u32; 4], f: fn(u16) -> f64| -> f64 {
            a.iter().zip(b).map(|(a, b)| (0..2).map(|h| f(halves(*a)[h]) * f(halves(b)[h])).sum::<f64>()).sum()
        };
        let got_f16 = dot(w4a16_f16x8(w, s2), sf, |h| f16::from_bits(h).to_f64()) * 128.0;
        let got_bf16 = dot(w4a16_bf16x8(w, b2), sb, |h| bf16::from_bits(h).to_f64()) * 128.0;
        assert_eq!((got_f16, got_bf16), (want, want), "w {w:08x}");
    }
}
