// floors.cu: the benchmark's floor kernels (SPEC §7): an empty kernel (the launch floor) and pure
// streaming reads of a byte range with no decode (the read ceiling of a row). A read sums every
// 16-byte word into one u32 per CTA so that no load can be dropped.
//
// Both are programmatic-dependent-launch ready: they read nothing a previous kernel writes, and a
// read waits (griddepcontrol.wait) before its only write, its per-CTA sum.
#include "generated.cuh"

extern "C" __global__ void floor_empty_sm90() {}

namespace floors {

// Sum of a CTA's partial sums, written once to out[blockIdx.x].
NVFP4_DEVICE void finish(u32 acc, u32* out) {
  __shared__ u32 total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  for (int o = 16; o; o /= 2) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, o);
  if (threadIdx.x % 32 == 0) atomicAdd(&total, acc);
  __syncthreads();
  ptx::wait_prerequisites();
  if (threadIdx.x == 0) out[blockIdx.x] = total;
}

// Words [first, end) step `stride`, U 16-byte loads in flight per thread (evict-first, the GEMV's
// streaming load). The lanes of a warp read consecutive words (`first` is lane + a warp-uniform
// base, `stride` a multiple of 32).
// NOTE: the unrolled loop's condition must be the same for every lane: a `__syncwarp()` reached by
// part of a warp is undefined, and hung the H200 (7168x2048x4's 33 MB, 528 CTAs of one contiguous
// range each, chained in a graph). The tail loop, with no warp barrier, takes the ragged end.
template <int U>
NVFP4_DEVICE u32 sum_words(const uint4* p, u64 first, u64 end, u64 stride) {
  const u64 pol = ptx::policy_evict_first();
  const u64 lane_end = 31 - (threadIdx.x % 32);  // the warp's last word is i + lane_end
  u32 acc = 0;
  u64 i = first;
  for (; i + (U - 1) * stride + lane_end < end; i += U * stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = ptx::ld_stream_v4(p + i + u * stride, pol);
    __syncwarp();  // keeps ptxas from interleaving the adds with the loads (U loads in flight)
#pragma unroll
    for (int u = 0; u < U; ++u) acc += v[u].x + v[u].y + v[u].z + v[u].w;
  }
  for (; i < end; i += stride) {
    const uint4 v = ptx::ld_stream_v4(p + i, pol);
    acc += v.x + v.y + v.z + v.w;
  }
  return acc;
}

// Grid-strided: consecutive threads of the whole grid read consecutive words.
template <int U>
NVFP4_DEVICE void read_strided(const FloorReadParams& p) {
  ptx::launch_dependents();
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  finish(sum_words<U>((const uint4*)p.src, first, p.words, stride), (u32*)p.out);
}

// Contiguous: each CTA reads one contiguous 1/gridDim of the range.
template <int U>
NVFP4_DEVICE void read_contiguous(const FloorReadParams& p) {
  ptx::launch_dependents();
  const u64 per = (p.words + gridDim.x - 1) / gridDim.x;
  const u64 begin = (u64)blockIdx.x * per;
  const u64 end = begin + per < p.words ? begin + per : p.words;
  finish(sum_words<U>((const uint4*)p.src, begin + threadIdx.x, end, blockDim.x), (u32*)p.out);
}

}  // namespace floors

#define FLOOR_READ(name, how, U)                                                                 \
  extern "C" __global__ void __launch_bounds__(1024) name(const __grid_constant__ FloorReadParams p) { \
    floors::how<U>(p);                                                                           \
  }
FLOOR_READ(floor_read_strided4_sm90, read_strided, 4)
FLOOR_READ(floor_read_strided8_sm90, read_strided, 8)
FLOOR_READ(floor_read_contiguous8_sm90, read_contiguous, 8)
