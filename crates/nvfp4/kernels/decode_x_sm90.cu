// decode_x_sm90.cu: the X pre-pass of the Hopper GEMM skeleton (sm90/kernel.cuh): NVFP4 -> f16,
// once per launch, in the k order the consumers take W's elements in (sm90/decode_x.cuh).
#include "sm90/decode_x.cuh"

// One thread per 16-byte output chunk.
extern "C" __global__ void __launch_bounds__(sm90::DECODE_X_THREADS)
    decode_nvfp4_f16_sm90(const __grid_constant__ XDecodeParams p) {
  ptx::launch_dependents();  // the GEMM may start its setup and W loads now
  sm90::decode_x_chunk(p, blockIdx.x * blockDim.x + threadIdx.x);
}
