// sm90/decode_x.cuh: the X pre-pass's work per thread (decode_x_sm90.cu, grouped_gemm_sm90.cu):
// NVFP4 -> f16, in the k order the consumers take W's elements in.
//
// Output: [L, rows, K64] f16, K padded with zeros to a multiple of 64, scale multiplied in (and
// the 2^-7 bias of the W decode: e2m1 * e4m3 * 2^-7 is exact in f16), which the TMA loads straight
// into the 128-byte-swizzled K-major layout the wgmma B descriptor reads.
//
// The order: 16-byte chunk c = 2j + h of a 64-element group holds k slots 16j + 8h .. +7 of k16
// step j: for quad lane t the f16x2 it pairs with its A fragment registers (h = 0: fragment pair
// 0, h = 1: pair 1), i.e. for j = 2J + i, (e_{4i}, e_{4i+2}) (h = 0) and (e_{4i+1}, e_{4i+3})
// (h = 1) of word J (elements 16t + 8J .. +7) of scale block t (sm90/mainloop.cuh).
#pragma once

#include "ptx.cuh"
#include "nvfp4.cuh"
#include "generated.cuh"

namespace sm90 {

// Output chunk `idx` (16 bytes) of operand p: chunk c (J = c / 4, q = c % 4) of 64-element group
// gi of a row takes pair q of word J of each of the group's 4 scale blocks (the order above), so a
// warp stores 512 contiguous bytes and the 8 lanes of a group load the same 16 input bytes.
// 32-bit indexing: the host checks that L * rows * K64 fits.
NVFP4_DEVICE void decode_x_chunk(const XDecodeParams& p, i32 idx) {
  const i32 groups = p.k64 / BK;
  if (idx >= p.l * p.rows * groups * 8) return;
  const i32 c = idx & 7, J = c >> 2, q = c & 3;
  const i32 gi = (idx >> 3) % groups;
  const i32 lr = (idx >> 3) / groups;  // l * rows + row
  const i32 sf_cols = p.k / 16;
  // K % 16 == 0: a row starts 8-byte aligned and every 8-element word lies wholly inside or
  // wholly past K.
  const u8* src = p.x + (i64)lr * (p.k / 2) + 32 * gi + 4 * J;
  u32 out[4];
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const i32 col = 4 * gi + t;  // scale block t of the group
    const bool in_k = col < sf_cols;
    const u32 w = in_k ? ptx::ld_nc_u32(src + 8 * t) : 0u;
    const u32 sc =
        in_k ? ptx::ld_nc_u8(p.sf + nvfp4::scale_offset(p.blocked != 0, p.rows, sf_cols, lr % p.rows, col, lr / p.rows))
             : 0u;
    u32 even, odd;
    nvfp4::e2m1x8_spread(w, even, odd);
    out[t] = ptx::hmul2(nvfp4::f16x2_of_spread(q & 1 ? odd : even, q >> 1), nvfp4::scale_f16x2_x128(sc));
  }
  *reinterpret_cast<uint4*>(p.out + (i64)lr * p.k64 + BK * gi + 8 * c) = make_uint4(out[0], out[1], out[2], out[3]);
}

}  // namespace sm90
