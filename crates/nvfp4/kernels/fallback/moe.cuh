// fallback/moe.cuh: which output tile a CTA of the fallback's MoE form computes (SPEC §3.4's MoE
// form: tokens [1, T, K] sorted by expert, expert e's rows ending at offsets[e], which live in
// device memory). The host launches an upper bound of row tiles (every expert's tokens in BM-row
// tiles: at most (T + (BM - 1) * min(E, T)) / BM); slot s is the s-th row tile of the experts in
// order, found by warp 0 scanning the offsets 32 experts at a time (a shuffle prefix sum of the
// tile counts) and shared with the CTA. A slot past the last tile computes nothing.
// Offsets are clamped into 0..T: offsets out of range or out of order read and write no row
// outside the tensors.
#pragma once

#include "ptx.cuh"
#include "generated.cuh"

namespace fb {

// Expert `expert` (-1: none) owns rows [start, end) of the tokens; the CTA's tile starts at row m0.
struct MoeTile {
  int expert, start, end, m0;
};

// The tile of slot `slot` among the row tiles of `experts` experts ending at `offsets` over `t`
// tokens. Every thread of the CTA calls it (it synchronizes the CTA) and gets the same tile.
__device__ __forceinline__ MoeTile moe_tile(const i32* offsets, int experts, int t, int slot) {
  __shared__ MoeTile found;
  if (threadIdx.x < 32) {
    constexpr unsigned ALL = 0xFFFFFFFFu;
    const int lane = threadIdx.x;
    if (lane == 0) found = MoeTile{-1, 0, 0, 0};
    __syncwarp();
    int before = 0, prev_end = 0;  // tiles and the end row of the experts of earlier chunks
    for (int base = 0; base < experts; base += 32) {
      const int e = base + lane;
      const int raw_end = e < experts ? (int)ptx::ld_nc_u32(offsets + e) : t;
      int end = min(max(raw_end, 0), t);
      // Lane 0's range starts where the previous chunk ended, every other lane's where its left
      // neighbour's ends.
      const int left = __shfl_up_sync(ALL, end, 1);
      const int start = lane == 0 ? prev_end : left;
      end = max(end, start);
      const int tiles = e < experts ? (end - start + mma::BM - 1) / mma::BM : 0;
      int incl = tiles;  // inclusive prefix sum over the lanes
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int x = __shfl_up_sync(ALL, incl, d);
        if (lane >= d) incl += x;
      }
      const int first = before + incl - tiles;
      if (slot >= first && slot < first + tiles) found = MoeTile{e, start, end, start + (slot - first) * mma::BM};
      before += __shfl_sync(ALL, incl, 31);
      prev_end = __shfl_sync(ALL, end, 31);
      if (slot < before) break;  // uniform over the warp
    }
  }
  __syncthreads();
  return found;
}

}  // namespace fb
