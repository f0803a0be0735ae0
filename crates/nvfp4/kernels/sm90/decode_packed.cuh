// sm90/decode_packed.cuh: the W4A16 weight decode from the packed form (format/w16_pack.rs):
// one 32-bit word per thread per 16-row block and k16 step holds the 8 E2M1 codes of its wgmma A
// fragment, placed at pack time so that each fragment register is a rotate and a mask away, and
// one 32-bit word per two k16 steps holds the 4 scales those fragments need, pre-encoded.
//
// Registers (SPEC §8 values; X is the activation's type T, bf16 or f16):
//   a0 = q & M, a1 = rotl(q, 3) & M, a2 = rotl(q, 1) & S | rotl(q, 6) & G,
//   a3 = rotl(q, 2) & S | rotl(q, R3) & G, with S the two sign bits (15, 31) and G the two
//   3-bit magnitudes (e1 e0 m): bf16 at bits 8..6 (a bf16 of value e2m1 * 2^-126, code 1 a
//   subnormal), f16 at bits 11..9 (e2m1 * 2^-14); R3 = 13 (bf16) or 9 (f16). Every bit of q is
//   read by exactly one register (checked on the host, backend/cuda/kernels/decode_packed.rs).
// Scales: byte = the f16 of |scale| shifted right by 7 (e5m3; NaN codes 0xFC; zero and negative
// scales were folded into the codes at pack time), word [s(g, 2i), s(g, 2i + 1), s(g + 8, 2i),
// s(g + 8, 2i + 1)] for steps 2i, 2i + 1: one shift and one lop3 give the pair (row g, row g + 8)
// of a step as bf16 (byte << 4 | 0x7000: scale * 2^112) or f16 (byte << 7: the scale). Each
// register is multiplied by its row's half (HMUL2 with a replicated operand), so products are
// e2m1 * e4m3 * 2^-14 in both types, exact, the W4A4 decode's bias.
#pragma once

#include "ptx.cuh"

namespace wp {

NVFP4_DEVICE u32 rotl(u32 x, int r) { return __funnelshift_l(x, x, r); }

template <bool BF16>
struct Bits {
  static constexpr u32 S = 0x80008000u;
  static constexpr u32 G = BF16 ? 0x01C001C0u : 0x0E000E00u;
  static constexpr u32 M = S | G;
  static constexpr int R3 = BF16 ? 13 : 9;
};

// The scale pair of k16 step J (0..3) of a sub-stage from the thread's two scale words.
template <bool BF16, int J>
NVFP4_DEVICE u32 scale_pair(uint2 w) {
  const u32 x = J < 2 ? w.x : w.y;
  if constexpr (BF16)
    return ((J % 2 == 0 ? x << 4 : x >> 4) & 0x0FF00FF0u) | 0x70007000u;
  else
    return (J % 2 == 0 ? x << 7 : x >> 1) & 0x7F807F80u;
}

// The 4 A fragment registers of a step from its word q and scale pair s (low half: row g).
template <bool BF16>
NVFP4_DEVICE void frags(u32 q, u32 s, u32 (&f)[4]) {
  using B = Bits<BF16>;
  const u32 a0 = q & B::M;
  const u32 a1 = rotl(q, 3) & B::M;
  const u32 a2 = (rotl(q, 1) & B::S) | (rotl(q, 6) & B::G);
  const u32 a3 = (rotl(q, 2) & B::S) | (rotl(q, B::R3) & B::G);
  f[0] = ptx::hmul2_by_half<0, BF16>(a0, s);
  f[1] = ptx::hmul2_by_half<1, BF16>(a1, s);
  f[2] = ptx::hmul2_by_half<0, BF16>(a2, s);
  f[3] = ptx::hmul2_by_half<1, BF16>(a3, s);
}

}  // namespace wp
