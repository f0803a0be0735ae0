// gemm_fallback.cu: simple, correct NVFP4 GEMM, gated dual GEMM and grouped GEMM (SPEC §3.2-3.4)
// for what neither the skeleton nor the small GEMM (gemm_small.cu) takes (the skeleton's rules: K
// a multiple of 32 and at least 64, B1 and B2 in one layout, 32-bit indexing), or when forced
// (`NVFP4_GEMM_SM90=off`). gemm_fallback_w4a16.cu instantiates the same CTA for 16-bit
// activations (W4A16, SPEC §8).
// - One launch covers a list of problems (one for GEMM and dual GEMM, G for grouped GEMM): the
//   host flattens every problem's output tiles into one grid and each problem records the first
//   CTA of its tiles (`tile_start`); a CTA finds its problem by a linear scan.
// - A CTA computes a 64x64 output tile with 4 warps (2x2, 32x32 each) over K-tiles of 64
//   elements (4 scale blocks). Per K-tile it stages A and B (and B2) in shared memory as f16:
//   NVFP4 rows decoded, scale multiplied in (exact: every e2m1 * e4m3 product fits f16),
//   fallback/stage.cuh; then f16 mma.sync m16n8k16 with f32 accumulators (products of f16
//   values are exact in f32).
// - The raw bytes of the next PF K-tiles are in flight in registers while a K-tile is staged and
//   multiplied: a small problem pays one memory latency per PF K-tiles, not one per K-tile.
// - Epilogue: f64 alpha and a single rounding to f16 or bf16; dual GEMM: silu(x1) * x2 in f32,
//   with the skeleton's silu (output.cuh).
// - Any M, N >= 1, K % 16 == 0, either scale layout per operand, L batches (grid over l too).
// The CTA is fallback/body.cuh's, templated on the activation's policy; here A is NVFP4.
#include "fallback/body.cuh"

namespace {

// W4A4: A is NVFP4 like the weights, decoded to f16; PF K-tiles in flight.
struct ActNvfp4 {
  static constexpr bool BF16 = false;
  static constexpr int PF = mma::PF;
  using Half = fb::Nvfp4Half<false>;
  static __device__ __forceinline__ Half load(const MmaProblem& P, const fb::Span& s, int row, int kt) {
    Half h;
    h.load(P.a, P.sfa, P.layouts & 1, P.m, P.k, s.l, row, kt);
    return h;
  }
};

}  // namespace

// GEMM and grouped GEMM: `count` problems, all tiles in one grid.
extern "C" __global__ void __launch_bounds__(mma::THREADS) gemm_nvfp4_sm90_mma(const __grid_constant__ MmaParams p) {
  fb::gemm_body<ActNvfp4, false, false>(p.count == 1 ? &p.one : p.problems, p.count);
}

// Gated dual GEMM: silu(A * B1^T) * (A * B2^T), the A tile decoded once for both.
extern "C" __global__ void __launch_bounds__(mma::THREADS)
    dual_gemm_nvfp4_sm90_mma(const __grid_constant__ MmaParams p) {
  fb::gemm_body<ActNvfp4, true, false>(p.count == 1 ? &p.one : p.problems, p.count);
}
