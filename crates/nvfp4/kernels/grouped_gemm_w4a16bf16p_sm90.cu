// grouped_gemm_w4a16bf16p_sm90.cu: the W4A16 grouped GEMM of grouped_gemm_w4a16bf16_sm90.cu (list
// and MoE forms) with every weight in its packed form (format/w16_pack.rs): the same table
// builder and scheduler, W stages one bulk copy per 64-row group, sm90/mainloop_packed.cuh.
#include "sm90/kernel.cuh"
// The first kernel, grouped_table_sm90, builds the work table.
#include "sm90/grouped_table.cuh"

// Variants grouped_gemm_w4a16bf16p_sm90_ws_m{BM}n{BN}, one per tile of the variant list.
#define GROUPED16P_BF16(BM, BN) NVFP4_SM90_KERNEL16P(grouped_gemm, bf16, 1, sm90::Grouped, sm90::StoreF16ByBatch, BM, BN)
NVFP4_SM90_VARIANTS(GROUPED16P_BF16)
