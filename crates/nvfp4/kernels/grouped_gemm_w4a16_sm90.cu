// grouped_gemm_w4a16_sm90.cu: the W4A16 grouped GEMM (SPEC §8 and §3.4, list and MoE forms) on
// the Hopper GEMM skeleton: each group's problem names its own activation tensor (a tensor map
// per group; the MoE form's tokens are one tensor), loaded by TMA as it is, so nothing is
// decoded before the main kernel. The work table is built by one block (sm90/grouped.cuh's
// builder) launched before the persistent main kernel, as for grouped_gemm_sm90.cu.
#include "sm90/kernel.cuh"
#include "sm90/grouped.cuh"

// The work table (one block of BUILD_THREADS threads).
extern "C" __global__ void __launch_bounds__(sm90::BUILD_THREADS)
    grouped_table_sm90(const __grid_constant__ GroupedBuild b) {
  ptx::launch_dependents();  // the main kernel may start its setup; it waits for the table
  sm90::build_units(b);
}

// Variants grouped_gemm_w4a16{bf16,f16}_sm90_ws_m{BM}n{BN}, one per tile of the variant list
// (generated.cuh), bf16 first: the host picks one per launch.
#define GROUPED16_BF16(BM, BN) NVFP4_SM90_KERNEL16(grouped_gemm, bf16, 1, sm90::Grouped, sm90::StoreF16, BM, BN)
#define GROUPED16_F16(BM, BN) NVFP4_SM90_KERNEL16(grouped_gemm, f16, 1, sm90::Grouped, sm90::StoreF16, BM, BN)
NVFP4_SM90_VARIANTS(GROUPED16_BF16)
NVFP4_SM90_VARIANTS(GROUPED16_F16)
