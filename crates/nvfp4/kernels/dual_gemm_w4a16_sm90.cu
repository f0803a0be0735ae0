// dual_gemm_w4a16_sm90.cu: the W4A16 gated dual GEMM (SwiGLU, SPEC §8 and §3.3), c =
// silu(A·B1ᵀ) * (A·B2ᵀ) with A a bf16 or f16 activation and B1, B2 NVFP4 weights, in one launch
// of the GEMM skeleton (sm90/kernel.cuh): W = B1 and B2 together (dual_gemm_sm90.cu's tile and
// row mapping), X = A by TMA straight from the activation tensor, shared by both products.
// Programmatic dependent launch: as gemm_w4a16_sm90.cu (only weights are read before the X
// producer's ptx::wait_prerequisites()).
#include "sm90/kernel.cuh"

// Variants dual_gemm_w4a16{bf16,f16}_sm90_ws_m{BM}n{BN}, one per tile of the variant list
// (generated.cuh), bf16 first.
#define DUAL16_BF16(BM, BN) NVFP4_SM90_KERNEL16(dual_gemm, bf16, 2, sm90::SingleProblem, sm90::SwiGLU, BM, BN)
#define DUAL16_F16(BM, BN) NVFP4_SM90_KERNEL16(dual_gemm, f16, 2, sm90::SingleProblem, sm90::SwiGLU, BM, BN)
NVFP4_SM90_VARIANTS(DUAL16_BF16)
NVFP4_SM90_VARIANTS(DUAL16_F16)
