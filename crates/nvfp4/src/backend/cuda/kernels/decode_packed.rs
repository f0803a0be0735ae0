//! A host model of the packed W4A16 decode (kernels/sm90/decode_packed.cuh and the addressing of
//! sm90/mainloop_packed.cuh), instruction for instruction, run over whole packed weights
//! (format/w16_pack.rs) and checked against the elements' own values: every E2M1 code, every
//! E4M3 scale code (zero, negative, subnormal, NaN), rows and K off the packed form's groups and
//! stages, both activation types.

use half::f16;

use crate::format::w16_pack::{PACK_CHUNK, PACK_K, PACK_ROWS, PACK_SCALES, PACK_VALUES};
use crate::format::{e2m1_to_f32, e4m3_is_nan, e4m3_to_f32, nibble, pack_w16, Nvfp4Tensor, PackAct, ScaleLayout};
use crate::problem::Rng;

fn rotl(x: u32, r: u32) -> u32 {
    x.rotate_left(r)
}

/// `scale_pair<BF16, J>` (its `exp_bits` 0x70007000).
fn scale_pair(act: PackAct, w: [u32; 2], j: usize) -> u32 {
    let x = w[j / 2];
    match act {
        PackAct::Bf16 => ((if j.is_multiple_of(2) { x << 4 } else { x >> 4 }) & 0x0FF0_0FF0) | 0x7000_7000,
        PackAct::F16 => (if j.is_multiple_of(2) { x << 7 } else { x >> 1 }) & 0x7F80_7F80,
    }
}

/// The value of a 16-bit lane of the activation's type.
fn lane_value(act: PackAct, h: u32) -> f32 {
    match act {
        PackAct::Bf16 => f32::from_bits(h << 16),
        PackAct::F16 => f16::from_bits(h as u16).to_f32(),
    }
}

/// `hmul2_by_half<H>` lane by lane, the product rounded to the type (checked exact: it is).
fn hmul_lanes(act: PackAct, a: u32, s: u32, h: u32) -> [f32; 2] {
    let sv = lane_value(act, (s >> (16 * h)) & 0xFFFF);
    [lane_value(act, a & 0xFFFF) * sv, lane_value(act, a >> 16) * sv]
}

/// `frags<BF16>`: the 4 registers' lane values.
fn frags(act: PackAct, q: u32, s: u32) -> [[f32; 2]; 4] {
    let (sign, mag) = (0x8000_8000u32, if act == PackAct::Bf16 { 0x01C0_01C0u32 } else { 0x0E00_0E00 });
    let m = sign | mag;
    let a = match act {
        PackAct::Bf16 => {
            let low = 0x0040_0040;
            [q & m, rotl(q, 4) & m, rotl(q, 10) & m, (rotl(q, 6) & low) | (rotl(q, 14) & (m & !low))]
        }
        PackAct::F16 => {
            [q & m, rotl(q, 3) & m, (rotl(q, 1) & sign) | (rotl(q, 6) & mag), (rotl(q, 2) & sign) | (rotl(q, 9) & mag)]
        }
    };
    [hmul_lanes(act, a[0], s, 0), hmul_lanes(act, a[1], s, 1), hmul_lanes(act, a[2], s, 0), hmul_lanes(act, a[3], s, 1)]
}

/// The value the decode must give element (row, k): e2m1 * e4m3 * 2^-14, 0 past the tensor.
fn want(t: &Nvfp4Tensor, b: usize, row: usize, k: usize) -> f32 {
    if row >= t.rows() || k >= t.k() {
        return 0.0;
    }
    let s = t.scale(b, row, k / 16);
    if e4m3_is_nan(s) {
        return f32::NAN;
    }
    e2m1_to_f32(nibble(t.row_values(b, row), k)) * e4m3_to_f32(s) * 2f32.powi(-14)
}

fn le_word(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

/// Every element of `t`'s packed form, decoded as the kernel's threads do, equals its value.
fn check(t: &Nvfp4Tensor, act: PackAct) {
    let packed = pack_w16(t, act).unwrap();
    let (groups, stages) = (t.rows().div_ceil(PACK_ROWS), t.k().div_ceil(PACK_K));
    assert_eq!(packed.len(), t.l() * groups * stages * PACK_CHUNK);
    for (idx, chunk) in packed.chunks_exact(PACK_CHUNK).enumerate() {
        let (b, grp, st) = (idx / (groups * stages), (idx / stages) % groups, idx % stages);
        // mainloop_packed's offsets: warp = the 16-row block, sub-stage, lane.
        for warp in 0..4 {
            for sub in 0..4 {
                for lane in 0..32 {
                    let w_at = warp * (PACK_VALUES / 4) + lane * 16 + sub * (PACK_VALUES / 16);
                    let s_at = PACK_VALUES + warp * (PACK_SCALES / 4) + (lane / 4) * 8 + sub * (PACK_SCALES / 16);
                    let sw = [le_word(chunk, s_at), le_word(chunk, s_at + 4)];
                    let (g, tq) = (lane / 4, lane % 4);
                    let row = grp * PACK_ROWS + 16 * warp + g;
                    for j in 0..4 {
                        let f = frags(act, le_word(chunk, w_at + 4 * j), scale_pair(act, sw, j));
                        let k0 = st * PACK_K + sub * 64 + 16 * j + 2 * tq;
                        let places = [(row, k0), (row + 8, k0), (row, k0 + 8), (row + 8, k0 + 8)];
                        for (reg, &(r, k)) in places.iter().enumerate() {
                            for (half, &got) in f[reg].iter().enumerate() {
                                let w = want(t, b, r, k + half);
                                let same = got == w || (got.is_nan() && w.is_nan());
                                assert!(same, "{act:?} batch {b} row {r} k {}: got {got}, want {w}", k + half);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A weight of random codes and every scale code (NaN, zero, negative, subnormal included: codes
/// i * 37 + [0, 7) over at least 256 consecutive i cover all 256).
fn weight(rng: &mut Rng, l: usize, rows: usize, k: usize, layout: ScaleLayout) -> Nvfp4Tensor {
    let values = (0..l * rows * k / 2).map(|_| rng.below(256) as u8).collect();
    let scales = (0..l * rows * k / 16).map(|i| (i * 37 + rng.below(7) as usize) as u8).collect();
    Nvfp4Tensor::new(l, rows, k, values, scales, ScaleLayout::Plain).unwrap().to_layout(layout)
}

#[test]
fn the_packed_decode_gives_every_element() {
    let mut rng = Rng::new(5);
    for (l, rows, k) in [(1, 64, 256), (2, 100, 96), (1, 130, 544)] {
        for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
            let t = weight(&mut rng, l, rows, k, layout);
            for act in [PackAct::Bf16, PackAct::F16] {
                check(&t, act);
            }
        }
    }
}
