// grouped_gemm_w4a16f16_sm90.cu: the W4A16 grouped GEMM for f16 activations,
// grouped_gemm_w4a16bf16_sm90.cu's table builder and kernels with A in f16.
#include "sm90/kernel.cuh"
// The first kernel, grouped_table_sm90, builds the work table.
#include "sm90/grouped_table.cuh"

// Variants grouped_gemm_w4a16f16_sm90_ws_m{BM}n{BN}, one per tile of the variant list
// (generated.cuh).
#define GROUPED16_F16(BM, BN) NVFP4_SM90_KERNEL16(grouped_gemm, f16, 1, sm90::Grouped, sm90::StoreF16ByBatch, BM, BN)
NVFP4_SM90_VARIANTS(GROUPED16_F16)
