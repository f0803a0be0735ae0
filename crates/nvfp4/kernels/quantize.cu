// quantize.cu: NVFP4 quantization on the GPU in the ModelOpt convention (SPEC §1), bit-identical
// to the CPU quantizer's GPU rule (format/quant.rs quantize_nan_blocks; docs/FORMAT.md §1):
//   global = max(amax / (6 * 448), 2^-126) with amax over the finite elements (1 when that amax
//   is 0), or a given global scale (one read from the device that is not finite and > 0 is
//   replaced by NaN, so every scale below becomes NaN);
//   per 16-block: scale = e4m3(amax(block) / 6 / global), s = f32(scale) * global;
//   q = e2m1(x / s), nearest even, saturating at 6 (0 when s is 0 or not finite);
//   a block holding a NaN or an infinity: scale = 0x7F (the e4m3 NaN), 16 codes +0. A launch
//   cannot refuse such input without a host synchronization; this marks exactly the blocks (and
//   so the GEMM outputs) it reaches. Such a block also atomicMin's 4 * (its first bad element's
//   index) + (0 NaN, 1 +inf, 2 -inf) into the word `first_bad`, which the host's opt-in check
//   sets to all ones before the launch and reads back after it.
//
// Three kernels per input type (f32, f16, bf16):
// - quantize_amax_*: the tensor's amax over its finite elements as u32 bits (non-negative floats
//   order as integers) with one atomicMax per warp, into a word zeroed before.
// - quantize_nvfp4_*: one thread per 16-block and tile of THREADS blocks, a grid of one wave
//   striding over the tiles, the next tile's loads in flight while this one is quantized: 8 bytes
//   of packed values and one scale byte per block (plain or blocked layout, SPEC §2).
// - quantize_dequant_*: the same codes, written back as 16-bit numbers e2m1 * e4m3 (without the
//   global scale; bf16, or f16 for f16 input): a W4A4 GEMM's activations as the W4A16 kernels
//   read them. Each such product is exact in f32 (SPEC §8), so the W4A16 GEMM of them with
//   alpha = global * the weight's global computes the W4A4 product (SPEC §3). Four threads per
//   16-block (the blocks of a decode-sized x are few: one thread each left the pass
//   latency-bound).
//
// The e2m1 code of x / s without dividing (the fast path, e2m1_step below): y = |x| * rcp(s) is
// within 3 units in the last place of the CPU's quotient, so it gives the CPU's code unless that
// quotient lies within a few ulp of a rounding boundary; those elements (rare, but frequent in
// structured data such as bf16 inputs with a power-of-two-like global scale) are redone with the
// exact quotient (__fdiv_rn, as the CPU divides), and blocks with an extreme scale take the
// exact path throughout. The block scale is the hardware e4m3 conversion (nearest even,
// saturating); every other rounding is spelled out (__fdiv_rn, __fmul_rn) so that no contraction
// makes the GPU differ from the CPU.
#include "ptx.cuh"

// QuantizeParams: declared in generated.cuh from its one definition (backend/cuda/kernels/quantize.rs).
#include "generated.cuh"

namespace {

using quant::AMAX_UNROLL;  // 16-blocks per thread and loop step in the amax pass
using quant::THREADS;      // also the 16-blocks of one tile of the quantize pass
using quant::DEQUANT_THREADS_PER_BLOCK;  // the dequantizing pass: a quad per 16-block
static_assert(DEQUANT_THREADS_PER_BLOCK == 4, "dequant_quarter: four elements per thread, an amax of two shuffles");

// One 16-block of input as raw 32-bit words (WORDS of them, `load`, `p` 16-byte aligned) and its
// elements as f32 (`at`, exact for every input type).
struct F32In {
  static constexpr int WORDS = 16;
  NVFP4_DEVICE static void load(const void* p, u32* w, u64 pol) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 q = ptx::ld_stream_l1_v4((const u8*)p + 16 * i, pol);
      w[4 * i + 0] = q.x, w[4 * i + 1] = q.y, w[4 * i + 2] = q.z, w[4 * i + 3] = q.w;
    }
  }
  NVFP4_DEVICE static float at(const u32* w, int i) { return __uint_as_float(w[i]); }
  NVFP4_DEVICE static float amax_nan(const u32* w) {
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) m = ptx::fmax_nan(m, fabsf(at(w, i)));
    return m;
  }
};
struct F16In {
  static constexpr int WORDS = 8;
  NVFP4_DEVICE static void load(const void* p, u32* w, u64 pol) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint4 q = ptx::ld_stream_l1_v4((const u8*)p + 16 * i, pol);
      w[4 * i + 0] = q.x, w[4 * i + 1] = q.y, w[4 * i + 2] = q.z, w[4 * i + 3] = q.w;
    }
  }
  NVFP4_DEVICE static float at(const u32* w, int i) {
    float lo, hi;
    ptx::f16x2_to_f32(w[i / 2], lo, hi);
    return i % 2 ? hi : lo;
  }
  // Pairs first, in f16x2 (exact: max only selects), then the two lanes in f32.
  NVFP4_DEVICE static float amax_nan(const u32* w) {
    u32 m = ptx::max_abs_nan_f16x2(ptx::max_abs_nan_f16x2(ptx::max_abs_nan_f16x2(w[0], w[1]), ptx::max_abs_nan_f16x2(w[2], w[3])),
                                   ptx::max_abs_nan_f16x2(ptx::max_abs_nan_f16x2(w[4], w[5]), ptx::max_abs_nan_f16x2(w[6], w[7])));
    float lo, hi;
    ptx::f16x2_to_f32(m, lo, hi);
    return ptx::fmax_nan(fabsf(lo), fabsf(hi));
  }
};
struct Bf16In {
  static constexpr int WORDS = 8;
  NVFP4_DEVICE static void load(const void* p, u32* w, u64 pol) { F16In::load(p, w, pol); }
  // The even element is the low half (little-endian); a bf16 is the top half of its f32.
  NVFP4_DEVICE static float at(const u32* w, int i) {
    return __uint_as_float(i % 2 ? w[i / 2] & 0xFFFF0000u : w[i / 2] << 16);
  }
  // Pairs first, in bf16x2 (exact: max only selects), then the two lanes in f32.
  NVFP4_DEVICE static float amax_nan(const u32* w) {
    const u32 m = ptx::max_abs_nan_bf16x2(
        ptx::max_abs_nan_bf16x2(ptx::max_abs_nan_bf16x2(w[0], w[1]), ptx::max_abs_nan_bf16x2(w[2], w[3])),
        ptx::max_abs_nan_bf16x2(ptx::max_abs_nan_bf16x2(w[4], w[5]), ptx::max_abs_nan_bf16x2(w[6], w[7])));
    return ptx::fmax_nan(fabsf(__uint_as_float(m << 16)), fabsf(__uint_as_float(m & 0xFFFF0000u)));
  }
};

// f32 -> E4M3 code, nearest even, saturating at 448 (infinities too), NaN -> 0x7F: the hardware
// conversion, which rounds as format/e4m3.rs f32_to_e4m3 does (the boundary tests pin this).
NVFP4_DEVICE u32 e4m3_code(float x) { return ptx::cvt_f32_e4m3(x); }

// E4M3 code -> f32, exactly (through f16, which holds every e4m3 value).
NVFP4_DEVICE float e4m3_value(u32 code) {
  float lo, hi;
  ptx::f16x2_to_f32(ptx::cvt_e4m3x2_f16x2(code), lo, hi);
  return lo;
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

// The fast path's range of s: there 1/s rounds to a normal f32 and |x| * rcp(s) keeps a relative
// error below 2^-23 wherever it can reach a rounding boundary (y >= 0.25).
constexpr float FAST_S_MIN = 0x1p-120f;
constexpr float FAST_S_MAX = 0x1p+120f;
// Half-width, in units of the last place of z below, of the window around a rounding boundary
// where y cannot decide and the exact path is taken. The error of y against the CPU's rounded
// quotient is at most 3 units (2^-23 relative from rcp and the product, half an ulp from the
// CPU's own rounding); 4 leaves one unit spare.
constexpr u32 NEAR = 4;
// 6 * 2^-126: z of the largest e2m1 magnitude; larger z saturate to it.
constexpr u32 Z_SIX = 0x01C00000u;

// NOTE: the encoder's two multipliers are read from constant memory, not written as literals.
// With a literal power of two ptxas turns each multiply into a LEA on the integer pipe, which the
// encoder then saturated: 5.5 integer-pipe instructions per bf16 element (f16: 5; its unpacking
// runs on the FMA pipe), 52 µs for 8192x8192 bf16 = 77% of copy. Read from memory they must be
// IMADs, which issue to the FMA pipe next to the two FMULs (3.5 integer-pipe instructions per
// element left). The constant bank is an operand of IMAD itself, so no register holds them, and
// external linkage keeps the compiler from folding the initializer. (The blockDim route measured
// before cost 8 registers: 6 -> 5 CTAs per SM.)
extern "C" __constant__ u32 quantize_shift_factors[2] = {1u << 6, 1u << 10};

// The e2m1 codes of 8 elements of a block, packed (element 8h + j in nibble j), from y = |x| * r.
// z = y * 2^-126 puts y's e2m1 grid on the f32 bit pattern: for y >= 1 the exponent and the top
// mantissa bit of z are the code (2 + 2 * (e + 1) + m), and for y < 1 z is subnormal with the
// grid 0, 0.5, 1 at bits 0, 2^22, 2^23, e2m1's own subnormals. Adding 2^21 (half a step) rounds
// to the nearest code, which then sits in bits 22..24; the rounding boundaries (0.25, 0.75, 1.25,
// ..., 5) are exactly the z whose low 22 bits are 2^21, so `near` is set when those bits are
// within NEAR of it. t below holds (z + 2^21) << 6: the code in bits 28..30 under the sign of x,
// which a funnel shift appends to the packed word (e2m1_step does one element). CLAMP saturates
// z at 6 (needed only when some y reaches 7, where the rounded code would be 8).
template <bool CLAMP>
NVFP4_DEVICE u32 e2m1_step(float x, float r, bool& near) {
  const float z = __fmul_rn(__fmul_rn(fabsf(x), r), 0x1p-126f);  // y < 1: one rounding of 2^-24
  const u32 zb = CLAMP ? min(__float_as_uint(z), Z_SIX) : __float_as_uint(z);
  // The low 22 bits of zb + 2^21 within NEAR of 0 (mod 2^22), tested in the top 22 bits.
  near |= zb * quantize_shift_factors[1] + ((0x200000u + NEAR) << 10) <= (2 * NEAR) << 10;
  return (zb * quantize_shift_factors[0] + (0x200000u << 6)) | (__float_as_uint(x) & 0x80000000u);
}

template <class In, bool CLAMP>
NVFP4_DEVICE u32 e2m1_fast8(const u32* w, int h, float r, bool& near) {
  u32 acc = 0;
#pragma unroll
  for (int i = 8 * h + 7; i >= 8 * h; --i) {  // the last element first: it ends in the top nibble
    acc = ptx::shf_l(e2m1_step<CLAMP>(In::at(w, i), r, near), acc, 4);
  }
  return acc;
}

// The smallest global scale taken from the amax: the smallest normal f32 (format/quant.rs
// MIN_GLOBAL_SCALE). amax / 2688 of a tensor of tiny values underflows, to 0 below ~2^-138.
constexpr float MIN_GLOBAL = 0x1p-126f;
// The largest finite f32: x <= F32_MAX is false exactly for NaN and the infinities.
constexpr float F32_MAX = 0x1.fffffep+127f;

// The global scale this launch uses (QuantizeParams::global_mode: 0 from the amax word, 1 the
// value in the params, checked by the host, 2 the f32 at global_in, which only the kernel sees:
// one that is not finite and > 0 becomes NaN, which every block scale then inherits).
NVFP4_DEVICE float global_scale(const QuantizeParams& p) {
  if (p.global_mode == 1) return p.global_value;
  if (p.global_mode == 2) {
    const float g = *p.global_in;
    return g > 0.0f && g <= F32_MAX ? g : __uint_as_float(0x7FC00000u);
  }
  const float a = __uint_as_float(*(const volatile u32*)p.amax);  // finite, >= 0
  return a > 0.0f ? fmaxf(__fdiv_rn(a, 2688.0f), MIN_GLOBAL) : 1.0f;
}

// Byte offset of scale (row i of batch b, scale column j) in the blocked layout (SPEC §2).
NVFP4_DEVICE i64 blocked_offset(i64 i, i64 j, i64 b, i64 R, i64 C) {
  return b * (R * C * 512) + (i / 128) * (C * 512) + (j / 4) * 512 + (i % 32) * 16 + ((i % 128) / 32) * 4 + (j % 4);
}

template <class In, int BYTES>
NVFP4_DEVICE void amax_kernel(const QuantizeParams& p) {
  float m = 0.0f;
  const i64 step = (i64)gridDim.x * THREADS * AMAX_UNROLL;
  const u64 pol = ptx::policy_evict_normal();  // LRU: the quantize pass re-reads what stays in L2
  for (i64 b0 = (i64)blockIdx.x * THREADS * AMAX_UNROLL + threadIdx.x; b0 < p.blocks; b0 += step) {
    u32 w[AMAX_UNROLL][In::WORDS];
#pragma unroll
    for (int u = 0; u < AMAX_UNROLL; ++u) {
      const i64 b = b0 + (i64)u * THREADS;
      if (b < p.blocks) In::load((const u8*)p.x + b * 16 * BYTES, w[u], pol);
    }
#pragma unroll
    for (int u = 0; u < AMAX_UNROLL; ++u) {
      if (b0 + (i64)u * THREADS >= p.blocks) break;
      float a = In::amax_nan(w[u]);  // NaN or inf when the block holds one
      if (!(a <= F32_MAX)) {         // rare: the amax of the block's finite elements
        a = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const float v = fabsf(In::at(w[u], i));
          if (v <= F32_MAX) a = fmaxf(a, v);
        }
      }
      m = fmaxf(m, a);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  if (threadIdx.x % 32 == 0 && m > 0.0f) atomicMax(p.amax, __float_as_uint(m));
}

// Records block `b`'s first NaN or infinity for the host's check: the smallest 4 * index + kind
// (0 NaN, 1 +inf, 2 -inf) over the launch.
// (Unrolled, from the last element down: w must stay in registers, so no dynamic index.)
template <class In>
NVFP4_DEVICE void record_first_bad(const QuantizeParams& p, i64 b, const u32* w) {
  u64 first = ~0ull;
#pragma unroll
  for (int i = 15; i >= 0; --i) {
    const float v = In::at(w, i);
    if (!(fabsf(v) <= F32_MAX)) first = (u64)(b * 16 + i) * 4 + (v != v ? 0 : v > 0.0f ? 1 : 2);
  }
  atomicMin(p.first_bad, first);
}

// Quantizes block `b` (input at `src`) from its raw words `w`; writes its values and scale.
template <class In>
NVFP4_DEVICE void quantize_block(const QuantizeParams& p, float g, i64 b, const u32* w) {
  const float amax = In::amax_nan(w);  // NaN or inf when the block holds one
  const bool finite = amax <= F32_MAX;
  // Rare. Always recorded: a test of whether the host asked, even inside this branch, was
  // hoisted by the compiler onto the hot path (two integer-pipe instructions per block).
  if (!finite) record_first_bad<In>(p, b, w);
  const u32 code = e4m3_code(__fdiv_rn(__fdiv_rn(amax, 6.0f), g));
  // Not finite: the e4m3 NaN (which a NaN amax gives already; an infinite one would saturate),
  // so s is NaN below and all 16 codes stay +0.
  const u32 sc = finite ? code : 0x7Fu;
  const float s = __fmul_rn(e4m3_value(sc), g);
  u32 packed[2] = {0u, 0u};  // s == 0 (an all-zero block, a scale that rounds to 0) or NaN: all +0
  if (s >= FAST_S_MIN && s <= FAST_S_MAX) {
    const float r = __frcp_rn(s);
    bool near = false;
    if (__fmul_rn(amax, r) < 7.0f) {  // no y reaches 7: no code needs saturating
      packed[0] = e2m1_fast8<In, false>(w, 0, r, near);
      packed[1] = e2m1_fast8<In, false>(w, 1, r, near);
    } else {
      packed[0] = e2m1_fast8<In, true>(w, 0, r, near);
      packed[1] = e2m1_fast8<In, true>(w, 1, r, near);
    }
    if (near) {  // rare: redo the elements near a rounding boundary with the exact quotient
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        bool here = false;
        e2m1_step<true>(In::at(w, i), r, here);
        if (here) {
          const u32 shift = 4 * (i % 8);
          packed[i / 8] = (packed[i / 8] & ~(0xFu << shift)) | e2m1_code(__fdiv_rn(In::at(w, i), s)) << shift;
        }
      }
    }
  } else if (s > 0.0f && isfinite(s)) {  // rare: an extreme scale
#pragma unroll
    for (int i = 0; i < 16; ++i) packed[i / 8] |= e2m1_code(__fdiv_rn(In::at(w, i), s)) << (4 * (i % 8));
  }
  *(uint2*)(p.values + b * 8) = make_uint2(packed[0], packed[1]);
  i64 off = b;
  if (p.blocked) {
    const i64 row = b / p.sf_cols, j = b % p.sf_cols;
    const i64 R = (p.rows + 127) / 128, C = (p.sf_cols + 3) / 4;
    off = blocked_offset(row % p.rows, j, row / p.rows, R, C);
  }
  p.scales[off] = (u8)sc;
}

template <class In, int BYTES>
NVFP4_DEVICE void quantize_kernel(const QuantizeParams& p) {
  const float g = global_scale(p);
  if (blockIdx.x == 0 && threadIdx.x == 0) *p.global_out = g;
  const u64 pol = ptx::policy_evict_first();
  constexpr i64 TILE = THREADS;  // one 16-block per thread and tile
  const i64 tiles = (p.blocks + TILE - 1) / TILE;
  // This thread's block in the t-th tile of the walk. `reverse` walks from the end of x: after
  // the amax pass, whose last loads are there, the first tiles quantized are those still in L2.
  const auto block_of = [&](i64 t) { return (p.reverse ? tiles - 1 - t : t) * TILE + threadIdx.x; };
  // Software pipelined: the next tile's loads are in flight while this tile is quantized.
  i64 t = blockIdx.x;
  if (t >= tiles) return;
  u32 w[In::WORDS];
  i64 b = block_of(t);
  if (b < p.blocks) In::load((const u8*)p.x + b * 16 * BYTES, w, pol);
  for (; t < tiles; t += gridDim.x) {
    const i64 tn = t + gridDim.x;
    const i64 bn = tn < tiles ? block_of(tn) : p.blocks;
    u32 wn[In::WORDS];
    if (bn < p.blocks) In::load((const u8*)p.x + bn * 16 * BYTES, wn, pol);
    if (b < p.blocks) quantize_block<In>(p, g, b, w);
#pragma unroll
    for (int i = 0; i < In::WORDS; ++i) w[i] = wn[i];
    b = bn;
  }
}

// ---- The dequantizing pass: four threads per 16-block, four elements each ------------------------

// The value of e2m1 code `c` (sign at bit 3; higher bits ignored) times `s`, exactly: c's
// magnitude bits shifted to bits 22..24 of an f32 read as e2m1 * 2^-126 (codes 0 and 1 land on
// the f32 subnormals, spaced as E2M1's: the grid of e2m1_step's z), so two exact products give
// e2m1 * s (a NaN s gives NaN).
NVFP4_DEVICE float e2m1_times(u32 c, float s) {
  const float z = __uint_as_float((c & 7u) << 22 | (c & 8u) << 28);
  return __fmul_rn(__fmul_rn(z, 0x1p126f), s);
}

// Elements 4q .. 4q+3 of a 16-block (q: the thread's place in its quad) as raw words: 2 (16-bit
// input) or 4 (f32) of them, read by `In::at` as elements 0..3.
template <class In, int BYTES>
NVFP4_DEVICE void load_quarter(const void* p, u32* w, u64 pol) {
  if constexpr (BYTES == 4) {
    const uint4 v = ptx::ld_stream_l1_v4(p, pol);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else {
    const uint2 v = *(const uint2*)p;  // 8 bytes: the 16-byte stream load would read two quarters
    w[0] = v.x, w[1] = v.y;
  }
}

// Quarter q of block b (raw words w) quantized as quantize_block does the whole block, the quad's
// four threads together (the amax over the block by two shuffles; the same scale and the same
// per-element codes), then written back as four e2m1 * e4m3 in Out: 8 bytes at
// p.dequant + 32 * b + 8 * q. A block holding a NaN or an infinity is 16 NaNs (its scale is the
// e4m3 NaN). Every thread of the warp calls this (the shuffles); `live` marks real quarters.
template <class In, bool BF16_OUT>
NVFP4_DEVICE void dequant_quarter(const QuantizeParams& p, float g, i64 b, int q, const u32* w, bool live) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) amax = ptx::fmax_nan(amax, fabsf(In::at(w, i)));
  amax = ptx::fmax_nan(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
  amax = ptx::fmax_nan(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 2));
  if (!live) return;
  const bool finite = amax <= F32_MAX;
  if (!finite) {  // rare: this quarter's first NaN or infinity, if it holds one
    u64 first = ~0ull;
#pragma unroll
    for (int i = 3; i >= 0; --i) {
      const float v = In::at(w, i);
      if (!(fabsf(v) <= F32_MAX)) first = (u64)(b * 16 + 4 * q + i) * 4 + (v != v ? 0 : v > 0.0f ? 1 : 2);
    }
    if (first != ~0ull) atomicMin(p.first_bad, first);
  }
  const u32 sc = finite ? e4m3_code(__fdiv_rn(__fdiv_rn(amax, 6.0f), g)) : 0x7Fu;
  const float s = __fmul_rn(e4m3_value(sc), g);
  u32 codes[4] = {0u, 0u, 0u, 0u};  // s == 0 or NaN: all +0
  if (s >= FAST_S_MIN && s <= FAST_S_MAX) {
    const float r = __frcp_rn(s);
    const bool clamp = !(__fmul_rn(amax, r) < 7.0f);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      bool near = false;
      const u32 t = clamp ? e2m1_step<true>(In::at(w, i), r, near) : e2m1_step<false>(In::at(w, i), r, near);
      codes[i] = near ? e2m1_code(__fdiv_rn(In::at(w, i), s)) : t >> 28;
    }
  } else if (s > 0.0f && isfinite(s)) {  // rare: an extreme scale
#pragma unroll
    for (int i = 0; i < 4; ++i) codes[i] = e2m1_code(__fdiv_rn(In::at(w, i), s));
  }
  const float e = e4m3_value(sc);
  const float v0 = e2m1_times(codes[0], e), v1 = e2m1_times(codes[1], e);
  const float v2 = e2m1_times(codes[2], e), v3 = e2m1_times(codes[3], e);
  const uint2 out = BF16_OUT ? make_uint2(ptx::f32x2_to_bf16x2_rn(v0, v1), ptx::f32x2_to_bf16x2_rn(v2, v3))
                             : make_uint2(ptx::f32x2_to_f16x2_rn(v0, v1), ptx::f32x2_to_f16x2_rn(v2, v3));
  *(uint2*)((u8*)p.dequant + b * 32 + q * 8) = out;
}

// A grid of one wave striding over the quarters, the next quarter's load in flight while this one
// is done. Launched as a programmatic dependent: it lets the GEMM after it launch first (that
// GEMM's setup and weight prefetch then overlap the kernel before this one), then waits before it
// reads x (or the amax word). The GEMM's own wait returns only once this grid has completed,
// which is after the kernel before it: every read and write stays ordered.
template <class In, int BYTES, bool BF16_OUT>
NVFP4_DEVICE void dequant_kernel(const QuantizeParams& p) {
  ptx::launch_dependents();
  ptx::wait_prerequisites();
  const float g = global_scale(p);
  if (blockIdx.x == 0 && threadIdx.x == 0) *p.global_out = g;
  const u64 pol = ptx::policy_evict_first();
  const i64 quarters = p.blocks * DEQUANT_THREADS_PER_BLOCK, step = (i64)gridDim.x * THREADS;
  // Whole warps iterate together (the shuffles need every lane); a lane past the end idles.
  const i64 start = (i64)blockIdx.x * THREADS + threadIdx.x;
  const i64 rounds = (quarters - (i64)blockIdx.x * THREADS + step - 1) / step;
  u32 w[4], wn[4];
  if (start < quarters) load_quarter<In, BYTES>((const u8*)p.x + start * 4 * BYTES, w, pol);
  for (i64 t = 0, i = start; t < rounds; ++t, i += step) {
    const i64 next = i + step;
    if (next < quarters) load_quarter<In, BYTES>((const u8*)p.x + next * 4 * BYTES, wn, pol);
    const i64 b = i / DEQUANT_THREADS_PER_BLOCK;
    dequant_quarter<In, BF16_OUT>(p, g, b, (int)(i % DEQUANT_THREADS_PER_BLOCK), w, i < quarters);
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = wn[k];
  }
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

extern "C" __global__ void __launch_bounds__(THREADS) quantize_dequant_f32(const __grid_constant__ QuantizeParams p) {
  dequant_kernel<F32In, 4, true>(p);
}
extern "C" __global__ void __launch_bounds__(THREADS) quantize_dequant_f16(const __grid_constant__ QuantizeParams p) {
  dequant_kernel<F16In, 2, false>(p);
}
extern "C" __global__ void __launch_bounds__(THREADS) quantize_dequant_bf16(const __grid_constant__ QuantizeParams p) {
  dequant_kernel<Bf16In, 2, true>(p);
}
