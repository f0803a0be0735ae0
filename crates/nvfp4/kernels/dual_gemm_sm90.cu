// dual_gemm_sm90.cu: the gated dual GEMM (SwiGLU, SPEC §3.3), c = f16(silu(A·B1ᵀ) * (A·B2ᵀ)), in
// one launch of the GEMM skeleton (sm90/kernel.cuh) after one X pre-pass.
//
// W = B1 and B2 together, X = A: the pre-pass decodes A once and both products share it. Each
// W tile holds PART_ROWS rows of B1 and the matching PART_ROWS rows of B2 (two TMA boxes), and a
// consumer thread's two fragment rows are the same output column of both products (see
// sm90/mainloop.cuh), so x1 and x2 of every output element meet in one thread's accumulators
// and the SwiGLU epilogue computes silu(x1) * x2 in f32 and rounds once. K pieces (split-K,
// stream-K) are summed before the gate, as for the GEMM.
#include "sm90/kernel.cuh"

// Variants dual_gemm_nvfp4_sm90_ws_m{BM}n{BN}, one per tile of the variant list (generated.cuh): a
// tile of BM / 2 output columns (rows of B1, B2) by BN rows of A; the host picks one per problem
// (backend/cuda/sm90/).
#define DUAL_VARIANT(BM, BN) NVFP4_SM90_KERNEL(dual_gemm, 2, sm90::SingleProblem, sm90::SwiGLU, BM, BN)
NVFP4_SM90_VARIANTS(DUAL_VARIANT)
