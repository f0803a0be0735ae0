// gemm_sm90.cu: NVFP4 x NVFP4 GEMM on Hopper tensor cores (SPEC §3.2), c = A·Bᵀ, f16 out: the GEMM
// skeleton (sm90/kernel.cuh) with one W operand, one problem and the f16 store with alpha.
//
// The host picks which GEMM operand plays W: for small M, W = B (the big weight matrix runs on
// the wgmma M side, 64 rows per instruction) and X = A (the few tokens are the wgmma N side); for
// large M, W = A and X = B. The kernel stores D[w, x] at c[l * c_stride_l + w * c_stride_w +
// x * c_stride_x], so either orientation writes c = A·Bᵀ. X was decoded by decode_x_sm90.cu.
//
// Work units: (W tile, X tile, batch, K slice). With split > 1 every slice writes its f32
// partial tile to the workspace; the last slice to arrive sums the slices in slice order
// (deterministic), stores, and resets the counter for the next launch.
#include "sm90/kernel.cuh"

// Variants gemm_nvfp4_sm90_ws_m{BM}n{BN}, one per tile of the variant list (generated.cuh): the host
// picks one per problem (backend/cuda/sm90/).
#define GEMM_VARIANT(BM, BN) NVFP4_SM90_KERNEL(gemm, 1, sm90::SingleProblem, sm90::StoreF16, BM, BN)
NVFP4_SM90_VARIANTS(GEMM_VARIANT)
