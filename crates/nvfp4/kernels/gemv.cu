// gemv.cu: batched NVFP4 GEMV, c[l, m] = sum_k A[l, m, k] * B[l, k], f16 or bf16 out (SPEC §3.1).
//
// Algorithm (a pure bandwidth problem: every byte of A is read once):
// - A row tile is 32 rows of one batch: rows 128*t + 32*q + r0 + warp (q = 0..3, r0 = 8*(tile%4)),
//   so that in the blocked scale layout the 4 rows of a warp share one 16 B scale group and the
//   8 warps of a CTA fill whole 32 B sectors.
// - K is walked in K-steps of 32 chunks; lane i of every warp takes chunk i of the K-step for its
//   4 rows. A chunk is 16 B of A (32 elements, 2 scale blocks), or 8 B when K % 32 == 16. A is
//   streamed (L1::no_allocate, L2 evict_first); the next K-step's loads are in flight while the
//   current one is computed (register double buffering).
// - The tile walk, the windows, the double buffer, split-K (when M * L is too small to fill the
//   GPU) and the persistent grid are gemv_tiles.cuh's skeleton, shared with gemv16.cu; this file
//   is its W4A4 part (`W4A4`): the row map, the staging of B, the loads of A and the dot products.
// - B is decoded once per window into shared memory as int8 (2x the E2M1 value) and its negation,
//   with its scales as f32. Decoding and multiplying an A element costs ~1.5 instructions (a prmt
//   table lookup of the magnitude, a prmt that picks b or -b by the sign, dp4a: exact int32 per
//   16-block); ~2.2 per element with scales, loads and addressing (SASS, 2026-11-22).
// - Per block: int sum -> f32 (magic-number add) -> fma with sa * sb into an f32 accumulator.
//   Sums of SPEC GEMV data are exact in f32, so the result is bit-identical to the reference.
// - Programmatic dependent launch: nothing is read or written before `griddepcontrol.wait`
//   (gemv_tiles.cuh); the host launches with the attribute (backend/cuda/gemv.rs).
#include "ptx.cuh"
#include "nvfp4.cuh"
#include "output.cuh"

// GemvParams and the sizes (namespace gemv): generated.cuh, from their one definition
// (backend/cuda/kernels/gemv.rs), which the host's plan uses too.
// NOTE: a diagnostic variant of this file (examples/dev_gemv_diag, NVFP4_KERNELS_DIR) cannot
// change a size by a #define in front of it: generated.cuh always comes from the library, and the
// host plans windows and grids with the same values. A size is varied in kernels/gemv.rs.
#include "generated.cuh"
#include "gemv_tiles.cuh"

namespace {

using gemv::KSTEP_CHUNKS;
using gemv::STAGE_SCALES_PER_THREAD;
using gemv::STAGE_WORDS_PER_THREAD;
using gemv::THREADS;
constexpr int WARPS = THREADS / 32;
constexpr int ROWS_PER_WARP = gemv::ROWS_PER_CTA / WARPS;
// The row map (rows 128*t + 32*q + 8*c + warp) and the blocked scales' 16 B groups are written for
// these: 8 warps of 4 rows, 4 row tiles per 128-row scale tile; a lane per chunk of a K-step.
static_assert(WARPS == 8 && ROWS_PER_WARP == 4 && 4 * gemv::ROWS_PER_CTA == 128, "row tiles");
static_assert(KSTEP_CHUNKS == 32, "one chunk per lane");

// Compile-time shape of one variant. CB = bytes of A per lane per K-step.
template <int CB>
struct Chunk {
  static constexpr int WORDS = CB / 4;            // packed words (8 elements each)
  static constexpr int BLOCKS = CB / 8;           // scale blocks (16 elements each)
  static constexpr int PLANES = CB / 8;           // 16 B shared-memory planes of decoded B
  static constexpr int KSTEP_A = KSTEP_CHUNKS * CB;       // bytes of one A row per K-step
  static constexpr int KSTEP_SF = KSTEP_CHUNKS * BLOCKS;  // scale bytes of one row per K-step (plain)
  static constexpr int KSTEP_GROUPS = KSTEP_SF / 4 * 512;  // blocked: bytes per K-step
  static constexpr int WINDOW_BYTES_PER_CHUNK = 2 * PLANES * 16 + BLOCKS * 4;  // b, -b, sb
  // The host sizes a window with its own count (Chunk::smem_per_chunk in kernels/gemv.rs).
  static_assert(WINDOW_BYTES_PER_CHUNK == gemv::WindowChunk<CB>::BYTES, "stage_b's layout is the host's");
};

// Decodes B chunks [c0, c1) of batch l into shared memory:
//   bq[plane][chunk] : [PLANES, WC, 16 B] int8 (2x value), words 2*plane and 2*plane+1
//   nq[plane][chunk] : the same, negated
//   sb[chunk][block] : [WC, BLOCKS] f32, scale / 4 (undoes the 2x of both int8 operands)
// NOTE: every thread issues all its loads (at most STAGE_WORDS_PER_THREAD words and
// STAGE_SCALES_PER_THREAD scales, the host keeps windows within that) before decoding any: one
// load latency per window instead of one per loop trip, which cost several microseconds at the
// start of every CTA.
template <int CB, bool BLOCKED>
__device__ void stage_b(const GemvParams& p, u8* smem, int wc, int l, int c0, int c1) {
  using C = Chunk<CB>;
  const u8* bl = p.b + (i64)l * (p.k / 2);
  const int words = (c1 - c0) * C::WORDS, blocks = (c1 - c0) * C::BLOCKS, sf_cols = p.k / 16;
  u32 w[STAGE_WORDS_PER_THREAD], sc[STAGE_SCALES_PER_THREAD];
#pragma unroll
  for (int n = 0; n < STAGE_WORDS_PER_THREAD; ++n) {
    const int i = threadIdx.x + n * THREADS;
    if (i < words) w[n] = ptx::ld_nc_u32(bl + (i64)c0 * CB + i * 4);
  }
#pragma unroll
  for (int n = 0; n < STAGE_SCALES_PER_THREAD; ++n) {
    const int i = threadIdx.x + n * THREADS;
    if (i < blocks) sc[n] = ptx::ld_nc_u8(p.sfb + nvfp4::scale_offset(BLOCKED, 1, sf_cols, 0, c0 * C::BLOCKS + i, l));
  }
#pragma unroll
  for (int n = 0; n < STAGE_WORDS_PER_THREAD; ++n) {
    const int i = threadIdx.x + n * THREADS;
    if (i >= words) break;
    const int cl = i / C::WORDS, wi = i % C::WORDS;
    const nvfp4::BWord d = nvfp4::decode_b_word(w[n]);
    const int off = (wi / 2) * wc * 16 + cl * 16 + (wi % 2) * 8;
    *reinterpret_cast<uint2*>(smem + off) = make_uint2(d.lo, d.hi);
    *reinterpret_cast<uint2*>(smem + C::PLANES * wc * 16 + off) = make_uint2(d.nlo, d.nhi);
  }
  float* sb = reinterpret_cast<float*>(smem + 2 * C::PLANES * wc * 16);
#pragma unroll
  for (int n = 0; n < STAGE_SCALES_PER_THREAD; ++n) {
    const int i = threadIdx.x + n * THREADS;
    if (i < blocks) sb[i] = nvfp4::e4m3_to_f32(sc[n]) * 0.25f;
  }
}

// Where one lane reads A and its scales, for the warp's 4 rows; advanced one K-step at a time.
// Rows past M are clamped to row M-1 (valid memory, results discarded), so loads need no
// per-row predicate.
template <int CB, bool BLOCKED>
struct Cursor {
  const u8* a[ROWS_PER_WARP];   // this lane's chunk of each row
  const u8* sf[ROWS_PER_WARP];  // plain: the chunk's scale bytes of each row; blocked: [0] only
  int sf_shift;                 // blocked: bit offset of this lane's scales in its 4-byte word

  __device__ __forceinline__ void advance() {
    using C = Chunk<CB>;
#pragma unroll
    for (int q = 0; q < ROWS_PER_WARP; ++q) {
      a[q] += C::KSTEP_A;
      if (!BLOCKED) sf[q] += C::KSTEP_SF;
    }
    if (BLOCKED) sf[0] += C::KSTEP_GROUPS;
  }
};

template <int CB, bool BLOCKED>
__device__ __forceinline__ Cursor<CB, BLOCKED> make_cursor(const GemvParams& p, int l, const int* row, int chunk) {
  using C = Chunk<CB>;
  Cursor<CB, BLOCKED> cur;
  const int sf_cols = p.k / 16;
  const int j = chunk * C::BLOCKS;
#pragma unroll
  for (int q = 0; q < ROWS_PER_WARP; ++q) {
    const i64 r = (i64)l * p.m + min(row[q], p.m - 1);
    cur.a[q] = p.a + r * (p.k / 2) + (i64)chunk * CB;
    cur.sf[q] = p.sfa + r * sf_cols + j;
  }
  if (BLOCKED) {
    // The 4 rows differ only in (i % 128) / 32 = q: one 16 B group holds all their scales,
    // 4 bytes per row, scale columns 4 * (j / 4) .. + 3.
    cur.sf[0] = p.sfa + nvfp4::scale_offset(true, p.m, sf_cols, min(row[0], p.m - 1), j & ~3, l);
  }
  cur.sf_shift = 8 * (j & 3);
  return cur;
}

// One K-step's A data of one lane: the chunk of each of the warp's 4 rows, and their scales.
struct AChunk {
  uint4 v[ROWS_PER_WARP];  // CB bytes used
  u32 s[ROWS_PER_WARP];    // the chunk's scale bytes, low byte first
};

template <int CB, bool BLOCKED>
__device__ __forceinline__ void load_a(const Cursor<CB, BLOCKED>& cur, AChunk& x, bool ok, u64 pol) {
  if (!ok) return;
#pragma unroll
  for (int q = 0; q < ROWS_PER_WARP; ++q) {
    if (CB == 16) {
      x.v[q] = ptx::ld_stream_v4(cur.a[q], pol);
    } else {
      const uint2 h = ptx::ld_stream_v2(cur.a[q], pol);
      x.v[q].x = h.x;
      x.v[q].y = h.y;
    }
    if (!BLOCKED) x.s[q] = CB == 16 ? ptx::ld_nc_u16(cur.sf[q]) : ptx::ld_nc_u8(cur.sf[q]);
  }
  if (BLOCKED) {
    const uint4 g = ptx::ld_nc_v4(cur.sf[0]);
    const u32 w[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
    for (int q = 0; q < ROWS_PER_WARP; ++q) x.s[q] = (w[q] >> cur.sf_shift) & (CB == 16 ? 0xFFFFu : 0xFFu);
  }
}

// acc[q] += the chunk's dot products, block by block.
template <int CB>
__device__ __forceinline__ void compute(const AChunk& x, const u8* smem, int wc, int cl, float* acc) {
  using C = Chunk<CB>;
  // Decoded B of this chunk: word w's int8 at plane w/2, half w%2.
  u32 b[C::WORDS][2], nb[C::WORDS][2];
#pragma unroll
  for (int pl = 0; pl < C::PLANES; ++pl) {
    const uint4 vb = *reinterpret_cast<const uint4*>(smem + pl * wc * 16 + cl * 16);
    const uint4 vn = *reinterpret_cast<const uint4*>(smem + (C::PLANES + pl) * wc * 16 + cl * 16);
    b[2 * pl][0] = vb.x, b[2 * pl][1] = vb.y, b[2 * pl + 1][0] = vb.z, b[2 * pl + 1][1] = vb.w;
    nb[2 * pl][0] = vn.x, nb[2 * pl][1] = vn.y, nb[2 * pl + 1][0] = vn.z, nb[2 * pl + 1][1] = vn.w;
  }
  const float* sbp = reinterpret_cast<const float*>(smem + 2 * C::PLANES * wc * 16) + cl * C::BLOCKS;
  float sb[C::BLOCKS];
#pragma unroll
  for (int t = 0; t < C::BLOCKS; ++t) sb[t] = sbp[t];

#pragma unroll
  for (int q = 0; q < ROWS_PER_WARP; ++q) {
    const u32 w[4] = {x.v[q].x, x.v[q].y, x.v[q].z, x.v[q].w};
    float sa[2];
    nvfp4::e4m3x2_to_f32(x.s[q], sa[0], sa[1]);
#pragma unroll
    for (int t = 0; t < C::BLOCKS; ++t) {
      i32 s = nvfp4::MAGIC_BITS;
      s = nvfp4::dot8(w[2 * t], b[2 * t][0], b[2 * t][1], nb[2 * t][0], nb[2 * t][1], s);
      s = nvfp4::dot8(w[2 * t + 1], b[2 * t + 1][0], b[2 * t + 1][1], nb[2 * t + 1][0], nb[2 * t + 1][1], s);
      acc[q] = fmaf(nvfp4::magic_to_float(s), sa[t] * sb[t], acc[q]);
    }
  }
}

// Sums acc[0..3] over the warp: afterwards lane 8q holds row q's total. Butterfly reduce-scatter,
// fixed order (deterministic).
__device__ __forceinline__ float warp_reduce4(const float* acc, int lane) {
  const bool hi16 = lane & 16, hi8 = lane & 8;
  const float k0 = hi16 ? acc[2] : acc[0], k1 = hi16 ? acc[3] : acc[1];
  const float s0 = hi16 ? acc[0] : acc[2], s1 = hi16 ? acc[1] : acc[3];
  const float r0 = k0 + __shfl_xor_sync(0xFFFFFFFFu, s0, 16);
  const float r1 = k1 + __shfl_xor_sync(0xFFFFFFFFu, s1, 16);
  float t = (hi8 ? r1 : r0) + __shfl_xor_sync(0xFFFFFFFFu, hi8 ? r0 : r1, 8);
  t += __shfl_xor_sync(0xFFFFFFFFu, t, 4);
  t += __shfl_xor_sync(0xFFFFFFFFu, t, 2);
  t += __shfl_xor_sync(0xFFFFFFFFu, t, 1);
  return t;
}

// The W4A4 family's part of the skeleton (gemv_tiles.cuh): lane i of warp w takes chunk i of
// every K-step for rows row0 + 32 q + w; B is decoded into shared memory once per window.
template <int CB_, bool BLOCKED, bool BF16>
struct W4A4 {
  using Cursor = ::Cursor<CB_, BLOCKED>;
  using Data = AChunk;
  using Acc = float[ROWS_PER_WARP];
  static constexpr int CB = CB_;
  static constexpr bool COLS = false;
  static constexpr bool OUT_BF16 = BF16;

  static __device__ __forceinline__ int first_chunk(int, int lane) { return lane; }
  static __device__ __forceinline__ int own_chunk(int) { return 0; }
  static __device__ __forceinline__ int row_residue(int warp, int) { return warp; }
  // NOTE: the row map of gemv_tiles.cuh, its additions in this kernel's tuned order: NVRTC 13.0
  // allocates registers by it (gemv16.cu's order costs the _k16 kernels a register).
  static __device__ __forceinline__ int row(int rc, int, int q, int r) {
    return (rc / 4) * 128 + 32 * q + (rc % 4) * 8 + r;
  }
  static __device__ __forceinline__ Cursor cursor(const GemvParams& p, int l, const int* row, int chunk) {
    return make_cursor<CB, BLOCKED>(p, l, row, chunk);
  }
  static __device__ __forceinline__ void stage(const GemvParams& p, u8* smem, int wc, const gemv_tiles::Tile& t,
                                               int c0, int c1, int chunks) {
    stage_b<CB, BLOCKED>(p, smem, wc, t.x_l, c0, min(c1, chunks));
  }
  static __device__ __forceinline__ void load(const Cursor& cur, AChunk& x, bool ok, u64 pol) {
    load_a<CB, BLOCKED>(cur, x, ok, pol);
  }
  static __device__ __forceinline__ void compute(const gemv_tiles::Tile&, const AChunk& x, const u8* smem, int wc,
                                                 int cl, float* acc) {
    ::compute<CB>(x, smem, wc, cl, acc);
  }
  // Lane 8q holds tile row 32 q + warp.
  static __device__ __forceinline__ gemv_tiles::Out reduce(const float* acc, int warp, int lane) {
    return {warp_reduce4(acc, lane), lane / 8, warp, 0, lane % 8 == 0};
  }
  static __device__ __forceinline__ double scale(const GemvParams& p, const gemv_tiles::Tile&) { return p.alpha; }
};

}  // namespace

// Kernels: 16 B chunks for K % 32 == 0, 8 B chunks (suffix _k16) for any K % 16 == 0; each in
// both scale layouts.
// NOTE: 256 threads, 2 CTAs (16 warps) per SM at <= 128 registers; double-buffered, 4 rows x
// 2 K-steps x 16 B per lane are in flight (64 KB of A per SM), well above the ~20 KB Little's
// law asks for at 3 TB/s. Measured on the H100 (2026-11-22, ncu PM sampling, 7168x16384x1): DRAM
// reads run at 82-94% of peak (the copy ceiling) in steady state; what is lost is the ~1.5 us
// ramp at the start and a ~2-3 us tail. Tried and dropped, none faster: a 4-stage cp.async ring
// (3x the bytes in flight), stream-K (every SM the same work), row-contiguous streaming, L2
// prefetches ahead of the loads (H200: 2-8 K-steps ahead and the next tile's head, 3-42% slower).
// The output type is a compile-time choice (`_bf16` kernels): as a runtime flag, every form of the
// f16/bf16 choice in the epilogue spilled 4-32 B at the 128-register bound (NVRTC 13.0), and a
// noinline store call that avoided it measured 5-15% slower (H200, `nvfp4 bench gemv`).
#define GEMV_KERNEL(name, CB, BLOCKED, BF16)                                                       \
  extern "C" __global__ void __launch_bounds__(THREADS, 2) name(const __grid_constant__ GemvParams p) { \
    gemv_tiles::run<W4A4<CB, BLOCKED, BF16>>(p);                                                   \
  }

GEMV_KERNEL(gemv_nvfp4_sm90_plain, 16, false, false)
GEMV_KERNEL(gemv_nvfp4_sm90_blocked, 16, true, false)
GEMV_KERNEL(gemv_nvfp4_sm90_plain_k16, 8, false, false)
GEMV_KERNEL(gemv_nvfp4_sm90_blocked_k16, 8, true, false)
GEMV_KERNEL(gemv_nvfp4_sm90_plain_bf16, 16, false, true)
GEMV_KERNEL(gemv_nvfp4_sm90_blocked_bf16, 16, true, true)
GEMV_KERNEL(gemv_nvfp4_sm90_plain_k16_bf16, 8, false, true)
GEMV_KERNEL(gemv_nvfp4_sm90_blocked_k16_bf16, 8, true, true)
