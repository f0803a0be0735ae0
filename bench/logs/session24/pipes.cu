// Issue rate of the instructions the packed W4A16 decode is made of, on one SM sub-partition:
// cycles per warp instruction when every warp scheduler has many independent ones of that kind
// (8 chains per thread, 16 warps per SM). Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90a -o /tmp/pipes bench/logs/session24/pipes.cu && /tmp/pipes
// Each kernel times its loop with clock64 on every warp; the figure is the median warp's cycles
// divided by the instructions each scheduler issued in that time (4 warps per scheduler).
#ifndef __CUDACC_RTC__
#include <cstdio>
#include <cstdint>
#include <algorithm>
#include <vector>
#else
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#endif

constexpr int CHAINS = 8, UNROLL = 16, ITERS = 2048, THREADS = 512;

#define BODY(OP)                                                                   \
  _Pragma("unroll") for (int u = 0; u < UNROLL; ++u) {                             \
    _Pragma("unroll") for (int c = 0; c < CHAINS; ++c) { OP; }                     \
  }

// One kernel per instruction kind; x[c] are the chains, y and z operands ptxas cannot fold.
#define KERNEL(NAME, OPS_PER_STEP, OP)                                             \
  extern "C" __global__ void NAME(const uint32_t* in, uint32_t* out, long long* cyc) {        \
    uint32_t x[CHAINS];                                                            \
    uint64_t d[CHAINS];                                                            \
    const uint32_t y = in[threadIdx.x % 32], z = in[32 + threadIdx.x % 32];  \
    (void)z;        \
    for (int c = 0; c < CHAINS; ++c) { x[c] = in[64 + c] ^ threadIdx.x; d[c] = x[c]; } \
    __syncthreads();                                                               \
    const long long t0 = clock64();                                                \
    for (int i = 0; i < ITERS; ++i) { BODY(OP) }                                   \
    const long long t1 = clock64();                                                \
    uint32_t acc = 0;                                                              \
    for (int c = 0; c < CHAINS; ++c) acc ^= x[c] ^ (uint32_t)d[c] ^ (uint32_t)(d[c] >> 32); \
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;                              \
    if (threadIdx.x % 32 == 0) cyc[blockIdx.x * (THREADS / 32) + threadIdx.x / 32] = t1 - t0; \
  }

KERNEL(k_lop3, 1, asm volatile("lop3.b32 %0, %0, %1, %2, 0x96;" : "+r"(x[c]) : "r"(y), "r"(z)))
KERNEL(k_and_imm, 1, asm volatile("lop3.b32 %0, %0, 0x81c081c0, %1, 0x6a;" : "+r"(x[c]) : "r"(y)))
KERNEL(k_rot, 1, asm volatile("shf.l.wrap.b32 %0, %1, %0, 4;" : "+r"(x[c]) : "r"(y)))
KERNEL(k_imad, 1, asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(x[c]) : "r"(y), "r"(z)))
KERNEL(k_imad_wide, 1, asm volatile("{\n .reg .b32 lo, hi;\n mov.b64 {lo, hi}, %0;\n mul.wide.u32 %0, lo, hi;\n}" : "+l"(d[c])))
KERNEL(k_hmul2_bf16, 1, asm volatile("mul.rn.bf16x2 %0, %0, %1;" : "+r"(x[c]) : "r"(y)))
KERNEL(k_hmul2_f16, 1, asm volatile("mul.rn.f16x2 %0, %0, %1;" : "+r"(x[c]) : "r"(y)))
KERNEL(k_prmt, 1, asm volatile("prmt.b32 %0, %0, %1, 0x3210;" : "+r"(x[c]) : "r"(y)))
KERNEL(k_iadd3, 1, asm volatile("add.u32 %0, %0, %1;" : "+r"(x[c]) : "r"(y)))
// Mixes: do two kinds issue on separate pipes at once?
KERNEL(k_lop3_hmul2, 1,
       if (c % 2) asm volatile("lop3.b32 %0, %0, %1, %2, 0x96;" : "+r"(x[c]) : "r"(y), "r"(z));
       else asm volatile("mul.rn.bf16x2 %0, %0, %1;" : "+r"(x[c]) : "r"(y)))
KERNEL(k_lop3_imad, 1,
       if (c % 2) asm volatile("lop3.b32 %0, %0, %1, %2, 0x96;" : "+r"(x[c]) : "r"(y), "r"(z));
       else asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(x[c]) : "r"(y), "r"(z)))
KERNEL(k_lop3_rot, 1,
       if (c % 2) asm volatile("lop3.b32 %0, %0, %1, %2, 0x96;" : "+r"(x[c]) : "r"(y), "r"(z));
       else asm volatile("shf.l.wrap.b32 %0, %1, %0, 4;" : "+r"(x[c]) : "r"(y)))

#ifndef __CUDACC_RTC__
typedef void (*Kern)(const uint32_t*, uint32_t*, long long*);

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  uint32_t *in, *out;
  long long* cyc;
  cudaMalloc(&in, 256 * 4);
  cudaMalloc(&out, (size_t)sms * THREADS * 4);
  cudaMalloc(&cyc, (size_t)sms * THREADS / 32 * 8);
  std::vector<uint32_t> h(256);
  for (int i = 0; i < 256; ++i) h[i] = 0x3f803f80u + 0x10001u * (i % 7);  // bf16 pairs near 1
  cudaMemcpy(in, h.data(), 256 * 4, cudaMemcpyHostToDevice);
  struct K { const char* name; Kern k; };
  K ks[] = {{"lop3 (3 registers)", k_lop3}, {"lop3 immediate", k_and_imm}, {"shf.l.wrap (rotate)", k_rot},
            {"mad.lo.u32", k_imad}, {"mad.wide.u32", k_imad_wide},
            {"mul.bf16x2", k_hmul2_bf16}, {"mul.f16x2", k_hmul2_f16}, {"prmt", k_prmt}, {"add.u32", k_iadd3}, {"lop3 + mul.bf16x2", k_lop3_hmul2},
            {"lop3 + mad.lo", k_lop3_imad}, {"lop3 + rotate", k_lop3_rot}};
  const double per_sched = (double)ITERS * UNROLL * CHAINS * (THREADS / 32) / 4;  // warp instrs per scheduler
  std::vector<long long> hc((size_t)sms * THREADS / 32);
  for (auto& k : ks) {
    for (int rep = 0; rep < 2; ++rep) k.k<<<sms, THREADS>>>(in, out, cyc);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) { printf("%s: %s\n", k.name, cudaGetErrorString(e)); return 1; }
    cudaMemcpy(hc.data(), cyc, hc.size() * 8, cudaMemcpyDeviceToHost);
    std::sort(hc.begin(), hc.end());
    const double med = (double)hc[hc.size() / 2];
    printf("%-22s %6.2f cycles per warp instruction per scheduler\n", k.name, med / per_sched);
  }
  return 0;
}
#endif
