// gemm_small.cu: the GEMM of small problems in one launch (SPEC §3.2), where the skeleton's two
// launches, pipeline fill and split-K sum cost more than the work (M x N a few tiles, K short).
//
// - A CTA owns a 16 x 8*NT output tile (rows of A x rows of B); its WARPS warps share K: warp w
//   takes the 64-element chunks w, w + WARPS, ... and the partial sums meet in shared memory,
//   added in warp order (deterministic).
// - No shared-memory staging of the operands: each thread loads the bytes of its own mma.sync
//   fragments straight into registers and decodes them there, the next chunk's loads in flight
//   while the current one is multiplied. The k order inside a 64-element chunk is permuted the
//   way the skeleton's consumers permute it (sm90/mainloop.cuh): quad lane t owns scale block t
//   (bytes 8t..8t+7 of the chunk), and A and B use the same permutation, so the dot products are
//   those of the unpermuted operands.
// - Exactness: both operands decode to e2m1 * e4m3 * 2^-7 (exact in f16, nvfp4.cuh), products
//   are exact in the f32 accumulators; the epilogue multiplies by p.alpha in f64 (alpha, the
//   global scales and the 2^14 of the biased decodes, folded on the host) and rounds once to f16
//   or bf16.
// - Any M, N >= 1, K % 16 == 0 (a block lies wholly inside or past K), either scale layout per
//   operand, L batches (grid over l too).
#include "ptx.cuh"
#include "nvfp4.cuh"
#include "output.cuh"

// SmallParams and the sizes (namespace small): generated.cuh, from their one definition
// (backend/cuda/kernels/small.rs).
#include "generated.cuh"

namespace {

using small::NT;
using small::WARPS;
constexpr int TM = 16, TN = 8 * NT;
static_assert(small::THREADS == 32 * WARPS, "one warp per K share");

// One thread's bytes of one 64-element chunk: block t of A rows g and g + 8 and of B rows
// 8j + g; 8 bytes and the scale byte each. Rows past the operand and blocks past K are zero.
struct Chunk {
  uint2 aw[2], bw[NT];
  u32 as[2], bs[NT];
};

__device__ __forceinline__ void load_chunk(const SmallParams& p, int l, int m0, int n0, int c, Chunk& x) {
  const int lane = threadIdx.x % 32, g = lane / 4, kb = 4 * c + lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) nvfp4::load_block(p.a, p.sfa, p.layouts & 1, p.m, p.k, l, m0 + g + 8 * h, kb, x.aw[h], x.as[h]);
#pragma unroll
  for (int j = 0; j < NT; ++j) nvfp4::load_block(p.b, p.sfb, p.layouts & 2, p.n, p.k, l, n0 + 8 * j + g, kb, x.bw[j], x.bs[j]);
}

// acc[j] += the chunk's A rows x B rows 8j.. as four m16n8k16 steps per n8 tile. Step 2J + i
// takes pair i of the even and odd elements of word J of each block (sm90/mainloop.cuh's order):
// A fragment {row g pair 0, row g + 8 pair 0, row g pair 1, row g + 8 pair 1}, B {pair 0, pair 1}.
__device__ __forceinline__ void mma_chunk(const Chunk& x, float (&acc)[NT][4]) {
  u32 sa[2], sb[NT];
#pragma unroll
  for (int h = 0; h < 2; ++h) sa[h] = nvfp4::scale_f16x2_x128(x.as[h]);
#pragma unroll
  for (int j = 0; j < NT; ++j) sb[j] = nvfp4::scale_f16x2_x128(x.bs[j]);
#pragma unroll
  for (int J = 0; J < 2; ++J) {
    u32 ae[2], ao[2], be[NT], bo[NT];
#pragma unroll
    for (int h = 0; h < 2; ++h) nvfp4::e2m1x8_spread(J ? x.aw[h].y : x.aw[h].x, ae[h], ao[h]);
#pragma unroll
    for (int j = 0; j < NT; ++j) nvfp4::e2m1x8_spread(J ? x.bw[j].y : x.bw[j].x, be[j], bo[j]);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      u32 fa[4];
      fa[0] = ptx::hmul2(nvfp4::f16x2_of_spread(ae[0], i), sa[0]);
      fa[1] = ptx::hmul2(nvfp4::f16x2_of_spread(ae[1], i), sa[1]);
      fa[2] = ptx::hmul2(nvfp4::f16x2_of_spread(ao[0], i), sa[0]);
      fa[3] = ptx::hmul2(nvfp4::f16x2_of_spread(ao[1], i), sa[1]);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const u32 fb[2] = {ptx::hmul2(nvfp4::f16x2_of_spread(be[j], i), sb[j]),
                           ptx::hmul2(nvfp4::f16x2_of_spread(bo[j], i), sb[j])};
        ptx::mma_m16n8k16_f32(acc[j], fa, fb);
      }
    }
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(small::THREADS) gemm_nvfp4_small(const __grid_constant__ SmallParams p) {
  // Partial sums of warps 1.., [warp - 1][element][lane] (lanes adjacent: no bank conflicts).
  __shared__ float red[WARPS - 1][NT * 4][32];
  // A chained launch: nothing of the previous kernel's is read or written before this.
  ptx::wait_prerequisites();
  ptx::launch_dependents();
  const int tiles_n = (p.n + TN - 1) / TN, tiles_m = (p.m + TM - 1) / TM;
  const int tn = blockIdx.x % tiles_n, tm = (blockIdx.x / tiles_n) % tiles_m, l = blockIdx.x / tiles_n / tiles_m;
  const int m0 = tm * TM, n0 = tn * TN, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunks = (p.k + 63) / 64;

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
  Chunk cur, next;
  if (warp < chunks) load_chunk(p, l, m0, n0, warp, cur);
  for (int c = warp; c < chunks; c += WARPS) {
    const bool more = c + WARPS < chunks;
    if (more) load_chunk(p, l, m0, n0, c + WARPS, next);
    mma_chunk(cur, acc);
    if (more) cur = next;
  }

  if (warp > 0)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[warp - 1][4 * j + e][lane] = acc[j][e];
  __syncthreads();
  if (warp > 0) return;
#pragma unroll
  for (int w = 0; w < WARPS - 1; ++w)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] += red[w][4 * j + e][lane];

  // Element e of acc[j]: row g + 8 (e / 2), column 8j + 2t + e % 2; one rounding.
  const double f = p.alpha;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + g + 8 * h, col = n0 + 8 * j + 2 * t;
      if (row >= p.m || col >= p.n) continue;
      const i64 at = ((i64)l * p.m + row) * p.n + col;
      const u16 lo = out::of_f64((double)acc[j][2 * h] * f, p.out_bf16);
      const u16 hi = out::of_f64((double)acc[j][2 * h + 1] * f, p.out_bf16);
      if (col + 1 < p.n && at % 2 == 0) {
        *reinterpret_cast<u32*>(p.c + at) = (u32)lo | ((u32)hi << 16);
      } else {
        p.c[at] = lo;
        if (col + 1 < p.n) p.c[at + 1] = hi;
      }
    }
}
