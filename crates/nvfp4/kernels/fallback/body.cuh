// fallback/body.cuh: the mma.sync fallback's CTA (gemm_fallback.cu has the algorithm), templated
// on the activation's policy `Act`: how A's half K-tile rows are loaded (`Act::Half`, decoded NVFP4
// or copied 16-bit, fallback/stage.cuh), the MMA's input type (`Act::BF16`) and how many K-tiles
// are in flight (`Act::PF`). The weights are NVFP4 staged in that type. DUAL: a second weight and
// the SwiGLU epilogue; MOE: one problem in the MoE form (fallback/moe.cuh).
#pragma once

#include "ptx.cuh"
#include "output.cuh"
#include "generated.cuh"
#include "fallback/stage.cuh"
#include "fallback/moe.cuh"

namespace fb {

using mma::BM;
using mma::BN;

// Where a CTA's output tile lies: batch l of A and the output, batch lb of the weights, first row
// m0 and column n0, and the end of its problem's rows (rows of A's batch l).
struct Span {
  int l, lb, m0, n0, row_end;
};

// The problem of this CTA in a list of `count` problems (the grouped GEMM's groups) laid out one
// after another in the grid: a linear scan of their first CTAs.
NVFP4_DEVICE int list_problem(const MmaProblem* problems, int count) {
  int g = 0;
  while (g + 1 < count && problems[g + 1].tile_start <= (int)blockIdx.x) ++g;
  return g;
}

// The tile of this CTA in problem P of a list, whose tiles run over its L batches.
NVFP4_DEVICE Span list_tile(const MmaProblem& P) {
  const int local = blockIdx.x - P.tile_start;
  const int per_batch = P.tiles_m * P.tiles_n;
  const int l = local / per_batch;
  return Span{l, l, (local % per_batch) / P.tiles_n * BM, local % P.tiles_n * BN, P.m};
}

// acc[mi][ni] += A[32 x 16] * B[16 x 32] for this warp's sub-tile at K offset k0 of the tile.
template <bool BF16>
NVFP4_DEVICE void mma_k16(const u16* As, const u16* Bs, int wm, int wn, int k0, float (*acc)[4][4]) {
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
    for (int ni = 0; ni < 4; ++ni) ptx::mma_m16n8k16_f32<BF16>(acc[mi][ni], a[mi], b[ni]);
}

// An f32 sum of staged products as the sum of the operands' values, in f64: times W::UNBIAS, a
// power of two (exact).
template <class W>
NVFP4_DEVICE double unbiased(float sum) {
  if constexpr (W::UNBIAS == 1.0)
    return sum;
  else
    return (double)sum * W::UNBIAS;
}

// The MoE form's factor of expert e from its per-expert alphas: (alphas[e] * global(a)) *
// global(b) in f32, the reference's order (round to nearest, no contraction).
NVFP4_DEVICE double moe_alpha(const MmaProblem& P, int e) {
  return (double)__fmul_rn(__fmul_rn(__uint_as_float(ptx::ld_nc_u32(P.alphas + e)), P.global[0]), P.global[1]);
}

template <class Act, bool DUAL, bool MOE>
__device__ void gemm_body(const MmaProblem* problems, int count) {
  static_assert(!(MOE && DUAL), "the MoE form is a GEMM");
  constexpr bool BF16 = Act::BF16;
  constexpr int PF = Act::PF;
  using W = Nvfp4Half<BF16>;
  __shared__ __align__(16) u16 As[BM * LDS];  // [64, BK] 16-bit, padded rows
  __shared__ __align__(16) u16 Bs[BN * LDS];  // [64, BK] 16-bit, rows are N (K-major)
  __shared__ __align__(16) u16 B2s[DUAL ? BN * LDS : 8];

  const MmaProblem& P = problems[MOE ? 0 : list_problem(problems, count)];
  Span s;
  if constexpr (MOE) {
    const MoeTile t = moe_tile(P.offsets, P.experts, P.m, blockIdx.x / P.tiles_n);
    if (t.expert < 0) return;  // uniform over the CTA: a slot past the experts' tiles
    s = Span{0, t.expert, t.m0, (int)(blockIdx.x % P.tiles_n) * BN, t.end};
  } else {
    s = list_tile(P);
  }
  const int warp = threadIdx.x / 32, wm = warp / 2, wn = warp % 2;

  float acc[2][4][4] = {};
  float acc2[DUAL ? 2 : 1][4][4] = {};
  const int ktiles = (P.k + BK - 1) / BK;
  const int ra = s.m0 + threadIdx.x / 2, rb = s.n0 + threadIdx.x / 2;  // this thread's rows
  const bool blb = P.layouts & 2, blb2 = P.layouts & 4;
  typename Act::Half xa[PF];
  W xb[PF], xb2[DUAL ? PF : 1];
#pragma unroll
  for (int j = 0; j < PF; ++j)
    if (j < ktiles) {
      xa[j] = Act::load(P, s, ra, j);
      xb[j].load(P.b, P.sfb, blb, P.n, P.k, s.lb, rb, j);
      if (DUAL) xb2[DUAL ? j : 0].load(P.b2, P.sfb2, blb2, P.n, P.k, s.lb, rb, j);
    }
  // NOTE: PF K-tiles per outer step with the slot index a compile-time constant (a runtime index
  // into the register arrays would put them in local memory).
  for (int kt0 = 0; kt0 < ktiles; kt0 += PF) {
#pragma unroll
    for (int j = 0; j < PF; ++j) {
      const int kt = kt0 + j;
      if (kt >= ktiles) break;  // uniform over the CTA
      __syncthreads();          // the previous K-tile's fragments are read
      xa[j].store(As);
      xb[j].store(Bs);
      if (DUAL) xb2[DUAL ? j : 0].store(B2s);
      if (kt + PF < ktiles) {
        xa[j] = Act::load(P, s, ra, kt + PF);
        xb[j].load(P.b, P.sfb, blb, P.n, P.k, s.lb, rb, kt + PF);
        if (DUAL) xb2[DUAL ? j : 0].load(P.b2, P.sfb2, blb2, P.n, P.k, s.lb, rb, kt + PF);
      }
      __syncthreads();
#pragma unroll
      for (int k0 = 0; k0 < BK; k0 += 16) {
        mma_k16<BF16>(As, Bs, wm, wn, k0, acc);
        if (DUAL) mma_k16<BF16>(As, B2s, wm, wn, k0, acc2);
      }
    }
  }

  // Epilogue: fragment element e of acc[mi][ni] is row g (+8 for e >= 2), column 2t + e % 2.
  // The sums unbiased, times alpha (the MoE form's expert's own, where it has per-expert alphas),
  // rounded once.
  // NOTE: the per-expert factor is its own branch, so that the other kernels keep their code.
  const int lane = threadIdx.x % 32;
  const bool per_expert = MOE && P.alphas != nullptr;
  const double expert_alpha = per_expert ? moe_alpha(P, s.lb) : 0.0;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = s.m0 + wm * 32 + mi * 16 + lane / 4 + (e / 2) * 8;
        const int col = s.n0 + wn * 32 + ni * 8 + 2 * (lane % 4) + e % 2;
        if (row >= s.row_end || col >= P.n) continue;
        u16 bits;
        if (DUAL) {
          const float x1 = (float)(unbiased<W>(acc[mi][ni][e]) * P.alpha);
          const float x2 = (float)(unbiased<W>(acc2[DUAL ? mi : 0][ni][e]) * P.alpha2);
          bits = out::of_f32(out::silu(x1) * x2, P.out_bf16);
        } else if (per_expert) {
          bits = out::of_f64(unbiased<W>(acc[mi][ni][e]) * expert_alpha, P.out_bf16);
        } else {
          bits = out::of_f64(unbiased<W>(acc[mi][ni][e]) * P.alpha, P.out_bf16);
        }
        P.c[((i64)s.l * P.m + row) * P.n + col] = bits;
      }
}

}  // namespace fb
