// fallback/stage.cuh: what one thread of the mma.sync fallback (gemm_fallback.cu,
// gemm_fallback_w4a16.cu) stages per K-tile: half a K-tile (BK / 2 elements) of one operand row,
// loaded into registers ahead of use, then written into the CTA's shared tile as the MMA's 16-bit
// type. Thread t owns tile row t / 2, half t % 2. Rows past the operand and elements past K stage
// as +0.
// - Nvfp4Half<BF16>: an NVFP4 row (a weight; the activation too in W4A4): BLOCKS blocks of 8
//   packed bytes and their scale bytes, decoded with the scale multiplied in, exactly (every
//   e2m1 * e4m3 product has at most 6 significant bits):
//     f16:  e2m1 * e4m3 (nvfp4::decode_f16x8, as W4A4 has always staged both operands);
//     bf16: e2m1 * e4m3 * 2^-14 (w16::Bf16Pairs times the scale * 2^112: both exact bf16; the
//           unscaled code would be a bf16 subnormal, the scale * 2^126 would overflow), so the
//           epilogue multiplies by UNBIAS = 2^14.
//   NaN scale codes stay NaN, so a NaN scale poisons every product of its block.
// - DenseHalf: a 16-bit activation row (W4A16), copied as it is: K % 16 == 0 and 16-byte aligned
//   tensors make every 8-element chunk one aligned 16-byte load, wholly inside or past K.
#pragma once

#include "ptx.cuh"
#include "nvfp4.cuh"
#include "sm90/decode_w16.cuh"
#include "generated.cuh"

namespace fb {

using mma::BK;
constexpr int LDS = BK + 8;          // 16-bit elements per shared row: 144 B, conflict-free fragments
constexpr int HALF = BK / 2;         // elements a thread stages per K-tile
constexpr int BLOCKS = HALF / 16;    // NVFP4 scale blocks in them
constexpr int CHUNKS = HALF / 8;     // 16-byte chunks of a 16-bit row in them
static_assert(mma::THREADS == 2 * mma::BM && mma::BM == mma::BN, "two threads per tile row");

// This thread's first element of `tile` ([BM, LDS] 16-bit, rows K-major).
NVFP4_DEVICE u16* staged_at(u16* tile) { return tile + (threadIdx.x / 2) * LDS + (threadIdx.x % 2) * HALF; }

template <bool BF16>
struct Nvfp4Half {
  // What the epilogue multiplies the f32 sums by (the bf16 decode's 2^-14, undone exactly).
  static constexpr double UNBIAS = BF16 ? 16384.0 : 1.0;
  uint2 w[BLOCKS];  // 8 packed bytes per block
  u32 s[BLOCKS];    // scale byte per block

  // Row `row` of batch l of an NVFP4 [L, rows, K] operand (`vals` [L, rows, K/2], `sfs` plain or
  // blocked), the blocks of this thread's half of K-tile kt.
  NVFP4_DEVICE void load(const u8* vals, const u8* sfs, bool blocked, int rows, int k, int l, int row, int kt) {
    const int kb0 = kt * (BK / 16) + BLOCKS * (threadIdx.x % 2);
#pragma unroll
    for (int b = 0; b < BLOCKS; ++b) nvfp4::load_block(vals, sfs, blocked, rows, k, l, row, kb0 + b, w[b], s[b]);
  }

  NVFP4_DEVICE void store(u16* tile) const {
    uint4* d = reinterpret_cast<uint4*>(staged_at(tile));
#pragma unroll
    for (int b = 0; b < BLOCKS; ++b) {
      u32 h[8];  // elements (2i, 2i + 1) in pair i
      if constexpr (BF16) {
        const u32 sc = w16::scale_pair<true>(s[b] | (s[b] << 8), 0);  // (s * 2^112, s * 2^112)
        const w16::Bf16Pairs lo = w16::Bf16Pairs::of(w[b].x), hi = w16::Bf16Pairs::of(w[b].y);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          h[i] = ptx::hmul2_bf16(lo.pair(i), sc);
          h[4 + i] = ptx::hmul2_bf16(hi.pair(i), sc);
        }
      } else {
        // scale * 64 as f16 in both halves (exact: <= 448 * 64 < 65504; NaN stays NaN).
        const u32 sc = ptx::hmul2(ptx::cvt_e4m3x2_f16x2(s[b] | (s[b] << 8)), 0x54005400u);
        nvfp4::decode_f16x8(w[b].x, sc, h);
        nvfp4::decode_f16x8(w[b].y, sc, h + 4);
      }
      d[2 * b] = make_uint4(h[0], h[1], h[2], h[3]);
      d[2 * b + 1] = make_uint4(h[4], h[5], h[6], h[7]);
    }
  }
};

struct DenseHalf {
  uint4 v[CHUNKS];  // 8 elements each

  // This thread's half of K-tile kt of the row at `row` ([K] 16-bit), zeros unless `in`.
  NVFP4_DEVICE void load(const u16* row, bool in, int k, int kt) {
    const int k0 = kt * BK + (threadIdx.x % 2) * HALF;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c)
      v[c] = in && k0 + 8 * c < k ? ptx::ld_nc_v4(row + k0 + 8 * c) : make_uint4(0, 0, 0, 0);
  }

  NVFP4_DEVICE void store(u16* tile) const {
    uint4* d = reinterpret_cast<uint4*>(staged_at(tile));
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) d[c] = v[c];
  }
};

}  // namespace fb
