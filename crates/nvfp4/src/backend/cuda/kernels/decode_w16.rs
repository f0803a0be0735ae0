//! A host model of the W4A16 weight decode (kernels/sm90/decode_w16.cuh), instruction for
//! instruction, checked exhaustively against the E2M1 and E4M3 tables: every byte at every
//! position of a gathered word, with every scale byte, in both activation types; and the gather
//! itself against the natural k order of the wgmma A fragment.

use half::{bf16, f16};

use crate::format::{e2m1_to_f32, e4m3_is_nan, e4m3_to_f32};

/// `prmt.b32 d, a, b, sel` (default mode): byte i of d is byte `sel[i] & 7` of {b, a} (a = bytes
/// 0..3), or, when `sel[i] & 8`, that byte's top bit replicated.
fn prmt(a: u32, b: u32, sel: u32) -> u32 {
    let bytes = (u64::from(b) << 32 | u64::from(a)).to_le_bytes();
    (0..4).fold(0, |d, i| {
        let s = (sel >> (4 * i)) & 0xF;
        let byte = bytes[(s & 7) as usize];
        let byte = if s & 8 != 0 {
            if byte & 0x80 != 0 {
                0xFF
            } else {
                0
            }
        } else {
            byte
        };
        d | u32::from(byte) << (8 * i)
    })
}

fn quad_sel(t: u32) -> u32 {
    t | (t + 4) << 4
}

fn quad_bytes(v: [u32; 4], sel: u32) -> u32 {
    prmt(prmt(v[0], v[1], sel), prmt(v[2], v[3], sel), 0x5410)
}

/// `lop3.b32` with the truth table `lut` over a = 0xF0, b = 0xCC, c = 0xAA.
fn lop3(a: u32, b: u32, c: u32, lut: u8) -> u32 {
    (0..32).fold(0, |d, i| {
        let idx = ((a >> i) & 1) << 2 | ((b >> i) & 1) << 1 | ((c >> i) & 1);
        d | u32::from((lut >> idx) & 1) << i
    })
}

fn f16_pair(g: u32, b: usize) -> u32 {
    const SELECT: u8 = 0xE4;
    let e = lop3(g << 1, g << 4, 0x0E0E_0E0E, SELECT);
    let o = lop3(g >> 3, g, 0x0E0E_0E0E, SELECT);
    let (lo, hi, od) = (e & 0x0000_8E8E, e & 0x8E8E_0000, o & 0x8E8E_8E8E);
    const SEL: [u32; 4] = [0x4202, 0x5212, 0x6020, 0x7030];
    prmt(if b < 2 { lo } else { hi }, od, SEL[b])
}

fn bf16_pair(g: u32, b: usize) -> u32 {
    let (lo, hi) = (g & 0x0F0F_0F0F, (g >> 4) & 0x0F0F_0F0F);
    const SEL: [u32; 4] = [0xC480, 0xD591, 0xE6A2, 0xF7B3];
    prmt(lo, hi, SEL[b]).wrapping_mul(0x1040) & 0x81C0_81C0
}

/// `cvt.rn.f16x2.e4m3x2` of the two scale bytes of `two` (exact; NaN codes give NaN).
fn cvt_e4m3x2(two: u32) -> u32 {
    let h = |b: u32| u32::from(f16::from_f32(e4m3_to_f32(b as u8)).to_bits());
    h(two & 0xFF) | h((two >> 8) & 0xFF) << 16
}

/// `w16::scale_pair`: the scales of blocks 2i, 2i + 1 of the word, as f16, or (bf16) each f16
/// converted to bf16 (`cvt.rn.bf16.f16`) and multiplied by 2^112 in bf16, which must be exact.
fn scale_pair(word: u32, i: usize, bf: bool) -> u32 {
    let h2 = cvt_e4m3x2(if i == 1 { word >> 16 } else { word & 0xFFFF });
    if !bf {
        return h2;
    }
    let to_bf = |h: u32| bf16::from_f32(f16::from_bits(h as u16).to_f32());
    let pair = u32::from(to_bf(h2 & 0xFFFF).to_bits()) | u32::from(to_bf(h2 >> 16).to_bits()) << 16;
    let p = mul_exact(pair, 0x7780_7780, true);
    assert_eq!(bf16::from_bits(0x7780).to_f64(), 2f64.powi(112));
    let lane = |v: f64| u32::from(bf16::from_f64(v).to_bits());
    lane(p[0]) | lane(p[1]) << 16
}

/// `ptx::hmul2_by_half`'s multiplier: half h of a pair in both lanes.
fn half_of(pair: u32, h: usize) -> u32 {
    let x = if h == 1 { pair >> 16 } else { pair & 0xFFFF };
    x | x << 16
}

/// The lanes of a 16-bit pair as f64 (low, high).
fn lanes(x: u32, bf: bool) -> [f64; 2] {
    let v = |h: u32| {
        if bf {
            bf16::from_bits(h as u16).to_f64()
        } else {
            f16::from_bits(h as u16).to_f64()
        }
    };
    [v(x & 0xFFFF), v(x >> 16)]
}

/// `mul.rn.{f16,bf16}x2`, modelled as the exact product, which must be representable (the
/// decode relies on it): then rounding does nothing.
fn mul_exact(a: u32, b: u32, bf: bool) -> [f64; 2] {
    let (x, y) = (lanes(a, bf), lanes(b, bf));
    let p = [x[0] * y[0], x[1] * y[1]];
    for v in p {
        let back = if bf { bf16::from_f64(v).to_f64() } else { f16::from_f64(v).to_f64() };
        assert!(v.is_nan() || back == v, "product {v} is not exact in {}", if bf { "bf16" } else { "f16" });
    }
    p
}

const BIAS: f64 = 1.0 / 16384.0;

#[test]
fn every_byte_and_scale_decodes_exactly() {
    for bf in [false, true] {
        for pos in 0..4 {
            for byte in 0..=255u32 {
                // The other bytes are set so that no mask can borrow from them.
                let g = !(0xFFu32 << (8 * pos)) | byte << (8 * pos);
                let d = if bf { bf16_pair(g, pos) } else { f16_pair(g, pos) };
                let (lo, hi) = ((byte & 0xF) as u8, (byte >> 4) as u8);
                let unit = if bf { 2f64.powi(-126) } else { BIAS };
                let got = lanes(d, bf);
                assert_eq!(got, [f64::from(e2m1_to_f32(lo)) * unit, f64::from(e2m1_to_f32(hi)) * unit], "{bf} {g:08x}");
                // The sign of -0 survives: nibble bit 3 is lane bit 15.
                assert_eq!([d & 0x8000 != 0, d & 0x8000_0000 != 0], [lo & 8 != 0, hi & 8 != 0], "{bf} {g:08x}");
                for s in 0..=255u32 {
                    for j in 0..4 {
                        // Scale byte j of a sub-stage's word, the others NaN.
                        let word = (0x7F7F_7F7Fu32 & !(0xFF << (8 * j))) | s << (8 * j);
                        let sc = half_of(scale_pair(word, j / 2, bf), j % 2);
                        let f = mul_exact(d, sc, bf);
                        for (v, code) in f.into_iter().zip([lo, hi]) {
                            if e4m3_is_nan(s as u8) {
                                assert!(v.is_nan(), "{bf} {byte:02x} {s:02x}");
                            } else {
                                let want = f64::from(e2m1_to_f32(code)) * f64::from(e4m3_to_f32(s as u8)) * BIAS;
                                assert_eq!(v, want, "{bf} byte {byte:02x} scale {s:02x} step {j}");
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The thread with quad lane t, decoding step j of a sub-stage from the row's 32 bytes, holds
/// the A fragment's elements k = 16j + 2t, +1 (pair 0) and 16j + 8 + 2t, +1 (pair 1).
#[test]
fn gathered_pairs_are_the_fragment_in_natural_order() {
    // 32 distinct bytes of a row's sub-stage, so that a wrong byte cannot pass unnoticed.
    let row: Vec<u8> = (0..32u32).map(|i| (i * 37 + 11) as u8).collect();
    let word = |w: usize| u32::from_le_bytes([row[4 * w], row[4 * w + 1], row[4 * w + 2], row[4 * w + 3]]);
    let nibble = |k: usize| (row[k / 2] >> (4 * (k % 2))) & 0xF;
    for bf in [false, true] {
        let unit = if bf { 2f64.powi(-126) } else { BIAS };
        for t in 0..4u32 {
            for chunk in 0..2 {
                let v = [word(4 * chunk), word(4 * chunk + 1), word(4 * chunk + 2), word(4 * chunk + 3)];
                let g = quad_bytes(v, quad_sel(t));
                for step in [2 * chunk, 2 * chunk + 1] {
                    for pair in 0..2 {
                        let b = 2 * (step % 2) + pair;
                        let d = if bf { bf16_pair(g, b) } else { f16_pair(g, b) };
                        let k = 16 * step + 8 * pair + 2 * t as usize;
                        let want = [nibble(k), nibble(k + 1)].map(|c| f64::from(e2m1_to_f32(c)) * unit);
                        assert_eq!(lanes(d, bf), want, "{bf} t {t} step {step} pair {pair}");
                    }
                }
            }
        }
    }
}

#[test]
fn models_of_prmt_and_lop3() {
    assert_eq!(prmt(0x8070_6050, 0, 0xBBBB), 0xFFFF_FFFF);
    assert_eq!(prmt(0x0070_6050, 0, 0x9999), 0);
    assert_eq!(prmt(0x4433_2211, 0x8877_6655, 0x7531), 0x8866_4422);
    assert_eq!(lop3(0xF0F0, 0xFF00, 0x0FF0, 0xE4), 0xF000 | 0x00F0);
    assert_eq!(lop3(0x1234_5678, 0xFFFF_0000, 0x0F0F_0F0F, 0xA8), (0x1234_5678 | 0xFFFF_0000) & 0x0F0F_0F0F);
}
