// grouped_gemm_w4a16bf16_sm90.cu: the W4A16 grouped GEMM (SPEC §8 and §3.4, list and MoE forms) for
// bf16 activations (grouped_gemm_w4a16f16_sm90.cu: f16) on the Hopper GEMM skeleton: each group's
// problem names its own activation tensor (a tensor map per group; the MoE form's tokens are one
// tensor), loaded by TMA as it is, so nothing is decoded before the main kernel. The work table
// is built by one block (sm90/grouped.cuh's builder) launched before the persistent main kernel,
// as for grouped_gemm_sm90.cu (sm90/grouped_table.cuh). The store scales a MoE unit by its
// expert's alpha where the launch has per-expert alphas (sm90/epilogue.cuh, StoreF16ByBatch).
#include "sm90/kernel.cuh"
// The first kernel, grouped_table_sm90, builds the work table.
#include "sm90/grouped_table.cuh"

// Variants grouped_gemm_w4a16bf16_sm90_ws_m{BM}n{BN}, one per tile of the variant list
// (generated.cuh): the host picks one per launch.
#define GROUPED16_BF16(BM, BN) NVFP4_SM90_KERNEL16(grouped_gemm, bf16, 1, sm90::Grouped, sm90::StoreF16ByBatch, BM, BN)
NVFP4_SM90_VARIANTS(GROUPED16_BF16)
