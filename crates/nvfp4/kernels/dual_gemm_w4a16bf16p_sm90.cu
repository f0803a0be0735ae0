// dual_gemm_w4a16bf16p_sm90.cu: the fused W4A16 dual GEMM of dual_gemm_w4a16bf16_sm90.cu with B1 and
// B2 packed together (format/w16_pack.rs: rows interleaved by 8, one packed operand): the same
// skeleton and SwiGLU epilogue, W stages one bulk copy per 64 packed rows, sm90/mainloop_packed.cuh.
#include "sm90/kernel.cuh"

// Variants dual_gemm_w4a16bf16p_sm90_ws_m{BM}n{BN}, one per tile of the variant list.
#define DUAL16P_BF16(BM, BN) NVFP4_SM90_KERNEL16P(dual_gemm, bf16, 2, sm90::SingleProblem, sm90::SwiGLU, BM, BN)
NVFP4_SM90_VARIANTS(DUAL16P_BF16)
