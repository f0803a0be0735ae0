// sm90/decode_packed.cuh: the W4A16 weight decode from the packed form (format/w16_pack.rs):
// one 32-bit word per thread per 16-row block and k16 step holds the 8 E2M1 codes of its wgmma A
// fragment, placed at pack time so that each fragment register is one or two rotates and masks
// away, and one 32-bit word per two k16 steps holds the 4 scales those fragments need,
// pre-encoded.
//
// Registers (SPEC §8 values; X is the activation's type T, bf16 or f16), with S the two sign bits
// (15, 31), G the two 3-bit magnitudes (e1 e0 m): bf16 at bits 8..6 (a bf16 of value
// e2m1 * 2^-126, code 1 a subnormal), f16 at bits 11..9 (e2m1 * 2^-14), M = S | G:
//   bf16: a0 = q & M, a1 = rotl(q, 4) & M, a2 = rotl(q, 10) & M,
//         a3 = rotl(q, 6) & (bits 6, 22: the m bits) | rotl(q, 14) & (the others of M);
//   f16:  a0 = q & M, a1 = rotl(q, 3) & M, a2 = rotl(q, 1) & S | rotl(q, 6) & G,
//         a3 = rotl(q, 2) & S | rotl(q, 9) & G.
// (The rotations are format/w16_pack.rs's FRAG_ROT, by which the packers place the bits; every
// bit of q is read by exactly one register: checked on the host, as is this decode, instruction
// for instruction, in backend/cuda/kernels/decode_packed.rs.) 9 integer operations per word in
// bf16, 11 in f16.
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
  static constexpr u32 LOW = 0x00400040u;  // bf16: the m bits, which a3 takes from rotl(q, 6)
};

// The bf16 scale pairs' exponent bits, 0x70007000, in a register: as a constant, ptxas splits
// the pair's mask-and-or into two lop3 (one immediate each), and it folds any constant it can see
// through; the SM count (%nsmid) it cannot. One lop3 fewer per pair: 8 of ~230 instructions per
// sub-stage of m256n16.
NVFP4_DEVICE u32 scale_exponent_bits() {
  u32 n;
  asm volatile("mov.u32 %0, %%nsmid;" : "=r"(n));
  return n != 0u ? 0x70007000u : 0u;
}

// The scale pair of k16 step J (0..3) of a sub-stage from the thread's two scale words;
// `exp_bits` is `scale_exponent_bits()` (bf16; f16 ignores it).
template <bool BF16, int J>
NVFP4_DEVICE u32 scale_pair(uint2 w, u32 exp_bits) {
  const u32 x = J < 2 ? w.x : w.y;
  if constexpr (BF16)
    return ((J % 2 == 0 ? x << 4 : x >> 4) & 0x0FF00FF0u) | exp_bits;
  else
    return (J % 2 == 0 ? x << 7 : x >> 1) & 0x7F807F80u;
}

// The 4 A fragment registers of a step from its word q and scale pair s (low half: row g).
template <bool BF16>
NVFP4_DEVICE void frags(u32 q, u32 s, u32 (&f)[4]) {
  using B = Bits<BF16>;
  u32 a0, a1, a2, a3;
  a0 = q & B::M;
  if constexpr (BF16) {
    a1 = rotl(q, 4) & B::M;
    a2 = rotl(q, 10) & B::M;
    a3 = (rotl(q, 6) & B::LOW) | (rotl(q, 14) & (B::M & ~B::LOW));
  } else {
    a1 = rotl(q, 3) & B::M;
    a2 = (rotl(q, 1) & B::S) | (rotl(q, 6) & B::G);
    a3 = (rotl(q, 2) & B::S) | (rotl(q, 9) & B::G);
  }
  f[0] = ptx::hmul2_by_half<0, BF16>(a0, s);
  f[1] = ptx::hmul2_by_half<1, BF16>(a1, s);
  f[2] = ptx::hmul2_by_half<0, BF16>(a2, s);
  f[3] = ptx::hmul2_by_half<1, BF16>(a3, s);
}

}  // namespace wp
