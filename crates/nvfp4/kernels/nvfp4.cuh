// nvfp4.cuh: NVFP4 decoding shared by every kernel: E2M1 nibbles to int8 and f16, E4M3 scales,
// and the scale-layout address rule (SPEC §2).
//
// Packing (SPEC §1): byte t of a row holds element 2t in its low nibble and 2t+1 in its high
// nibble, so a little-endian 32-bit word holds 8 consecutive elements, element i in nibble i.
#pragma once

#include "ptx.cuh"

namespace nvfp4 {

// ---- E2M1 as int8 (for dp4a) -------------------------------------------------------------------
//
// Twice an E2M1 value is an integer: codes 0..7 -> 0 1 2 3 4 6 8 12. Two prmt tables hold the
// eight magnitudes and their negatives; a byte permute with the 3 magnitude bits as selector
// decodes four elements in one instruction.
constexpr u32 MAG_LO = 0x03020100u;  // 2|x| for codes 0..3
constexpr u32 MAG_HI = 0x0C080604u;  // 2|x| for codes 4..7
constexpr u32 NEG_LO = 0xFDFEFF00u;  // -2|x| for codes 0..3
constexpr u32 NEG_HI = 0xF4F8FAFCu;  // -2|x| for codes 4..7

// dp4a sums of int8 products start from this float's bit pattern: 1.5 * 2^23 + n reads back as
// an f32 for any |n| < 2^22, so one FADD turns the integer sum into an exact float.
constexpr i32 MAGIC_BITS = 0x4B400000;
constexpr float MAGIC_F = 12582912.0f;

NVFP4_DEVICE float magic_to_float(i32 acc) { return __int_as_float(acc) - MAGIC_F; }

// Selector that takes byte i of x when nibble i of w is non-negative, of y when negative:
// nibble i = i + 4 * sign_i. The low 16 bits serve nibbles 0..3, the high 16 bits nibbles 4..7.
// One lop3 with both constants in registers (the compiler would otherwise spend two).
NVFP4_DEVICE u32 sign_selector(u32 w) { return ptx::lop3_and_or(w >> 1, 0x44444444u, 0x32103210u); }

// A decoded B word: 8 elements as signed int8 (lo: elements 0..3, hi: 4..7) and their negatives.
struct BWord {
  u32 lo, hi, nlo, nhi;
};

// Decodes one packed word of B (8 elements) to 2x int8 values and their negatives.
NVFP4_DEVICE BWord decode_b_word(u32 w) {
  const u32 m = w & 0x77777777u;
  const u32 pos_lo = ptx::prmt(MAG_LO, MAG_HI, m), pos_hi = ptx::prmt(MAG_LO, MAG_HI, m >> 16);
  const u32 neg_lo = ptx::prmt(NEG_LO, NEG_HI, m), neg_hi = ptx::prmt(NEG_LO, NEG_HI, m >> 16);
  const u32 s = sign_selector(w);
  BWord r;
  r.lo = ptx::prmt(pos_lo, neg_lo, s);
  r.hi = ptx::prmt(pos_hi, neg_hi, s >> 16);
  r.nlo = ptx::prmt(neg_lo, pos_lo, s);
  r.nhi = ptx::prmt(neg_hi, pos_hi, s >> 16);
  return r;
}

// acc + 4 * sum_i a_i * b_i over the 8 elements of packed word `a`, with b given as decoded int8
// (b_lo/b_hi) and negated int8 (nb_lo/nb_hi). The magnitude of a comes from the prmt table; its
// sign picks b or -b byte by byte. 11 instructions for 8 elements, exact in int32.
NVFP4_DEVICE i32 dot8(u32 a, u32 b_lo, u32 b_hi, u32 nb_lo, u32 nb_hi, i32 acc) {
  const u32 m = a & 0x77777777u;
  const u32 mag_lo = ptx::prmt(MAG_LO, MAG_HI, m);
  const u32 mag_hi = ptx::prmt(MAG_LO, MAG_HI, m >> 16);
  const u32 s = sign_selector(a);
  const u32 sb_lo = ptx::prmt(b_lo, nb_lo, s);
  const u32 sb_hi = ptx::prmt(b_hi, nb_hi, s >> 16);
  acc = ptx::dp4a(mag_lo, sb_lo, acc);
  return ptx::dp4a(mag_hi, sb_hi, acc);
}

// ---- E4M3 scales -------------------------------------------------------------------------------

// One e4m3 byte to f32 (exact; NaN codes give NaN).
NVFP4_DEVICE float e4m3_to_f32(u32 byte) {
  float lo, hi;
  ptx::f16x2_to_f32(ptx::cvt_e4m3x2_f16x2(byte & 0xFFu), lo, hi);
  return lo;
}

// Two e4m3 bytes (low byte first) to two f32.
NVFP4_DEVICE void e4m3x2_to_f32(u32 two_bytes, float& s0, float& s1) {
  ptx::f16x2_to_f32(ptx::cvt_e4m3x2_f16x2(two_bytes), s0, s1);
}

// ---- E2M1 as f16 (for the tensor-core path) ----------------------------------------------------
//
// An E2M1 nibble s|e1 e0|m placed as the e4m3 byte s|0 0 e1 e0|m 0 0 reads as value * 2^-6 (the
// subnormal rule lines up with E2M1's), so the hardware e4m3 -> f16 conversion decodes two
// elements at once; the 2^6 goes into the scale.

// Two nibbles (bits 0..3 and 8..11 of x) to the e4m3 bytes described above.
NVFP4_DEVICE u32 nibbles_to_e4m3x2(u32 x) { return ((x & 0x0808u) << 4) | ((x & 0x0707u) << 2); }

// 8 elements of packed word w, times the f16x2 scale s2 (= scale * 64 in both halves), as 4 f16x2
// in element order. Exact: every product has at most 5 significant bits and fits f16.
NVFP4_DEVICE void decode_f16x8(u32 w, u32 s2, u32* out) {
  // Spread bytes so that each 16-bit half holds one element's nibble in its low byte.
  const u32 lo_nibbles = w & 0x0F0F0F0Fu;         // elements 0, 2, 4, 6 (one per byte)
  const u32 hi_nibbles = (w >> 4) & 0x0F0F0F0Fu;  // elements 1, 3, 5, 7
  // Selector nibble i picks result byte i: 0..3 = bytes of lo_nibbles, 4..7 = of hi_nibbles.
  const u32 p01 = ptx::prmt(lo_nibbles, hi_nibbles, 0x0040u);  // bytes: e0, e1
  const u32 p23 = ptx::prmt(lo_nibbles, hi_nibbles, 0x0051u);  // e2, e3
  const u32 p45 = ptx::prmt(lo_nibbles, hi_nibbles, 0x0062u);  // e4, e5
  const u32 p67 = ptx::prmt(lo_nibbles, hi_nibbles, 0x0073u);  // e6, e7
  out[0] = ptx::hmul2(ptx::cvt_e4m3x2_f16x2(nibbles_to_e4m3x2(p01)), s2);
  out[1] = ptx::hmul2(ptx::cvt_e4m3x2_f16x2(nibbles_to_e4m3x2(p23)), s2);
  out[2] = ptx::hmul2(ptx::cvt_e4m3x2_f16x2(nibbles_to_e4m3x2(p45)), s2);
  out[3] = ptx::hmul2(ptx::cvt_e4m3x2_f16x2(nibbles_to_e4m3x2(p67)), s2);
}

// ---- scale layouts (SPEC §2) -------------------------------------------------------------------

// Byte offset of the scale of row i, scale column j, batch b, for `rows` x `sf_cols` scales per
// batch, in the plain ([L, rows, K/16]) or blocked (128x4 tile) layout.
NVFP4_DEVICE i64 scale_offset(bool blocked, i32 rows, i32 sf_cols, i32 i, i32 j, i32 b) {
  if (!blocked) return ((i64)b * rows + i) * sf_cols + j;
  const i64 r = (rows + 127) / 128, c = (sf_cols + 3) / 4;
  return (i64)b * (r * c * 512) + (i64)(i / 128) * (c * 512) + (j / 4) * 512 + (i % 32) * 16 + ((i % 128) / 32) * 4 +
         (j % 4);
}

// The 8 packed bytes and the scale byte of 16-element block kb of row `row` of an [L, rows, K]
// operand (`vals` [L, rows, K/2], `sfs` plain or blocked), batch l; zeros for a row past `rows`
// or a block past K (K % 16 == 0: a block lies wholly inside or past K). Zero bytes with a zero
// scale decode to +0.
NVFP4_DEVICE void load_block(const u8* vals, const u8* sfs, bool blocked, i32 rows, i32 k, i32 l, i32 row, i32 kb,
                             uint2& w, u32& s) {
  const i32 sf_cols = k / 16;
  const bool in = row < rows && kb < sf_cols;
  w = in ? ptx::ld_nc_v2(vals + ((i64)l * rows + row) * (k / 2) + (i64)kb * 8) : make_uint2(0, 0);
  s = in ? ptx::ld_nc_u8(sfs + scale_offset(blocked, rows, sf_cols, row, kb, l)) : 0u;
}

}  // namespace nvfp4

// ================================================================================================
// E2M1 -> f16 for the wgmma GEMM (gemm_sm90.cu): ~2 instructions per element, no table.
// ================================================================================================
namespace nvfp4 {

// An E2M1 nibble s|e1 e0|m written as the f16 bit pattern s << 15 | (e1 e0 m) << 9 reads as
// value * 2^-14 for every code (e = 0 lands on the f16 subnormals exactly as E2M1's 0 and 0.5).
// The scale multiply then folds the 2^14 back in; see `scale_f16x2_x128`.
//
// Decodes the 8 elements of packed word w (element i in nibble i) to 4 f16x2 (value * 2^-14):
// r02 = (e0, e2), r46 = (e4, e6), r13 = (e1, e3), r57 = (e5, e7), low half first.
// Each byte of `even`/`odd` becomes one f16's high byte (sign at bit 7, magnitude at bits 1..3);
// a byte permute then drops two of them into the high bytes of an f16x2 with zero low bytes.
// The two halves of that decode, for callers that spread it over time: `e2m1x8_spread` turns w
// into the byte forms (even: elements 0, 2, 4, 6; odd: 1, 3, 5, 7), `f16x2_of_spread` takes
// pair i (0: bytes 0, 1; 1: bytes 2, 3) of one as an f16x2.
NVFP4_DEVICE void e2m1x8_spread(u32 w, u32& even, u32& odd) {
  const u32 te = w << 1;  // even nibble of each byte: magnitude at bits 1..3, sign at bit 4
  const u32 to = w >> 3;  // odd nibble of each byte: the same positions
  even = (te & 0x0E0E0E0Eu) + (te & 0x10101010u) * 8u;  // sign 4 -> 7
  odd = (to & 0x0E0E0E0Eu) + (to & 0x10101010u) * 8u;
}
NVFP4_DEVICE u32 f16x2_of_spread(u32 spread, int i) { return ptx::prmt(spread, 0u, i ? 0x3424u : 0x1404u); }

NVFP4_DEVICE void e2m1x8_to_f16x8_biased(u32 w, u32& r02, u32& r46, u32& r13, u32& r57) {
  u32 even, odd;
  e2m1x8_spread(w, even, odd);
  r02 = f16x2_of_spread(even, 0);
  r46 = f16x2_of_spread(even, 1);
  r13 = f16x2_of_spread(odd, 0);
  r57 = f16x2_of_spread(odd, 1);
}

// One e4m3 scale byte as f16x2 (scale * 2^7, scale * 2^7). With the 2^-14 of the biased decode
// every decoded element is e2m1 * e4m3 * 2^-7: exact in f16 (at most 5 significant bits, and
// 2^-17 <= |x| <= 21 for nonzero x), and scale * 2^7 <= 448 * 128 fits f16. NaN codes stay NaN.
NVFP4_DEVICE u32 scale_f16x2_x128(u32 byte) {
  return ptx::hmul2(ptx::cvt_e4m3x2_f16x2(byte * 0x0101u), 0x58005800u);  // 0x5800 = 128.0
}

}  // namespace nvfp4

// ================================================================================================
// W4A16 (gemv16.cu): NVFP4 weights decoded into the activation's 16-bit type, each element times
// its block scale, exactly: an e2m1 * e4m3 product has at most 6 significant bits, which f16 and
// bf16 both hold. Each decoder turns packed word w (8 elements) into 4 pairs in the order
// {(e0, e4), (e1, e5), (e2, e6), (e3, e7)}; the activations are staged in the same order.
// ================================================================================================
namespace nvfp4 {

// f16: the biased decode (e2m1 * 2^-14, `e2m1x8_spread`: even = bytes e0 e2 e4 e6, odd = e1 e3
// e5 e7) times `scale_f16x2_x128`'s pair (scale * 2^7) is e2m1 * e4m3 * 2^-7, exact (see there).
// The output carries the 2^-7: the kernel's epilogue multiplies by W4A16_F16_UNBIAS.
constexpr double W4A16_F16_UNBIAS = 128.0;
NVFP4_DEVICE void w4a16_f16x8(u32 w, u32 s2, u32* out) {
  u32 even, odd;
  e2m1x8_spread(w, even, odd);
  // Spread bytes 0 and 2 (or 1 and 3) into the high bytes of an f16x2 with zero low bytes.
  out[0] = ptx::hmul2(ptx::prmt(even, 0u, 0x2404u), s2);
  out[1] = ptx::hmul2(ptx::prmt(odd, 0u, 0x2404u), s2);
  out[2] = ptx::hmul2(ptx::prmt(even, 0u, 0x3414u), s2);
  out[3] = ptx::hmul2(ptx::prmt(odd, 0u, 0x3414u), s2);
}

// bf16: the biased decode puts an E2M1 code's magnitude bits at bits 6..8 of a bf16 and its sign
// at bit 15: the pattern s << 15 | c << 6 reads as e2m1 * 2^-126 for every code (codes 0 and 1
// land on the bf16 subnormals, spaced as E2M1's). Elements i and i + 4 sit 16 bits apart in w, so
// one shift of w places both magnitudes of a pair and another both signs. Times
// `w4a16_bf16_scale`'s pair (scale * 2^119, a normal bf16 for every e4m3 scale: 2^110 ..
// 448 * 2^119 < 2^128) it is e2m1 * e4m3 * 2^-7, normal and exact.
// NOTE: this relies on bf16 multiplication keeping subnormal inputs (PTX: mul.bf16x2 has no
// flush-to-zero form); a flush would zero every +-0.5 weight, which the exact GPU tests see.
constexpr double W4A16_BF16_UNBIAS = 128.0;
constexpr u32 BF16X2_2POW119 = 0x7B007B00u;

// The scale pair of block `block` (0: low byte, 1: high byte of the chunk's scale bytes, as a
// bf16x2 `s01`): (s * 2^119, s * 2^119).
NVFP4_DEVICE u32 w4a16_bf16_scale(u32 s01, int block) {
  return ptx::hmul2_bf16(ptx::prmt(s01, s01, block ? 0x3232u : 0x1010u), BF16X2_2POW119);
}

NVFP4_DEVICE void w4a16_bf16x8(u32 w, u32 s2, u32* out) {
  constexpr u32 MAG = 0x01C001C0u, SIGN = 0x80008000u;  // bits 6..8 and 15 of each half
  out[0] = ptx::hmul2_bf16(ptx::lop3_and_or(w << 6, MAG, (w << 12) & SIGN), s2);
  out[1] = ptx::hmul2_bf16(ptx::lop3_and_or(w << 2, MAG, (w << 8) & SIGN), s2);
  out[2] = ptx::hmul2_bf16(ptx::lop3_and_or(w >> 2, MAG, (w << 4) & SIGN), s2);
  out[3] = ptx::hmul2_bf16(ptx::lop3_and_or(w >> 6, MAG, w & SIGN), s2);
}

// Two e4m3 bytes (low byte first) as a bf16x2, exactly (every e4m3 value is a bf16; NaN stays NaN).
NVFP4_DEVICE u32 e4m3x2_to_bf16x2(u32 two_bytes) {
  float lo, hi;
  e4m3x2_to_f32(two_bytes, lo, hi);
  return ptx::f32x2_to_bf16x2_rn(lo, hi);
}

}  // namespace nvfp4
