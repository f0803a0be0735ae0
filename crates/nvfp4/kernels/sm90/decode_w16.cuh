// sm90/decode_w16.cuh: the weight decode of the 16-bit-activation mainloop (W4A16, SPEC §8):
// E2M1 nibbles and their E4M3 block scales to wgmma A fragments of the activation's own type,
// in natural k order (the activation tile comes straight from the user's tensor, unpermuted).
//
// Which bytes a thread needs. In k16 step j of a 64-element sub-stage, quad lane t holds the
// pairs k = 16j + 2t, +1 (fragment pair 0) and 16j + 8 + 2t, +1 (pair 1): bytes 8j + t and
// 8j + 4 + t of the row's 32 bytes, i.e. byte t of words 2j and 2j + 1. Over the sub-stage that
// is byte t of every word: `quad_bytes` gathers byte t of the 4 words of one 16-byte chunk (the
// 4 lanes of a quad load the same chunk, a shared-memory broadcast), giving g = [pair 0 of step
// 2J, pair 1 of step 2J, pair 0 of step 2J + 1, pair 1 of step 2J + 1] for chunk J. Each byte is
// one fragment register: its low nibble (even k) in the low half, its high nibble in the high
// half.
//
// Values (every product e2m1 * e4m3 has at most 6 significant bits and is exact in both types):
//   f16:  a nibble s|e1 e0|m written as s << 15 | (e1 e0 m) << 9 reads as e2m1 * 2^-14 (e = 0 on
//         the f16 subnormals, as in nvfp4.cuh); times the f16 scale: e2m1 * e4m3 * 2^-14, down to
//         2^-24 (an f16 subnormal, exact: mul.f16x2 keeps subnormals without .ftz).
//   bf16: the same nibble written as s << 15 | (e1 e0 m) << 6 reads as e2m1 * 2^-126 (code 1 is
//         a bf16 subnormal); times the bf16 scale * 2^112: e2m1 * e4m3 * 2^-14, a normal bf16.
//         NOTE: PTX ISA, half precision `mul`: "Subnormal numbers: By default, subnormal numbers
//         are supported" (`.ftz` exists for f16 only), so the subnormal input is not flushed.
// Both carry the 2^-14 of the W4A4 decode (DECODE_BIAS): the epilogue's alpha multiplies it back.
// NaN scale codes stay NaN (the f16 conversion keeps them), so a NaN scale poisons its products.
#pragma once

#include "ptx.cuh"

namespace w16 {

// Byte t of each word of a 16-byte chunk, as one word (word i's byte in byte i). `sel` = t |
// (t + 4) << 4 (`quad_sel`).
NVFP4_DEVICE u32 quad_sel(int t) { return (u32)t | (u32)(t + 4) << 4; }
NVFP4_DEVICE u32 quad_bytes(uint4 v, u32 sel) {
  return ptx::prmt(ptx::prmt(v.x, v.y, sel), ptx::prmt(v.z, v.w, sel), 0x5410u);
}

// f16 fragments of the 4 bytes of g. Each byte's nibbles become one f16 high byte each
// (s at bit 7, magnitude at bits 1..3): `lo` holds those of the low nibbles of bytes 0, 1 (in its
// bytes 0, 1; zero above), `hi` of bytes 2, 3 (in its bytes 2, 3; zero below), `od` those of the
// high nibbles of all 4. A byte permute with a zero byte of `lo` or `hi` forms each pair.
struct F16Pairs {
  u32 lo, hi, od;
  NVFP4_DEVICE static F16Pairs of(u32 g) {
    // Bits 1..3 of each byte from one shifted copy (the magnitude), the rest from another (the
    // sign at bit 7), one lop3 select each; the masks then keep bits 1..3 and 7. Low nibbles:
    // magnitude << 1, sign << 4; high nibbles: magnitude >> 3, the sign already at bit 7. No
    // kept bit comes from another byte.
    // NOTE: written with a separate nibble mask (g & 0x0F0F0F0F, then two shifts), ptxas moved
    // the mask past the shifts: 10 instructions per word instead of these 8.
    constexpr u32 SELECT = 0xE4;  // (a & c) | (b & ~c)
    const u32 e = ptx::lop3<SELECT>(g << 1, g << 4, 0x0E0E0E0Eu);
    const u32 o = ptx::lop3<SELECT>(g >> 3, g, 0x0E0E0E0Eu);
    return F16Pairs{e & 0x00008E8Eu, e & 0x8E8E0000u, o & 0x8E8E8E8Eu};
  }
  // Byte b (0..3) of g as an f16x2 (low nibble, high nibble), value e2m1 * 2^-14.
  NVFP4_DEVICE u32 pair(int b) const {
    constexpr u32 SEL[4] = {0x4202u, 0x5212u, 0x6020u, 0x7030u};
    return ptx::prmt(b < 2 ? lo : hi, od, SEL[b]);
  }
};

// bf16 fragments of the 4 bytes of g: `lo` and `hi` hold the low and the high nibbles of the 4
// bytes, one per byte (bits 0..3). A byte permute places byte b's two nibbles in the low byte of
// each 16-bit lane, the other byte zero (the sign replica of a byte whose top bit is clear); one
// multiply then writes the nibble at bits 6..9 and again at 12..15, and a mask keeps the
// magnitude of the first copy and the sign of the second.
struct Bf16Pairs {
  u32 lo, hi;
  NVFP4_DEVICE static Bf16Pairs of(u32 g) { return Bf16Pairs{g & 0x0F0F0F0Fu, (g >> 4) & 0x0F0F0F0Fu}; }
  // Byte b (0..3) of g as a bf16x2 (low nibble, high nibble), value e2m1 * 2^-126.
  NVFP4_DEVICE u32 pair(int b) const {
    constexpr u32 SEL[4] = {0xC480u, 0xD591u, 0xE6A2u, 0xF7B3u};
    return (ptx::prmt(lo, hi, SEL[b]) * 0x1040u) & 0x81C081C0u;
  }
};

// The pair decoder of an activation type.
template <bool BF16>
struct PairsOf {
  using T = F16Pairs;
};
template <>
struct PairsOf<true> {
  using T = Bf16Pairs;
};

// The scales of blocks 2i, 2i + 1 of the sub-stage's word as a pair of the activation's type
// (f16, or bf16 times 2^112), exact, NaN codes staying NaN: the multiplier of step j is half j % 2
// (`ptx::hmul2_by_half`).
template <bool BF16>
NVFP4_DEVICE u32 scale_pair(u32 word, int i) {
  const u32 h2 = ptx::cvt_e4m3x2_f16x2(i ? word >> 16 : word & 0xFFFFu);
  if constexpr (BF16)
    return ptx::f16x2_to_bf16x2_x2p112(h2);
  else
    return h2;
}

// A decoded pair times half `h` of a scale pair (`h` a constant once the steps are unrolled).
template <bool BF16>
NVFP4_DEVICE u32 scaled(u32 pair, u32 scales, int h) {
  return h ? ptx::hmul2_by_half<1, BF16>(pair, scales) : ptx::hmul2_by_half<0, BF16>(pair, scales);
}

}  // namespace w16
