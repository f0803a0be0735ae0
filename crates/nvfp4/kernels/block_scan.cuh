// block_scan.cuh: an exclusive prefix sum over a block, for the kernels that lay out work from
// counts on the device (the grouped launch's table builder, the GEMV's MoE walk).
#pragma once
#include "ptx.cuh"

// The exclusive prefix sum of v over the block's THREADS threads in thread order; `total` gets
// the block's sum. Every thread must call it (it synchronizes the block).
template <int THREADS, class T>
NVFP4_DEVICE T block_scan(T v, T& total) {
  constexpr int WARPS = THREADS / 32;
  static_assert(THREADS % 32 == 0 && WARPS <= 32, "warp 0 scans the warps' sums");
  __shared__ T warp_sums[WARPS];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  T x = v;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const T y = __shfl_up_sync(0xFFFFFFFFu, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    T w = lane < WARPS ? warp_sums[lane] : T(0);
#pragma unroll
    for (int d = 1; d < WARPS; d *= 2) {
      const T y = __shfl_up_sync(0xFFFFFFFFu, w, d);
      if (lane >= d) w += y;
    }
    if (lane < WARPS) warp_sums[lane] = w;
  }
  __syncthreads();
  const T before = warp == 0 ? T(0) : warp_sums[warp - 1];
  total = warp_sums[WARPS - 1];
  __syncthreads();  // warp_sums is free for the next scan
  return before + x - v;
}
