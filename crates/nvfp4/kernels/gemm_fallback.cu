// gemm_fallback.cu: simple, correct NVFP4 GEMM, gated dual GEMM and grouped GEMM (SPEC §3.2-3.4)
// for what neither the skeleton nor the small GEMM (gemm_small.cu) takes (the skeleton's rules: K
// a multiple of 32 and at least 64, B1 and B2 in one layout, 32-bit indexing), or when forced
// (`NVFP4_GEMM_SM90=off`).
// - One launch covers a list of problems (one for GEMM and dual GEMM, G for grouped GEMM): the
//   host flattens every problem's output tiles into one grid and each problem records the first
//   CTA of its tiles (`tile_start`); a CTA finds its problem by a linear scan.
// - A CTA computes a 64x64 output tile with 4 warps (2x2, 32x32 each) over K-tiles of 64
//   elements (4 scale blocks). Per K-tile it decodes A and B (and B2) into shared memory as f16,
//   scale multiplied in (exact: every e2m1 * e4m3 product fits f16), then runs f16 mma.sync
//   m16n8k16 with f32 accumulators (products of f16 values are exact in f32).
// - The raw bytes of the next PF K-tiles are in flight in registers while a K-tile is decoded and
//   multiplied: a small problem pays one memory latency per PF K-tiles, not one per K-tile.
// - Epilogue: f64 alpha and a single rounding to f16 or bf16; dual GEMM: silu(x1) * x2 in f32,
//   with the skeleton's silu (output.cuh).
// - Any M, N >= 1, K % 16 == 0, either scale layout per operand, L batches (grid over l too).
#include "ptx.cuh"
#include "nvfp4.cuh"
#include "output.cuh"

// MmaProblem, MmaParams and the sizes (namespace mma): generated.cuh, from their one definition
// (backend/cuda/kernels/fallback.rs).
#include "generated.cuh"

namespace {

using mma::BK;
using mma::BM;
using mma::BN;
using mma::PF;
using mma::THREADS;
constexpr int LDS = BK + 8;  // f16 per shared row: 144 B, conflict-free fragment loads
constexpr int BLOCKS = BK / 16 / 2;  // scale blocks per thread and operand row half
static_assert(THREADS == 2 * BM && BM == BN, "two threads per tile row, each half of its K-tile");

// One thread's raw bytes of one operand for one K-tile: BLOCKS consecutive 16-element blocks of
// one row (8 bytes each) and their scale bytes. Rows past the operand and blocks past K are zero
// (decoded: +0).
struct Raw {
  uint2 w[BLOCKS];
  u32 s[BLOCKS];
};

// Loads the raw blocks of K-tile kt of row `row`: thread half h takes blocks BLOCKS * h .. + BLOCKS - 1.
__device__ __forceinline__ Raw load_raw(const u8* vals, const u8* sfs, bool blocked, int rows, int k, int l, int row,
                                        int kt) {
  Raw r;
  const int kb0 = kt * (BK / 16) + BLOCKS * (threadIdx.x % 2);
#pragma unroll
  for (int b = 0; b < BLOCKS; ++b) nvfp4::load_block(vals, sfs, blocked, rows, k, l, row, kb0 + b, r.w[b], r.s[b]);
  return r;
}

// Decodes r into this thread's BLOCKS * 16 f16 of its tile row.
__device__ __forceinline__ void store_raw(const Raw& r, u16* tile) {
  uint4* d = reinterpret_cast<uint4*>(tile + (threadIdx.x / 2) * LDS + (threadIdx.x % 2) * BLOCKS * 16);
#pragma unroll
  for (int b = 0; b < BLOCKS; ++b) {
    // scale * 64 as f16 in both halves (exact: <= 448 * 64 < 65504; NaN stays NaN).
    const u32 s = ptx::hmul2(ptx::cvt_e4m3x2_f16x2(r.s[b] | (r.s[b] << 8)), 0x54005400u);
    u32 h[8];
    nvfp4::decode_f16x8(r.w[b].x, s, h);
    nvfp4::decode_f16x8(r.w[b].y, s, h + 4);
    d[2 * b] = make_uint4(h[0], h[1], h[2], h[3]);
    d[2 * b + 1] = make_uint4(h[4], h[5], h[6], h[7]);
  }
}

// acc[mi][ni] += A[32 x 16] * B[16 x 32] for this warp's sub-tile at K offset k0 of the tile.
__device__ __forceinline__ void mma_k16(const u16* As, const u16* Bs, int wm, int wn, int k0, float (*acc)[4][4]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  u32 a[2][4], b[4][2];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
    const u16* p = As + (wm * 32 + mi * 16 + g) * LDS + k0 + 2 * t;
    a[mi][0] = *reinterpret_cast<const u32*>(p);
    a[mi][1] = *reinterpret_cast<const u32*>(p + 8 * LDS);
    a[mi][2] = *reinterpret_cast<const u32*>(p + 8);
    a[mi][3] = *reinterpret_cast<const u32*>(p + 8 * LDS + 8);
  }
#pragma unroll
  for (int ni = 0; ni < 4; ++ni) {
    const u16* p = Bs + (wn * 32 + ni * 8 + g) * LDS + k0 + 2 * t;
    b[ni][0] = *reinterpret_cast<const u32*>(p);
    b[ni][1] = *reinterpret_cast<const u32*>(p + 8);
  }
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) ptx::mma_m16n8k16_f32(acc[mi][ni], a[mi], b[ni]);
}

template <bool DUAL>
__device__ void gemm_body(const MmaProblem* problems, int count) {
  __shared__ __align__(16) u16 As[BM * LDS];   // [64, BK] f16, padded rows
  __shared__ __align__(16) u16 Bs[BN * LDS];   // [64, BK] f16, rows are N (K-major)
  __shared__ __align__(16) u16 B2s[DUAL ? BN * LDS : 8];

  int g = 0;
  while (g + 1 < count && problems[g + 1].tile_start <= (int)blockIdx.x) ++g;
  const MmaProblem& P = problems[g];
  const int local = blockIdx.x - P.tile_start;
  const int per_batch = P.tiles_m * P.tiles_n;
  const int l = local / per_batch, tm = (local % per_batch) / P.tiles_n, tn = local % P.tiles_n;
  const int m0 = tm * BM, n0 = tn * BN;
  const int warp = threadIdx.x / 32, wm = warp / 2, wn = warp % 2;

  float acc[2][4][4] = {};
  float acc2[DUAL ? 2 : 1][4][4] = {};
  const int ktiles = (P.k + BK - 1) / BK;
  const int ra = m0 + threadIdx.x / 2, rb = n0 + threadIdx.x / 2;  // this thread's rows
  const bool bla = P.layouts & 1, blb = P.layouts & 2, blb2 = P.layouts & 4;
  Raw xa[PF], xb[PF], xb2[DUAL ? PF : 1];
#pragma unroll
  for (int j = 0; j < PF; ++j)
    if (j < ktiles) {
      xa[j] = load_raw(P.a, P.sfa, bla, P.m, P.k, l, ra, j);
      xb[j] = load_raw(P.b, P.sfb, blb, P.n, P.k, l, rb, j);
      if (DUAL) xb2[DUAL ? j : 0] = load_raw(P.b2, P.sfb2, blb2, P.n, P.k, l, rb, j);
    }
  // NOTE: PF K-tiles per outer step with the slot index a compile-time constant (a runtime index
  // into the register arrays would put them in local memory).
  for (int kt0 = 0; kt0 < ktiles; kt0 += PF) {
#pragma unroll
    for (int j = 0; j < PF; ++j) {
      const int kt = kt0 + j;
      if (kt >= ktiles) break;  // uniform over the CTA
      __syncthreads();          // the previous K-tile's fragments are read
      store_raw(xa[j], As);
      store_raw(xb[j], Bs);
      if (DUAL) store_raw(xb2[DUAL ? j : 0], B2s);
      if (kt + PF < ktiles) {
        xa[j] = load_raw(P.a, P.sfa, bla, P.m, P.k, l, ra, kt + PF);
        xb[j] = load_raw(P.b, P.sfb, blb, P.n, P.k, l, rb, kt + PF);
        if (DUAL) xb2[DUAL ? j : 0] = load_raw(P.b2, P.sfb2, blb2, P.n, P.k, l, rb, kt + PF);
      }
      __syncthreads();
#pragma unroll
      for (int k0 = 0; k0 < BK; k0 += 16) {
        mma_k16(As, Bs, wm, wn, k0, acc);
        if (DUAL) mma_k16(As, B2s, wm, wn, k0, acc2);
      }
    }
  }

  // Epilogue: fragment element e of acc[mi][ni] is row g (+8 for e >= 2), column 2t + e % 2.
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = m0 + wm * 32 + mi * 16 + lane / 4 + (e / 2) * 8;
        const int col = n0 + wn * 32 + ni * 8 + 2 * (lane % 4) + e % 2;
        if (row >= P.m || col >= P.n) continue;
        u16 bits;
        if (DUAL) {
          const float x1 = (float)((double)acc[mi][ni][e] * P.alpha);
          const float x2 = (float)((double)acc2[DUAL ? mi : 0][ni][e] * P.alpha2);
          bits = out::of_f32(out::silu(x1) * x2, P.out_bf16);
        } else {
          bits = out::of_f64((double)acc[mi][ni][e] * P.alpha, P.out_bf16);
        }
        P.c[((i64)l * P.m + row) * P.n + col] = bits;
      }
}

}  // namespace

// GEMM and grouped GEMM: `count` problems, all tiles in one grid.
extern "C" __global__ void __launch_bounds__(THREADS) gemm_nvfp4_sm90_mma(const __grid_constant__ MmaParams p) {
  gemm_body<false>(p.count == 1 ? &p.one : p.problems, p.count);
}

// Gated dual GEMM: silu(A * B1^T) * (A * B2^T), the A tile decoded once for both.
extern "C" __global__ void __launch_bounds__(THREADS) dual_gemm_nvfp4_sm90_mma(const __grid_constant__ MmaParams p) {
  gemm_body<true>(p.count == 1 ? &p.one : p.problems, p.count);
}
