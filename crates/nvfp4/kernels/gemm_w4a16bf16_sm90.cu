// gemm_w4a16bf16_sm90.cu: the W4A16 GEMM on Hopper tensor cores (SPEC §8), c = A·Bᵀ with A a bf16
// activation [L, M, K] and B NVFP4 weights (gemm_w4a16f16_sm90.cu: the same for f16 A; one module
// per type, so that a call compiles only its type's kernels): the GEMM skeleton (sm90/kernel.cuh)
// with X = A, loaded by TMA straight from the activation tensor (one launch, no pre-pass), W = B
// always, decoded in registers to A's type (sm90/mainloop16.cuh), and the store with alpha (the
// weight's global scale, the caller's alpha and the 2^14 decode bias) to f16 or bf16.
//
// Launched as a programmatic dependent of the previous launch (a graph of launches), the W
// producer streams weights at once (no kernel writes them), the X producer executes
// ptx::wait_prerequisites() (sm90/producer.cuh) before its first activation load, and the
// consumers write the output, the split-K partials and counters only after consuming that load.
#include "sm90/kernel.cuh"

// Variants gemm_w4a16bf16_sm90_ws_m{BM}n{BN}, one per tile of the variant list (generated.cuh):
// the host picks one per problem (backend/cuda/sm90/).
#define GEMM16_BF16(BM, BN) NVFP4_SM90_KERNEL16(gemm, bf16, 1, sm90::SingleProblem, sm90::StoreF16, BM, BN)
NVFP4_SM90_VARIANTS(GEMM16_BF16)
