// decode_x_sm90.cu: the X pre-pass of the Hopper GEMM skeleton (sm90/kernel.cuh): NVFP4 -> f16,
// once per launch, in the k order the consumers take W's elements in (sm90/decode_x.cuh).
#include "sm90/decode_x.cuh"
#include "sm90/prefetch_w.cuh"

// One thread per 16-byte output chunk.
extern "C" __global__ void __launch_bounds__(sm90::DECODE_X_THREADS)
    decode_nvfp4_f16_sm90(const __grid_constant__ DecodeXParams p) {
  ptx::launch_dependents();  // the GEMM may start its setup and W loads now
  const i32 idx = blockIdx.x * blockDim.x + threadIdx.x;
  sm90::prefetch_first_w(p.w, idx, gridDim.x * blockDim.x);
  // Launched as a programmatic dependent of the previous launch on the stream (a graph of
  // launches), X and this pre-pass's output are that launch's to read until it completes.
  // Without that launch attribute this returns at once.
  ptx::wait_prerequisites();
  sm90::decode_x_chunk(p.x, idx);
}
