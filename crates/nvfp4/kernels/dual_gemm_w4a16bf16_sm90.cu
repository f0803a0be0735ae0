// dual_gemm_w4a16bf16_sm90.cu: the W4A16 gated dual GEMM (SwiGLU, SPEC §8 and §3.3), c =
// silu(A·B1ᵀ) * (A·B2ᵀ) with A a bf16 activation and B1, B2 NVFP4 weights
// (dual_gemm_w4a16f16_sm90.cu: f16 A), in one launch of the GEMM skeleton (sm90/kernel.cuh): W =
// B1 and B2 together (dual_gemm_sm90.cu's tile and row mapping), X = A by TMA straight from the
// activation tensor, shared by both products. Programmatic dependent launch: as
// gemm_w4a16bf16_sm90.cu (only weights are read before the X producer's
// ptx::wait_prerequisites()).
#include "sm90/kernel.cuh"

// Variants dual_gemm_w4a16bf16_sm90_ws_m{BM}n{BN}, one per tile of the variant list
// (generated.cuh; those in W16_SKIP_dual_gemm trap, and no plan picks them).
#define DUAL16_BF16(BM, BN) NVFP4_SM90_KERNEL16(dual_gemm, bf16, 2, sm90::SingleProblem, sm90::SwiGLU, BM, BN)
NVFP4_SM90_VARIANTS(DUAL16_BF16)
