// gemm_w4a16bf16p_sm90.cu: the W4A16 GEMM of gemm_w4a16bf16_sm90.cu with the weight in its packed
// form (format/w16_pack.rs): the same skeleton, its W stages one bulk copy per 64-row group and
// its mainloop sm90/mainloop_packed.cuh. The host launches it when the weight's view carries a
// packed form for bf16 activations.
#include "sm90/kernel.cuh"

// Variants gemm_w4a16bf16p_sm90_ws_m{BM}n{BN}, one per tile of the variant list (generated.cuh).
#define GEMM16P_BF16(BM, BN) NVFP4_SM90_KERNEL16P(gemm, bf16, 1, sm90::SingleProblem, sm90::StoreF16, BM, BN)
NVFP4_SM90_VARIANTS(GEMM16P_BF16)
