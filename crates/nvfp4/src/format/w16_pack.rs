//! The packed weight form of the W4A16 skeleton (kernels/sm90/decode_packed.cuh): an NVFP4
//! weight `[L, rows, K]` rearranged once, at load, so that a consumer thread's shared-memory word
//! is its wgmma A fragment and one or two rotates and masks give each fragment register
//! ([`FRAG_ROT`]). The layout belongs to this version of the library: an in-memory form to build
//! at load, not to store.
//!
//! Layout: chunks of [`PACK_CHUNK`] bytes, `[L][G][S]` with G = ceil(rows / 64) row groups and
//! S = ceil(K / 256) K stages (the skeleton's raw stage); rows and K past the tensor's are zero
//! codes. A chunk is [`PACK_VALUES`] bytes of fragment words, `[4 blocks of 16 rows][4 sub-stages
//! of 64 K][32 lanes][4 k16 steps]` u32, then [`PACK_SCALES`] bytes of scale words, `[4 blocks][4
//! sub-stages][8 row pairs][2]` u32. Lane `l` of block `b` holds rows 16b + l/4 (`g`) and
//! 16b + l/4 + 8, at k = 16 step + 2 (l % 4) + {0, 1, 8, 9}: the 8 codes of one A fragment, in the
//! bit positions [`fragment_bit`] gives. Scale word i of a row pair holds the encoded scales of
//! steps 2i, 2i + 1 for row g, then for row g + 8 ([`scale_code`]).
//!
//! Exactness is the codes' and scales' own: a zero scale zeroes its block's codes, a negative
//! one flips their signs (both exact: e2m1 is sign-magnitude), so the scale bytes need no sign
//! and no zero; a NaN scale keeps a NaN code.

use half::f16;

use super::{e4m3_is_nan, e4m3_to_f32, nibble, Nvfp4Tensor};
use crate::{Error, Result};

/// Rows of a row group (one wgmma m64 tile).
pub const PACK_ROWS: usize = 64;
/// K elements of a stage (the skeleton's raw stage).
pub const PACK_K: usize = 256;
/// Fragment-word bytes of a chunk: 64 rows x 256 K x 4 bits.
pub const PACK_VALUES: usize = PACK_ROWS * PACK_K / 2;
/// Scale-word bytes of a chunk: 64 rows x 16 blocks.
pub const PACK_SCALES: usize = PACK_ROWS * PACK_K / 16;
/// Bytes of a chunk.
pub const PACK_CHUNK: usize = PACK_VALUES + PACK_SCALES;
/// The scale code of a NaN scale (the f16 NaN 0x7E00 >> 7).
pub const NAN_SCALE_CODE: u8 = 0xFC;

/// The activation type a packed weight is decoded to: the bit positions differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PackAct {
    /// bf16: magnitudes at bits 8..6 of each half (value e2m1 * 2^-126).
    Bf16,
    /// f16: magnitudes at bits 11..9 (value e2m1 * 2^-14).
    F16,
}

impl PackAct {
    /// The lowest bit of a half's 3-bit magnitude.
    fn magnitude_bit(self) -> u32 {
        match self {
            PackAct::Bf16 => 6,
            PackAct::F16 => 9,
        }
    }
    /// Its index in [`FRAG_ROT`].
    pub fn index(self) -> usize {
        match self {
            PackAct::Bf16 => 0,
            PackAct::F16 => 1,
        }
    }
}

/// `FRAG_ROT[act][reg][b]`: the left rotation of the packed word that brings bit `b` of the
/// codes of fragment register `reg` (b = 3: the sign, 2..0: e1, e0, m) to its place in the
/// register, whose bits are then masked out (kernels/sm90/decode_packed.cuh):
/// - bf16: a0 = q & M, a1 = rotl(q, 4) & M, a2 = rotl(q, 10) & M, a3 = rotl(q, 6) & (the m bits)
///   | rotl(q, 14) & (the others): 4 rotates and 5 masks per word (the fewest of any layout with
///   three one-mask registers; found by exhaustive search);
/// - f16 (magnitudes at bits 11..9, where no layout of that shape exists): a1 = rotl(q, 3) & M,
///   a2 = rotl(q, 1) & S | rotl(q, 6) & G, a3 = rotl(q, 2) & S | rotl(q, 9) & G: 5 and 6.
///
/// The kernels' generated header carries this table (`sm90::PACK_ROT`) to the device packer.
pub const FRAG_ROT: [[[u32; 4]; 4]; 2] = [
    [[0, 0, 0, 0], [4, 4, 4, 4], [10, 10, 10, 10], [6, 14, 14, 14]],
    [[0, 0, 0, 0], [3, 3, 3, 3], [6, 6, 6, 1], [9, 9, 9, 2]],
];

/// The bit of the packed word that register `reg` (0..4) reads at bit `bit` of its half `half`
/// (0: even k, 1: odd k), for the code's bit `code_bit` (3: sign, 2..0: e1, e0, m): the
/// register's bit p is the word's bit (p - r) mod 32 for the rotation r of [`FRAG_ROT`].
pub fn fragment_bit(act: PackAct, reg: usize, half: usize, code_bit: u32) -> u32 {
    let p = if code_bit == 3 { 15 } else { act.magnitude_bit() + code_bit };
    let r = FRAG_ROT[act.index()][reg][code_bit as usize];
    (p + 16 * half as u32 + 32 - r) % 32
}

/// The packed word of 8 codes, `codes[reg][half]`.
pub fn fragment_word(act: PackAct, codes: [[u8; 2]; 4]) -> u32 {
    let mut q = 0u32;
    for (reg, pair) in codes.iter().enumerate() {
        for (half, &c) in pair.iter().enumerate() {
            for b in 0..4 {
                q |= u32::from((c >> b) & 1) << fragment_bit(act, reg, half, b);
            }
        }
    }
    q
}

/// The scale byte of an E4M3 scale: the f16 of its magnitude shifted right by 7 (every E4M3
/// magnitude is an f16 with 3 mantissa bits and an exponent that keeps bit 15 clear), NaN
/// [`NAN_SCALE_CODE`]. The sign and zero are the codes' business (see the module).
pub fn scale_code(e4m3: u8) -> u8 {
    if e4m3_is_nan(e4m3) {
        return NAN_SCALE_CODE;
    }
    (f16::from_f32(e4m3_to_f32(e4m3).abs()).to_bits() >> 7) as u8
}

/// The code of weight element (row, k) with its block scale folded in: zero for a zero scale,
/// sign flipped for a negative one; 0 past the tensor.
fn folded_code(t: &Nvfp4Tensor, b: usize, row: usize, k: usize) -> u8 {
    if row >= t.rows() || k >= t.k() {
        return 0;
    }
    let s = t.scale(b, row, k / 16);
    let c = nibble(t.row_values(b, row), k);
    if !e4m3_is_nan(s) && e4m3_to_f32(s) == 0.0 {
        0
    } else if s & 0x80 != 0 && !e4m3_is_nan(s) {
        c ^ 8
    } else {
        c
    }
}

/// The scale byte of (row, block j); past the tensor a zero scale (its codes are zero).
fn folded_scale(t: &Nvfp4Tensor, b: usize, row: usize, j: usize) -> u8 {
    if row >= t.rows() || j >= t.sf_cols() {
        return 0;
    }
    scale_code(t.scale(b, row, j))
}

/// The packed rows of one or two operands: one operand's rows as they are, or a dual GEMM's two
/// interleaved by 8 (row 16 i + r of the pair is B1's row 8 i + r for r < 8, else B2's row
/// 8 i + r - 8: a fragment's rows g and g + 8 are the same output column of the two products,
/// the skeleton's dual row mapping).
#[derive(Clone, Copy)]
enum Rows<'a> {
    One(&'a Nvfp4Tensor),
    Pair(&'a Nvfp4Tensor, &'a Nvfp4Tensor),
}

impl<'a> Rows<'a> {
    /// Packed rows: the operand's, or 16 per 8 output rows of the pair.
    fn count(self) -> usize {
        match self {
            Rows::One(t) => t.rows(),
            Rows::Pair(t, _) => dual_packed_rows(t.rows()),
        }
    }
    /// The tensor and row of packed row `r`.
    fn source(self, r: usize) -> (&'a Nvfp4Tensor, usize) {
        match self {
            Rows::One(t) => (t, r),
            Rows::Pair(b1, b2) => (if r % 16 < 8 { b1 } else { b2 }, (r / 16) * 8 + r % 8),
        }
    }
    fn code(self, b: usize, r: usize, k: usize) -> u8 {
        let (t, row) = self.source(r);
        folded_code(t, b, row, k)
    }
    fn scale(self, b: usize, r: usize, j: usize) -> u8 {
        let (t, row) = self.source(r);
        folded_scale(t, b, row, j)
    }
}

/// Bytes of the packed form of `rows` packed rows of `[l, *, k]` weights, `None` on overflow.
pub fn packed_len(l: usize, rows: usize, k: usize) -> Option<usize> {
    l.checked_mul(rows.div_ceil(PACK_ROWS))?.checked_mul(k.div_ceil(PACK_K))?.checked_mul(PACK_CHUNK)
}

/// Packed rows of a dual GEMM's pair of `[*, n, *]` operands.
pub fn dual_packed_rows(n: usize) -> usize {
    16 * n.div_ceil(8)
}

/// The packed form of `t` (either scale layout) for activations of type `act`.
pub fn pack_w16(t: &Nvfp4Tensor, act: PackAct) -> Result<Vec<u8>> {
    pack(Rows::One(t), t, act)
}

/// The packed form of a dual GEMM's operands B1 and B2 (the same shape, either layouts), their
/// rows interleaved by 8 ([`dual_packed_rows`] packed rows).
pub fn pack_w16_dual(b1: &Nvfp4Tensor, b2: &Nvfp4Tensor, act: PackAct) -> Result<Vec<u8>> {
    if (b1.l(), b1.rows(), b1.k()) != (b2.l(), b2.rows(), b2.k()) {
        return Err(Error::Shape("a dual GEMM's packed operands must have one shape".into()));
    }
    pack(Rows::Pair(b1, b2), b1, act)
}

fn pack(src: Rows<'_>, t: &Nvfp4Tensor, act: PackAct) -> Result<Vec<u8>> {
    let (l, rows, k) = (t.l(), src.count(), t.k());
    let len = packed_len(l, rows, k).ok_or_else(|| Error::Invalid("packed weight size overflows".into()))?;
    let (groups, stages) = (rows.div_ceil(PACK_ROWS), k.div_ceil(PACK_K));
    let mut out = vec![0u8; len];
    for (idx, chunk) in out.chunks_exact_mut(PACK_CHUNK).enumerate() {
        let (b, grp, st) = (idx / (groups * stages), (idx / stages) % groups, idx % stages);
        let (values, scales) = chunk.split_at_mut(PACK_VALUES);
        for blk in 0..4 {
            let row0 = grp * PACK_ROWS + 16 * blk;
            // Packed rows past the count read as zero codes and scales.
            let code = |r: usize, k: usize| if r < rows { src.code(b, r, k) } else { 0 };
            let scale = |r: usize, j: usize| if r < rows { src.scale(b, r, j) } else { 0 };
            for sub in 0..4 {
                for lane in 0..32 {
                    let (g, tq) = (lane / 4, lane % 4);
                    for step in 0..4 {
                        let k0 = st * PACK_K + sub * 64 + step * 16 + 2 * tq;
                        let c = |r: usize, dk: usize| code(row0 + r, k0 + dk);
                        let codes = [
                            [c(g, 0), c(g, 1)],
                            [c(g + 8, 0), c(g + 8, 1)],
                            [c(g, 8), c(g, 9)],
                            [c(g + 8, 8), c(g + 8, 9)],
                        ];
                        let at = ((blk * 4 + sub) * 32 + lane) * 16 + step * 4;
                        values[at..at + 4].copy_from_slice(&fragment_word(act, codes).to_le_bytes());
                    }
                }
                for g in 0..8 {
                    for i in 0..2 {
                        let j0 = (st * PACK_K + sub * 64) / 16 + 2 * i;
                        let at = ((blk * 4 + sub) * 8 + g) * 8 + 4 * i;
                        scales[at] = scale(row0 + g, j0);
                        scales[at + 1] = scale(row0 + g, j0 + 1);
                        scales[at + 2] = scale(row0 + g + 8, j0);
                        scales[at + 3] = scale(row0 + g + 8, j0 + 1);
                    }
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_bit_is_read_once() {
        for act in [PackAct::Bf16, PackAct::F16] {
            let mut seen = 0u64;
            for reg in 0..4 {
                for half in 0..2 {
                    for b in 0..4 {
                        let bit = fragment_bit(act, reg, half, b);
                        assert_eq!(seen >> bit & 1, 0, "{act:?}: bit {bit} read twice");
                        seen |= 1 << bit;
                    }
                }
            }
            assert_eq!(seen, 0xFFFF_FFFF, "{act:?}");
        }
    }

    #[test]
    fn scale_codes_of_every_e4m3() {
        for s in 0..=255u8 {
            let c = scale_code(s);
            if e4m3_is_nan(s) {
                assert_eq!(c, NAN_SCALE_CODE);
                assert!(f16::from_bits(u16::from(c) << 7).is_nan());
                continue;
            }
            // The f16 the kernel rebuilds is the magnitude, exactly.
            let back = f16::from_bits(u16::from(c) << 7).to_f32();
            assert_eq!(back, e4m3_to_f32(s).abs(), "e4m3 {s:#04x}");
        }
    }
}
