// grouped_gemm_sm90.cu: the grouped GEMM (SPEC §3.4, and its MoE form) on the Hopper GEMM
// skeleton: one pre-pass launch and one persistent launch for all groups.
//
// The pre-pass decodes every group's X (block 1 on) and builds the work table (block 0) that the
// main kernel walks (sm90/grouped.cuh). The main kernel is the GEMM's instantiation with the
// grouped scheduler: each work unit names its group's problem (tensor maps, scale mode, alpha,
// output), kept in device memory and written once when the groups are bound. A MoE launch with
// per-expert alphas scales each unit by its expert's, read from the device by the store
// (sm90/epilogue.cuh, StoreF16ByBatch).
#include "sm90/kernel.cuh"
#include "sm90/grouped.cuh"
#include "sm90/decode_x.cuh"

extern "C" __global__ void __launch_bounds__(sm90::BUILD_THREADS)
    grouped_prepare_sm90(const __grid_constant__ GroupedPrepParams p) {
  static_assert(sm90::BUILD_THREADS == sm90::DECODE_X_THREADS, "one block shape for both jobs");
  ptx::launch_dependents();  // the main kernel may start its setup; it waits for the table
  if (blockIdx.x == 0) {
    sm90::build_units<sm90::BUILD_THREADS>(p.build);
    return;
  }
  // The operand this block decodes: the last one whose blocks start at or before it.
  const i32 b = (i32)blockIdx.x - 1;
  i32 lo = 0, hi = p.decodes - 1;
  while (lo < hi) {
    const i32 mid = (lo + hi + 1) / 2;
    if (p.decode[mid].block0 <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  const XDecodeParams d = p.decode[lo];
  sm90::decode_x_chunk(d, (b - d.block0) * (i32)blockDim.x + (i32)threadIdx.x);
}

// Variants grouped_gemm_nvfp4_sm90_ws_m{BM}n{BN}, one per tile of the variant list (generated.cuh):
// the host picks one per launch.
#define GROUPED_VARIANT(BM, BN) NVFP4_SM90_KERNEL(grouped_gemm, 1, sm90::Grouped, sm90::StoreF16ByBatch, BM, BN)
NVFP4_SM90_VARIANTS(GROUPED_VARIANT)
