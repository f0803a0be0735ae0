// quantize.cu: NVFP4 quantization on the GPU in the ModelOpt convention (SPEC §1), bit-identical
// to the CPU quantizer (format/quant.rs):
//   global = amax(x) / (6 * 448) (1 when amax is 0 or not finite), or a given global scale;
//   per 16-block: scale = e4m3(amax(block) / 6 / global), s = f32(scale) * global;
//   q = e2m1(x / s), nearest even, saturating at 6 (0 when s is 0 or not finite).
//
// Two kernels per input type (f32, f16, bf16):
// - quantize_amax_*: the tensor's amax as u32 bits (non-negative floats order as integers;
//   NaN is skipped, as f32::max does) with one atomicMax per warp, into a word zeroed before.
// - quantize_nvfp4_*: one thread per 16-block: 2 (16-bit) or 4 (f32) 16 B loads, 8 bytes of
//   packed values and one scale byte (plain or blocked layout, SPEC §2).
// Every rounding is spelled out (__fdiv_rn, __fmul_rn, rintf) so that no contraction or fast
// path makes the GPU differ from the CPU; e4m3 and e2m1 round to nearest even exactly as the
// CPU's nearest-code search does (a tie goes to the even code).
#include "ptx.cuh"

// QuantizeParams: declared in generated.cuh from its one definition (backend/cuda/kernels/quantize.rs).
#include "generated.cuh"

namespace {

constexpr int THREADS = 256;

// 16 consecutive inputs as f32 (exact for every input type). `p` is 16-byte aligned.
struct F32In {
  NVFP4_DEVICE static void load16(const void* p, float* v) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 w = ptx::ld_nc_v4((const u8*)p + 16 * i);
      v[4 * i + 0] = __uint_as_float(w.x);
      v[4 * i + 1] = __uint_as_float(w.y);
      v[4 * i + 2] = __uint_as_float(w.z);
      v[4 * i + 3] = __uint_as_float(w.w);
    }
  }
};
struct F16In {
  NVFP4_DEVICE static void load16(const void* p, float* v) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint4 w = ptx::ld_nc_v4((const u8*)p + 16 * i);
      ptx::f16x2_to_f32(w.x, v[8 * i + 0], v[8 * i + 1]);
      ptx::f16x2_to_f32(w.y, v[8 * i + 2], v[8 * i + 3]);
      ptx::f16x2_to_f32(w.z, v[8 * i + 4], v[8 * i + 5]);
      ptx::f16x2_to_f32(w.w, v[8 * i + 6], v[8 * i + 7]);
    }
  }
};
struct Bf16In {
  NVFP4_DEVICE static void pair(u32 w, float& lo, float& hi) {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xFFFF0000u);
  }
  NVFP4_DEVICE static void load16(const void* p, float* v) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint4 w = ptx::ld_nc_v4((const u8*)p + 16 * i);
      pair(w.x, v[8 * i + 0], v[8 * i + 1]);
      pair(w.y, v[8 * i + 2], v[8 * i + 3]);
      pair(w.z, v[8 * i + 4], v[8 * i + 5]);
      pair(w.w, v[8 * i + 6], v[8 * i + 7]);
    }
  }
};

// f32 -> E4M3 code, nearest even, saturating at 448, NaN -> 0x7F (format/e4m3.rs f32_to_e4m3).
NVFP4_DEVICE u32 e4m3_code(float x) {
  if (x != x) return 0x7F;
  const u32 sign = signbit(x) ? 0x80u : 0u;
  const float m = fabsf(x);
  if (m >= 448.0f) return sign | 0x7Eu;
  if (m < 0.015625f) return sign | (u32)rintf(__fmul_rn(m, 512.0f));  // subnormals: steps of 2^-9
  const int e = (int)((__float_as_uint(m) >> 23) & 0xFF) - 127;     // m = 1.f * 2^e, e in [-6, 8]
  const float q = rintf(__fmul_rn(m, __uint_as_float((u32)(127 + 3 - e) << 23)));  // in [8, 16]
  return sign | (u32)((e + 7) * 8 + (int)q - 8);  // q = 16 carries into the next exponent
}

// E4M3 code (never NaN here) -> f32, exact.
NVFP4_DEVICE float e4m3_value(u32 code) {
  const u32 e = (code >> 3) & 0xF, m = code & 7;
  const float mag = e == 0 ? __fmul_rn((float)m, 0.001953125f)  // m/8 * 2^-6
                           : __fmul_rn((float)(8 + m), __uint_as_float((e + 127 - 10) << 23));
  return (code & 0x80) ? -mag : mag;
}

// f32 -> E2M1 code, nearest even (a tie goes to the even code), saturating at 6, NaN -> 0
// (format/e2m1.rs f32_to_e2m1). Magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
NVFP4_DEVICE u32 e2m1_code(float x) {
  if (x != x) return 0;
  const u32 sign = signbit(x) ? 8u : 0u;
  const float m = fabsf(x);
  u32 c;
  if (m <= 0.25f) c = 0;
  else if (m < 0.75f) c = 1;
  else if (m <= 1.25f) c = 2;
  else if (m < 1.75f) c = 3;
  else if (m <= 2.5f) c = 4;
  else if (m < 3.5f) c = 5;
  else if (m <= 5.0f) c = 6;
  else c = 7;
  return sign | c;
}

// The global scale this launch uses (QuantizeParams::global_mode: 0 from the amax word, 1 the
// value in the params, 2 the f32 at global_in).
NVFP4_DEVICE float global_scale(const QuantizeParams& p) {
  if (p.global_mode == 1) return p.global_value;
  if (p.global_mode == 2) return *p.global_in;
  const float a = __uint_as_float(*(const volatile u32*)p.amax);
  return (a > 0.0f && isfinite(a)) ? __fdiv_rn(a, 2688.0f) : 1.0f;
}

// Byte offset of scale (row i of batch b, scale column j) in the blocked layout (SPEC §2).
NVFP4_DEVICE i64 blocked_offset(i64 i, i64 j, i64 b, i64 R, i64 C) {
  return b * (R * C * 512) + (i / 128) * (C * 512) + (j / 4) * 512 + (i % 32) * 16 + ((i % 128) / 32) * 4 + (j % 4);
}

template <class In, int BYTES>
NVFP4_DEVICE void amax_kernel(const QuantizeParams& p) {
  float m = 0.0f;
  const i64 stride = (i64)gridDim.x * THREADS;
  for (i64 b = (i64)blockIdx.x * THREADS + threadIdx.x; b < p.blocks; b += stride) {
    float v[16];
    In::load16((const u8*)p.x + b * 16 * BYTES, v);
#pragma unroll
    for (int i = 0; i < 16; ++i) m = fmaxf(m, fabsf(v[i]));  // fmaxf skips NaN, like f32::max
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  if (threadIdx.x % 32 == 0 && m > 0.0f) atomicMax(p.amax, __float_as_uint(m));
}

template <class In, int BYTES>
NVFP4_DEVICE void quantize_kernel(const QuantizeParams& p) {
  const i64 b = (i64)blockIdx.x * THREADS + threadIdx.x;
  if (b >= p.blocks) return;
  const float g = global_scale(p);
  if (b == 0) *p.global_out = g;
  float v[16];
  In::load16((const u8*)p.x + b * 16 * BYTES, v);
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(v[i]));
  const u32 sc = e4m3_code(__fdiv_rn(__fdiv_rn(amax, 6.0f), g));
  const float s = __fmul_rn(e4m3_value(sc), g);
  const bool ok = s > 0.0f && isfinite(s);
  u32 packed[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const u32 q = ok ? e2m1_code(__fdiv_rn(v[i], s)) : 0u;
    packed[i / 8] |= q << (4 * (i % 8));  // even k in the low nibble
  }
  *(uint2*)(p.values + b * 8) = make_uint2(packed[0], packed[1]);
  const i64 row = b / p.sf_cols, j = b % p.sf_cols;
  i64 off = b;
  if (p.blocked) {
    const i64 R = (p.rows + 127) / 128, C = (p.sf_cols + 3) / 4;
    off = blocked_offset(row % p.rows, j, row / p.rows, R, C);
  }
  p.scales[off] = (u8)sc;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS) quantize_amax_f32(const __grid_constant__ QuantizeParams p) {
  amax_kernel<F32In, 4>(p);
}
extern "C" __global__ void __launch_bounds__(THREADS) quantize_amax_f16(const __grid_constant__ QuantizeParams p) {
  amax_kernel<F16In, 2>(p);
}
extern "C" __global__ void __launch_bounds__(THREADS) quantize_amax_bf16(const __grid_constant__ QuantizeParams p) {
  amax_kernel<Bf16In, 2>(p);
}
extern "C" __global__ void __launch_bounds__(THREADS) quantize_nvfp4_f32(const __grid_constant__ QuantizeParams p) {
  quantize_kernel<F32In, 4>(p);
}
extern "C" __global__ void __launch_bounds__(THREADS) quantize_nvfp4_f16(const __grid_constant__ QuantizeParams p) {
  quantize_kernel<F16In, 2>(p);
}
extern "C" __global__ void __launch_bounds__(THREADS) quantize_nvfp4_bf16(const __grid_constant__ QuantizeParams p) {
  quantize_kernel<Bf16In, 2>(p);
}
