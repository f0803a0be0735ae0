// gemm_fallback_w4a16.cu: the mma.sync fallback (gemm_fallback.cu has its algorithm) for W4A16
// (SPEC §8): A a dense bf16 or f16 activation [L, M, K] (K-major), copied into the shared tile
// as it is (rows past M and elements past K zero), the NVFP4 weights decoded into A's type
// (fallback/stage.cuh: exact in both), bf16 or f16 mma.sync m16n8k16 with f32 accumulators. For
// what the skeleton declines (K % 32 != 0, K < 64, its indexing limits) with more than one
// activation row, or when forced off. Alpha is the weight's global scale times the caller's.
// Kernels per activation type T (bf16, f16):
//   gemm_w4a16T_sm90_mma          GEMM and the grouped GEMM's list (`count` problems, one grid);
//   dual_gemm_w4a16T_sm90_mma     gated dual GEMM;
//   grouped_gemm_w4a16T_sm90_mma  the grouped GEMM's MoE form, its offsets read on the device
//                                 (fallback/moe.cuh): one problem, tokens [1, T, K], experts
//                                 [E, N, K/2], output [1, T, N] (rows past the last offset
//                                 unwritten).
// A 16-bit K-tile half is 16 registers against NVFP4's 6, so PF16 (< PF) K-tiles are in flight.
#include "fallback/body.cuh"

namespace {

template <bool BF16_>
struct ActDense {
  static constexpr bool BF16 = BF16_;
  static constexpr int PF = mma::PF16;
  using Half = fb::DenseHalf;
  static __device__ __forceinline__ Half load(const MmaProblem& P, const fb::Span& s, int row, int kt) {
    Half h;
    const u16* a = reinterpret_cast<const u16*>(P.a) + ((i64)s.l * P.m + row) * P.k;
    h.load(a, row < s.row_end, P.k, kt);
    return h;
  }
};

}  // namespace

// NOTE: the MoE kernels say 1 CTA per SM at least (the plain bound is the same 128 threads): with
// the plain bound ptxas held them to 128 registers and spilled; so they take 160, as the GEMM.

// bf16 activations.
extern "C" __global__ void __launch_bounds__(mma::THREADS)
    gemm_w4a16bf16_sm90_mma(const __grid_constant__ MmaParams p) {
  fb::gemm_body<ActDense<true>, false, false>(p.count == 1 ? &p.one : p.problems, p.count);
}
extern "C" __global__ void __launch_bounds__(mma::THREADS)
    dual_gemm_w4a16bf16_sm90_mma(const __grid_constant__ MmaParams p) {
  fb::gemm_body<ActDense<true>, true, false>(p.count == 1 ? &p.one : p.problems, p.count);
}
extern "C" __global__ void __launch_bounds__(mma::THREADS, 1)
    grouped_gemm_w4a16bf16_sm90_mma(const __grid_constant__ MmaParams p) {
  fb::gemm_body<ActDense<true>, false, true>(&p.one, 1);
}

// f16 activations.
extern "C" __global__ void __launch_bounds__(mma::THREADS)
    gemm_w4a16f16_sm90_mma(const __grid_constant__ MmaParams p) {
  fb::gemm_body<ActDense<false>, false, false>(p.count == 1 ? &p.one : p.problems, p.count);
}
extern "C" __global__ void __launch_bounds__(mma::THREADS)
    dual_gemm_w4a16f16_sm90_mma(const __grid_constant__ MmaParams p) {
  fb::gemm_body<ActDense<false>, true, false>(p.count == 1 ? &p.one : p.problems, p.count);
}
extern "C" __global__ void __launch_bounds__(mma::THREADS, 1)
    grouped_gemm_w4a16f16_sm90_mma(const __grid_constant__ MmaParams p) {
  fb::gemm_body<ActDense<false>, false, true>(&p.one, 1);
}
