// dual_gemm_w4a16f16_sm90.cu: the W4A16 dual GEMM for f16 activations, dual_gemm_w4a16bf16_sm90.cu's
// kernels (and its programmatic dependent launch: the X producer's ptx::wait_prerequisites())
// with A in f16.
#include "sm90/kernel.cuh"

// Variants dual_gemm_w4a16f16_sm90_ws_m{BM}n{BN}, one per tile of the variant list
// (generated.cuh; those in W16_SKIP_dual_gemm trap, and no plan picks them).
#define DUAL16_F16(BM, BN) NVFP4_SM90_KERNEL16(dual_gemm, f16, 2, sm90::SingleProblem, sm90::SwiGLU, BM, BN)
NVFP4_SM90_VARIANTS(DUAL16_F16)
