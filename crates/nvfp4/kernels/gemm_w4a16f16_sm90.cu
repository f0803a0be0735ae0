// gemm_w4a16f16_sm90.cu: the W4A16 GEMM for f16 activations, gemm_w4a16bf16_sm90.cu's kernels
// (and its programmatic dependent launch: the X producer's ptx::wait_prerequisites()) with A in
// f16.
#include "sm90/kernel.cuh"

// Variants gemm_w4a16f16_sm90_ws_m{BM}n{BN}, one per tile of the variant list (generated.cuh).
#define GEMM16_F16(BM, BN) NVFP4_SM90_KERNEL16(gemm, f16, 1, sm90::SingleProblem, sm90::StoreF16, BM, BN)
NVFP4_SM90_VARIANTS(GEMM16_F16)
