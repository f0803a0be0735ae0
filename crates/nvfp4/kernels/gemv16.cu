// gemv16.cu: batched W4A16 GEMV (SPEC §8 with one activation row): c[l, n] =
// sum_k x[l, k] * W[l, n, k] * sfw[l, n, k/16], x f16 or bf16 [L, 1, K], W NVFP4 [L, N, K],
// f16 or bf16 out [L, N], FP32 accumulation, one rounding. Its `_cols` kernels take 2 to 8
// activation rows (the GEMM of few rows, W4A16 or W4A4: gemv16_cols.cuh), its `_moe` kernels the
// MoE form at decode sizes (gemv16_moe.cuh).
//
// Algorithm (a pure bandwidth problem: every byte of W is read once; x is tiny):
// - Tiles, K-steps, split-K, the persistent grid, PDL and the double buffer are gemv_tiles.cuh's
//   skeleton, shared with gemv.cu; this file is its W4A16 part (`W4A16`). A CTA tile is 32 rows
//   of one batch (rows 128*t + 32*q + 8*(tile%4) + g, q = 0..3, g = 0..7, so that in the blocked
//   scale layout a thread's 4 rows share one 16 B scale group); a K-step is 32 chunks of 16 B per
//   row (8 B when K % 32 == 16).
// - Thread (warp w, lane 4g + t) owns chunk 4w + t of every K-step for rows q = 0..3 of residue g:
//   warp w covers bytes [64w, 64w + 64) of the K-step's 512 B of each of the 32 rows, the 8 warps
//   the whole K-step. Its 4 rows are the rows g and g + 8 of two mma.sync m16n8k16 tiles.
// - Tensor cores do the multiply-add: A = 16 weight rows x 16 k, decoded in registers into the
//   activation's type with the block scale multiplied in (exact, nvfp4.cuh's W4A16 decoders); B =
//   16 k of x (every column the same; the k order is the decoders' pair order, which the staging
//   of x follows); D accumulates in f32 over the warp's whole K range. The four threads t of a row
//   group hold different chunks: the MMA sums them. Per weight element: ~1.5 (f16) or ~1.9 (bf16)
//   decode instructions, 0.5 multiply by the scale, 1/8 MMA.
// - x is staged once per window into shared memory in that pair order; a thread's B fragments
//   for a word are one 16 B shared load, the same address for the 8 threads of a chunk.
// - The 8 warps' partial sums of a row are added through shared memory in warp order, then the
//   row's total goes out (or, split, into the f32 partials of the skeleton's slice-order fixup).
// - Sums of exactly representable data are exact in f32 and the MMA's products are exact, so such
//   data gives the reference's result bit for bit.
#include "ptx.cuh"
#include "nvfp4.cuh"
#include "output.cuh"

// GemvParams (the W4A4 GEMV's: the weight is `a`, the activation `b`, N is `m`) and the sizes
// (namespace gemv16): generated.cuh, from their one definition (backend/cuda/kernels/gemv.rs and
// gemv16.rs), which the host's plan uses too.
#include "generated.cuh"
#include "gemv_tiles.cuh"
#include "gemv_stream.cuh"
#include "block_scan.cuh"

namespace {

using gemv16::KSTEP_CHUNKS;
using gemv16::STAGE_LOADS_PER_THREAD;
using gemv16::THREADS;
constexpr int WARPS = THREADS / 32;
constexpr int ROWS_PER_THREAD = 4;  // q = 0..3: rows g, g + 8 of MMA tiles 0 and 1
constexpr int CHUNKS_PER_WARP = KSTEP_CHUNKS / WARPS;
static_assert(WARPS == 8 && CHUNKS_PER_WARP == 4 && gemv16::ROWS_PER_CTA == 32, "thread map");

// Compile-time shape of one variant. CB = bytes of W per thread per row per K-step.
template <int CB>
struct Chunk {
  static constexpr int WORDS = CB / 4;   // packed words (8 elements each)
  static constexpr int BLOCKS = CB / 8;  // scale blocks (16 elements each)
  static constexpr int KSTEP_W = KSTEP_CHUNKS * CB;        // bytes of one W row per K-step
  static constexpr int KSTEP_SF = KSTEP_CHUNKS * BLOCKS;   // scale bytes of one row per K-step (plain)
  static constexpr int KSTEP_GROUPS = KSTEP_SF / 4 * 512;  // blocked: bytes per K-step
  static constexpr int X_BYTES = WORDS * 16;               // staged x per chunk: 8 elements per word
  static_assert(X_BYTES == gemv16::WindowChunk<CB>::BYTES, "stage_x's layout is the host's");
};

// The activation type's decoding. ABF16: x (and so the MMA) is bf16, else f16.
template <bool ABF16>
struct Act;

template <>
struct Act<false> {
  static constexpr double UNBIAS = nvfp4::W4A16_F16_UNBIAS;
  // The chunk's scale pairs, (s * 2^7, s * 2^7) per block (`scale_f16x2_x128`).
  template <int BLOCKS>
  static NVFP4_DEVICE void scales(u32 bytes, u32 (&sp)[BLOCKS]) {
    if (BLOCKS == 1) {
      sp[0] = nvfp4::scale_f16x2_x128(bytes & 0xFFu);
    } else {
      const u32 s01 = ptx::hmul2(ptx::cvt_e4m3x2_f16x2(bytes), 0x58005800u);  // 0x5800 = 128.0
      sp[0] = ptx::prmt(s01, s01, 0x1010u);
      sp[BLOCKS - 1] = ptx::prmt(s01, s01, 0x3232u);
    }
  }
  static NVFP4_DEVICE void word(u32 w, u32 s2, u32* out) { nvfp4::w4a16_f16x8(w, s2, out); }
  static NVFP4_DEVICE void mma(float* d, const u32* a, const u32* b) { ptx::mma_m16n8k16_f32<false>(d, a, b); }
};

template <>
struct Act<true> {
  static constexpr double UNBIAS = nvfp4::W4A16_BF16_UNBIAS;
  // The chunk's scale pairs, (s * 2^119, s * 2^119) per block (`w4a16_bf16_scale`).
  template <int BLOCKS>
  static NVFP4_DEVICE void scales(u32 bytes, u32 (&sp)[BLOCKS]) {
    const u32 s01 = nvfp4::e4m3x2_to_bf16x2(BLOCKS == 1 ? (bytes & 0xFFu) * 0x0101u : bytes);
#pragma unroll
    for (int b = 0; b < BLOCKS; ++b) sp[b] = nvfp4::w4a16_bf16_scale(s01, b);
  }
  static NVFP4_DEVICE void word(u32 w, u32 s2, u32* out) { nvfp4::w4a16_bf16x8(w, s2, out); }
  static NVFP4_DEVICE void mma(float* d, const u32* a, const u32* b) { ptx::mma_m16n8k16_f32<true>(d, a, b); }
};

// 8 activation elements in K order (x0 x1, x2 x3, x4 x5, x6 x7) as the decoders' pairs
// (x0 x4, x1 x5, x2 x6, x3 x7).
__device__ __forceinline__ uint4 pair_order(uint4 x) {
  return make_uint4(ptx::prmt(x.x, x.z, 0x5410u), ptx::prmt(x.x, x.z, 0x7632u), ptx::prmt(x.y, x.w, 0x5410u),
                    ptx::prmt(x.y, x.w, 0x7632u));
}

// Stages x chunks [c0, c1) of batch l into shared memory: xs[word][chunk] : [WORDS, WC, 16 B],
// the 8 elements of word `word` of chunk `chunk` as the pairs (x0, x4), (x1, x5), (x2, x6),
// (x3, x7), the order of the decoders. Chunks past K (the window's last K-step) are zero, so a
// thread past K multiplies zeros by zeros.
// NOTE: every thread issues all its loads (at most STAGE_LOADS_PER_THREAD; the host keeps windows
// within that) before storing any: one load latency per window.
template <int CB>
__device__ void stage_x(const GemvParams& p, u8* smem, int wc, int l, int c0, int c1, int chunks) {
  using C = Chunk<CB>;
  const u8* xl = p.b + (i64)l * p.k * 2;
  const int pieces = (c1 - c0) * C::WORDS, valid = (min(c1, chunks) - c0) * C::WORDS;
  uint4 v[STAGE_LOADS_PER_THREAD];
#pragma unroll
  for (int n = 0; n < STAGE_LOADS_PER_THREAD; ++n) {
    const int i = threadIdx.x + n * THREADS;
    v[n] = i < valid ? ptx::ld_nc_v4(xl + ((i64)c0 * C::WORDS + i) * 16) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int n = 0; n < STAGE_LOADS_PER_THREAD; ++n) {
    const int i = threadIdx.x + n * THREADS;
    if (i >= pieces) break;
    *reinterpret_cast<uint4*>(smem + ((i % C::WORDS) * wc + i / C::WORDS) * 16) = pair_order(v[n]);
  }
}

// Where one thread reads W and its scales, for its 4 rows; advanced one K-step at a time. Rows
// past N are clamped to row N-1 (valid memory, results discarded), so loads need no per-row
// predicate. One pointer per array and 32-bit offsets of the other rows keep registers for the
// double buffer (a batch of W is below 2^31 bytes: the host checks).
template <int CB, bool BLOCKED>
struct Cursor {
  const u8* w;                      // this thread's chunk of row q = 0
  const u8* sf;                     // plain: the chunk's scale bytes of row 0; blocked: the 16 B group
  const u8* sfc;                    // plain: the 8 scale bytes of its warp's 4 chunks that this lane
                                    // copies in the ring for its warp (row slot `lane`, `warp_copies`)
  i32 w_off[ROWS_PER_THREAD];       // rows q: bytes from row 0 ([0] = 0)
  i32 sf_off[ROWS_PER_THREAD];      // plain: the same for scales
  int sf_shift;                     // blocked: bit offset of this chunk's scales in its 4-byte word

  __device__ __forceinline__ void advance() {
    using C = Chunk<CB>;
    w += C::KSTEP_W;
    sf += BLOCKED ? C::KSTEP_GROUPS : C::KSTEP_SF;
    if (!BLOCKED) sfc += C::KSTEP_SF;
  }
};

template <int CB, bool BLOCKED>
__device__ __forceinline__ Cursor<CB, BLOCKED> make_cursor(const GemvParams& p, int l, const int* row, int chunk) {
  using C = Chunk<CB>;
  Cursor<CB, BLOCKED> cur;
  const int sf_cols = p.k / 16;
  const int j = chunk * C::BLOCKS;
  const int r0 = min(row[0], p.m - 1);
  const i64 first = (i64)l * p.m + r0;
  cur.w = p.a + first * (p.k / 2) + (i64)chunk * CB;
  cur.sf = BLOCKED ? p.sfa + nvfp4::scale_offset(true, p.m, sf_cols, r0, j & ~3, l) : p.sfa + first * sf_cols + j;
#pragma unroll
  for (int q = 0; q < ROWS_PER_THREAD; ++q) {
    const int dr = min(row[q], p.m - 1) - r0;
    cur.w_off[q] = dr * (p.k / 2);
    cur.sf_off[q] = dr * sf_cols;
  }
  // Blocked: the 4 rows differ only in (i % 128) / 32 = q, so one 16 B group holds all their
  // scales, 4 bytes per row, scale columns 4 * (j / 4) .. + 3.
  cur.sf_shift = 8 * (j & 3);
  // Plain: lane L copies for its warp the row slot (q, g) = (L / 8, L % 8), the tile's row
  // row[0] - g + 32 q + g' (rows 32 q + g from one first row), from its warp's first chunk on.
  if (!BLOCKED) {
    const int lane = threadIdx.x % 32;
    const int crow = min(row[0] - lane / 4 + 32 * (lane / 8) + lane % 8, p.m - 1);
    cur.sfc = p.sfa + ((i64)l * p.m + crow) * sf_cols + (j & ~7);
  }
  return cur;
}

// One K-step's W data of one thread: its chunk of each of its 4 rows, and their scales. Zero
// past K (zero values and zero scales decode to +0).
struct WChunk {
  uint4 v[ROWS_PER_THREAD];  // CB bytes used
  u32 s[ROWS_PER_THREAD];    // the chunk's scale bytes, low byte first
};

template <int CB, bool BLOCKED>
__device__ __forceinline__ void load_w(const Cursor<CB, BLOCKED>& cur, WChunk& x, bool ok, u64 pol) {
#pragma unroll
  for (int q = 0; q < ROWS_PER_THREAD; ++q) {
    x.v[q] = make_uint4(0, 0, 0, 0);
    x.s[q] = 0;
  }
  if (!ok) return;
#pragma unroll
  for (int q = 0; q < ROWS_PER_THREAD; ++q) {
    const u8* w = cur.w + cur.w_off[q];
    if (CB == 16) {
      x.v[q] = ptx::ld_stream_v4(w, pol);
    } else {
      const uint2 h = ptx::ld_stream_v2(w, pol);
      x.v[q].x = h.x;
      x.v[q].y = h.y;
    }
    if (!BLOCKED) x.s[q] = CB == 16 ? ptx::ld_nc_u16(cur.sf + cur.sf_off[q]) : ptx::ld_nc_u8(cur.sf + cur.sf_off[q]);
  }
  if (BLOCKED) {
    const uint4 g = ptx::ld_nc_v4(cur.sf);
    const u32 w[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
    for (int q = 0; q < ROWS_PER_THREAD; ++q) x.s[q] = (w[q] >> cur.sf_shift) & (CB == 16 ? 0xFFFFu : 0xFFu);
  }
}

// ---- The weight ring of the `_moe` kernels (gemv_stream.cuh): each thread copies its own K-step
// data (load_w's bytes) with cp.async into its slots of a ring stage and reads them back itself,
// so no barrier guards a stage. A stage: W [q][THREADS] x 16 B, then the scales, [THREADS] x 16 B
// (blocked: the thread's 16 B group) or plain: where K % 128 == 0 (`warp_copies`) [warp][32 row
// slots] x 8 B, each warp's 4 chunks of its 32 rows, one 8-byte copy per lane, read across the
// warp after a warp barrier; else [q][THREADS] x 4 B, the aligned word holding the chunk's 2
// bytes (two threads copy each word: 11-18% slower than the blocked layout, NOTES.md "Session
// 17"). 16 B chunks only (K % 32 == 0).
constexpr int RING_STAGE_BYTES = THREADS * (ROWS_PER_THREAD * 16 + 16);
static_assert(8 * 32 * 8 <= THREADS * 16, "the warps' plain scale slots fit the stage's scale part");

// Plain scales copied per warp: every row's scales start 8-byte aligned (K / 16 % 8 == 0), and a
// warp's 4 chunks are all inside K or all past it (chunks % 4 == 0).
__device__ __forceinline__ bool warp_copies(const GemvParams& p) { return p.k % 128 == 0; }

template <bool BLOCKED>
__device__ __forceinline__ void issue_w(const GemvParams& p, const Cursor<16, BLOCKED>& cur, u32 stage, bool ok,
                                       u64 pol) {
  const u32 slot = stage + threadIdx.x * 16;
  const u32 sf = stage + ROWS_PER_THREAD * THREADS * 16;
  if (!ok) {  // past K: zeros (zero values and zero scales decode to +0), as load_w
#pragma unroll
    for (int q = 0; q < ROWS_PER_THREAD; ++q) ptx::sts_v4(slot + q * THREADS * 16, 0u, 0u, 0u, 0u);
    if (BLOCKED) {
      ptx::sts_v4(sf + threadIdx.x * 16, 0u, 0u, 0u, 0u);
    } else if (warp_copies(p)) {
      ptx::sts_u32(sf + threadIdx.x * 8, 0u);
      ptx::sts_u32(sf + threadIdx.x * 8 + 4, 0u);
    } else {
#pragma unroll
      for (int q = 0; q < ROWS_PER_THREAD; ++q) ptx::sts_u32(sf + (q * THREADS + threadIdx.x) * 4, 0u);
    }
    return;
  }
#pragma unroll
  for (int q = 0; q < ROWS_PER_THREAD; ++q) ptx::cp_async_16(slot + q * THREADS * 16, cur.w + cur.w_off[q], pol);
  if (BLOCKED) {
    ptx::cp_async_16_plain(sf + threadIdx.x * 16, cur.sf);
  } else if (warp_copies(p)) {
    ptx::cp_async_8(sf + threadIdx.x * 8, cur.sfc);  // row slot `lane` of the warp's [32] x 8 B
  } else {
    // The aligned word holding the 2 bytes, unless it reaches outside the scales (their first
    // pair at a half word, or their last pair at a word's start): then those 2 bytes alone, loaded
    // and stored by this thread (ring_info's half is the same either way).
    const u64 lo = reinterpret_cast<u64>(p.sfa), hi = lo + (u64)p.l * p.m * (p.k / 16);
#pragma unroll
    for (int q = 0; q < ROWS_PER_THREAD; ++q) {
      const u8* a = cur.sf + cur.sf_off[q];
      const u64 word = reinterpret_cast<u64>(a) & ~(u64)3;
      const u32 dst = sf + (q * THREADS + threadIdx.x) * 4;
      if (word >= lo && word + 4 <= hi) {
        ptx::cp_async_4(dst, reinterpret_cast<const void*>(word));
      } else {
        ptx::sts_u32(dst, ptx::ld_nc_u16(a) << (16 * ((reinterpret_cast<u64>(a) >> 1) & 1)));
      }
    }
  }
}

// What the read-back needs of a tile (constant over its K-steps: a K-step moves the scales by a
// multiple of 4 bytes): blocked, the bit offset of the chunk's scales in its row's word; plain,
// WARP_COPIES when the warp copies its scales together, else bit q set when row q's 2 bytes are
// the high half of their aligned word.
constexpr u32 WARP_COPIES = 1u << 31;
template <bool BLOCKED>
__device__ __forceinline__ u32 ring_info(const GemvParams& p, const Cursor<16, BLOCKED>& cur) {
  if (BLOCKED) return cur.sf_shift;
  if (warp_copies(p)) return WARP_COPIES;
  u32 info = 0;
#pragma unroll
  for (int q = 0; q < ROWS_PER_THREAD; ++q)
    info |= (u32)((reinterpret_cast<u64>(cur.sf + cur.sf_off[q]) >> 1) & 1) << q;
  return info;
}

template <bool BLOCKED>
__device__ __forceinline__ void fetch_w(const u8* stage, u32 info, WChunk& x) {
#pragma unroll
  for (int q = 0; q < ROWS_PER_THREAD; ++q)
    x.v[q] = *reinterpret_cast<const uint4*>(stage + (q * THREADS + threadIdx.x) * 16);
  const u8* sf = stage + ROWS_PER_THREAD * THREADS * 16;
  if (BLOCKED) {
    const uint4 g = *reinterpret_cast<const uint4*>(sf + threadIdx.x * 16);
    const u32 w[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
    for (int q = 0; q < ROWS_PER_THREAD; ++q) x.s[q] = (w[q] >> info) & 0xFFFFu;
  } else if (info == WARP_COPIES) {
    // Row slot (q, g) of the warp's [32] x 8 B holds chunks 4w .. 4w + 3: this lane's 2 bytes at
    // 2 t. Other lanes copied them: every lane has waited for its own copies, then the barrier.
    __syncwarp();
    const u8* mine = sf + (threadIdx.x / 32) * 256 + (threadIdx.x % 32 / 4) * 8 + (threadIdx.x % 4) * 2;
#pragma unroll
    for (int q = 0; q < ROWS_PER_THREAD; ++q) x.s[q] = *reinterpret_cast<const u16*>(mine + q * 64);
  } else {
#pragma unroll
    for (int q = 0; q < ROWS_PER_THREAD; ++q)
      x.s[q] = (*reinterpret_cast<const u32*>(sf + (q * THREADS + threadIdx.x) * 4) >> (16 * ((info >> q) & 1))) & 0xFFFFu;
  }
}

// d[u] += MMA tile u's products for one K-step: rows q = 2u (A rows g) and 2u + 1 (A rows g + 8).
template <int CB, bool ABF16>
__device__ __forceinline__ void compute(const WChunk& x, const u8* xs, int wc, int cl, float (&d)[2][4]) {
  using C = Chunk<CB>;
  using A = Act<ABF16>;
  u32 sp[ROWS_PER_THREAD][C::BLOCKS];
#pragma unroll
  for (int q = 0; q < ROWS_PER_THREAD; ++q) A::template scales<C::BLOCKS>(x.s[q], sp[q]);
#pragma unroll
  for (int i = 0; i < C::WORDS; ++i) {
    // B fragments: b0 = the x pair of k 2t, 2t+1 (A's a0, a1), b1 = of k 2t+8, 2t+9 (a2, a3).
    const uint4 b = *reinterpret_cast<const uint4*>(xs + (i * wc + cl) * 16);
    const u32 b_lo[2] = {b.x, b.y}, b_hi[2] = {b.z, b.w};
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      u32 a[2][4];  // rows q = 2u, 2u + 1: (e0,e4), (e1,e5), (e2,e6), (e3,e7)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int q = 2 * u + h;
        const u32 v[4] = {x.v[q].x, x.v[q].y, x.v[q].z, x.v[q].w};
        A::word(v[i], sp[q][i / 2], a[h]);
      }
      const u32 lo[4] = {a[0][0], a[1][0], a[0][1], a[1][1]};
      const u32 hi[4] = {a[0][2], a[1][2], a[0][3], a[1][3]};
      A::mma(d[u], lo, b_lo);
      A::mma(d[u], hi, b_hi);
    }
  }
}

// The W4A16 family's part of the skeleton (gemv_tiles.cuh): thread (warp w, lane 4g + t) takes
// chunk 4w + t of every K-step for rows row0 + 32 q + g; x is staged into shared memory once per
// window; the 8 warps' sums of a row are added through shared memory in warp order.
template <int CB_, bool BLOCKED, bool ABF16, bool OBF16>
struct W4A16 {
  using Cursor = ::Cursor<CB_, BLOCKED>;
  using Data = WChunk;
  using Acc = float[2][4];  // the two MMA tiles' D fragments
  static constexpr int CB = CB_;
  static constexpr bool COLS = false;
  static constexpr bool OUT_BF16 = OBF16;

  static __device__ __forceinline__ int first_chunk(int warp, int) { return CHUNKS_PER_WARP * warp; }
  static __device__ __forceinline__ int own_chunk(int lane) { return lane % 4; }
  static __device__ __forceinline__ int row_residue(int, int lane) { return lane / 4; }
  // NOTE: the row map of gemv_tiles.cuh, its additions in this kernel's tuned order: NVRTC 13.0
  // allocates registers by it (gemv.cu's order costs the _k16 kernels 2-4 registers).
  template <class I>
  static __device__ __forceinline__ int row(int, int row0, I q, I r) {
    return row0 + (32 * q + r);
  }
  static __device__ __forceinline__ Cursor cursor(const GemvParams& p, int l, const int* row, int chunk) {
    return make_cursor<CB, BLOCKED>(p, l, row, chunk);
  }
  static __device__ __forceinline__ void stage(const GemvParams& p, u8* smem, int wc, const gemv_tiles::Tile& t,
                                               int c0, int c1, int chunks) {
    stage_x<CB>(p, smem, wc, t.x_l, c0, c1, chunks);
  }
  static __device__ __forceinline__ void load(const Cursor& cur, WChunk& x, bool ok, u64 pol) {
    load_w<CB, BLOCKED>(cur, x, ok, pol);
  }
  // The weight ring's part (gemv_stream.cuh; 16 B chunks only).
  static constexpr int RING_STAGE_BYTES = ::RING_STAGE_BYTES;
  static __device__ __forceinline__ void issue(const GemvParams& p, const Cursor& cur, u32 stage, bool ok, u64 pol) {
    issue_w<BLOCKED>(p, cur, stage, ok, pol);
  }
  static __device__ __forceinline__ u32 ring_info(const GemvParams& p, const Cursor& cur) {
    return ::ring_info<BLOCKED>(p, cur);
  }
  static __device__ __forceinline__ void fetch(const u8* stage, u32 info, WChunk& x) { fetch_w<BLOCKED>(stage, info, x); }
  static __device__ __forceinline__ void compute(const gemv_tiles::Tile&, const WChunk& x, const u8* xs, int wc,
                                                 int cl, float (&d)[2][4]) {
    ::compute<CB, ABF16>(x, xs, wc, cl, d);
  }
  // Every column of D holds the same sums: lanes t == 0 give tile u's rows g (d[u][0], row
  // q = 2u) and g + 8 (d[u][2], q = 2u + 1); thread i < 32 adds tile row i (q = i / 8,
  // g = i % 8) over the warps, in warp order.
  static __device__ __forceinline__ gemv_tiles::Out reduce(const float (&d)[2][4], int warp, int lane) {
    __shared__ float s_part[WARPS][gemv16::ROWS_PER_CTA];  // [warp][row of the tile], f32
    const int g = lane / 4, t = lane % 4;
    if (t == 0) {
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        s_part[warp][8 * (2 * u) + g] = d[u][0];
        s_part[warp][8 * (2 * u + 1) + g] = d[u][2];
      }
    }
    __syncthreads();
    float total = 0.f;
    if (threadIdx.x < gemv16::ROWS_PER_CTA) {
#pragma unroll
      for (int w = 0; w < WARPS; ++w) total += s_part[w][threadIdx.x];
    }
    __syncthreads();  // s_part is free for the next tile
    return {total, (int)(threadIdx.x / 8), (int)(threadIdx.x % 8), 0, threadIdx.x < gemv16::ROWS_PER_CTA};
  }
  static __device__ __forceinline__ double scale(const GemvParams& p, const gemv_tiles::Tile&) {
    return p.alpha * Act<ABF16>::UNBIAS;
  }
};

#include "gemv16_cols.cuh"  // the `_cols` kernels' part (2 to 8 activation rows)
#include "gemv16_moe.cuh"   // the `_moe` kernels' part (the MoE form at decode sizes)

}  // namespace

// Kernels: activation f16 or bf16 x scale layout x 16 B chunks (K % 32 == 0) or 8 B chunks
// (suffix _k16, any K % 16 == 0) x output f16 or bf16 (`_to_bf16`; a compile-time choice, as in
// gemv.cu, whose note says why).
// NOTE: 256 threads, 2 CTAs (16 warps) per SM at <= 128 registers; double-buffered, 4 rows x
// 2 K-steps x 16 B per thread in flight, as gemv.cu.
#define GEMV16_KERNEL(name, CB, BLOCKED, ABF16, OBF16)                                                \
  extern "C" __global__ void __launch_bounds__(THREADS, 2) name(const __grid_constant__ GemvParams p) { \
    gemv_tiles::run<W4A16<CB, BLOCKED, ABF16, OBF16>>(p);                                              \
  }
// The `_cols` kernels (2 to 8 activation rows), the same variants.
#define GEMV16_COLS_KERNEL(name, CB, BLOCKED, ABF16, OBF16)                                           \
  extern "C" __global__ void __launch_bounds__(THREADS, 2) name(const __grid_constant__ GemvParams p) { \
    gemv_tiles::run<W4A16Cols<CB, BLOCKED, ABF16, OBF16>>(p);                                          \
  }

GEMV16_KERNEL(gemv16_nvfp4_sm90_f16_plain_to_f16, 16, false, false, false)
GEMV16_KERNEL(gemv16_nvfp4_sm90_f16_blocked_to_f16, 16, true, false, false)
GEMV16_KERNEL(gemv16_nvfp4_sm90_f16_plain_k16_to_f16, 8, false, false, false)
GEMV16_KERNEL(gemv16_nvfp4_sm90_f16_blocked_k16_to_f16, 8, true, false, false)
GEMV16_KERNEL(gemv16_nvfp4_sm90_f16_plain_to_bf16, 16, false, false, true)
GEMV16_KERNEL(gemv16_nvfp4_sm90_f16_blocked_to_bf16, 16, true, false, true)
GEMV16_KERNEL(gemv16_nvfp4_sm90_f16_plain_k16_to_bf16, 8, false, false, true)
GEMV16_KERNEL(gemv16_nvfp4_sm90_f16_blocked_k16_to_bf16, 8, true, false, true)
GEMV16_KERNEL(gemv16_nvfp4_sm90_bf16_plain_to_f16, 16, false, true, false)
GEMV16_KERNEL(gemv16_nvfp4_sm90_bf16_blocked_to_f16, 16, true, true, false)
GEMV16_KERNEL(gemv16_nvfp4_sm90_bf16_plain_k16_to_f16, 8, false, true, false)
GEMV16_KERNEL(gemv16_nvfp4_sm90_bf16_blocked_k16_to_f16, 8, true, true, false)
GEMV16_KERNEL(gemv16_nvfp4_sm90_bf16_plain_to_bf16, 16, false, true, true)
GEMV16_KERNEL(gemv16_nvfp4_sm90_bf16_blocked_to_bf16, 16, true, true, true)
GEMV16_KERNEL(gemv16_nvfp4_sm90_bf16_plain_k16_to_bf16, 8, false, true, true)
GEMV16_KERNEL(gemv16_nvfp4_sm90_bf16_blocked_k16_to_bf16, 8, true, true, true)
GEMV16_COLS_KERNEL(gemv16_nvfp4_sm90_f16_plain_to_f16_cols, 16, false, false, false)
GEMV16_COLS_KERNEL(gemv16_nvfp4_sm90_f16_blocked_to_f16_cols, 16, true, false, false)
GEMV16_COLS_KERNEL(gemv16_nvfp4_sm90_f16_plain_k16_to_f16_cols, 8, false, false, false)
GEMV16_COLS_KERNEL(gemv16_nvfp4_sm90_f16_blocked_k16_to_f16_cols, 8, true, false, false)
GEMV16_COLS_KERNEL(gemv16_nvfp4_sm90_f16_plain_to_bf16_cols, 16, false, false, true)
GEMV16_COLS_KERNEL(gemv16_nvfp4_sm90_f16_blocked_to_bf16_cols, 16, true, false, true)
GEMV16_COLS_KERNEL(gemv16_nvfp4_sm90_f16_plain_k16_to_bf16_cols, 8, false, false, true)
GEMV16_COLS_KERNEL(gemv16_nvfp4_sm90_f16_blocked_k16_to_bf16_cols, 8, true, false, true)
GEMV16_COLS_KERNEL(gemv16_nvfp4_sm90_bf16_plain_to_f16_cols, 16, false, true, false)
GEMV16_COLS_KERNEL(gemv16_nvfp4_sm90_bf16_blocked_to_f16_cols, 16, true, true, false)
GEMV16_COLS_KERNEL(gemv16_nvfp4_sm90_bf16_plain_k16_to_f16_cols, 8, false, true, false)
GEMV16_COLS_KERNEL(gemv16_nvfp4_sm90_bf16_blocked_k16_to_f16_cols, 8, true, true, false)
GEMV16_COLS_KERNEL(gemv16_nvfp4_sm90_bf16_plain_to_bf16_cols, 16, false, true, true)
GEMV16_COLS_KERNEL(gemv16_nvfp4_sm90_bf16_blocked_to_bf16_cols, 16, true, true, true)
GEMV16_COLS_KERNEL(gemv16_nvfp4_sm90_bf16_plain_k16_to_bf16_cols, 8, false, true, true)
GEMV16_COLS_KERNEL(gemv16_nvfp4_sm90_bf16_blocked_k16_to_bf16_cols, 8, true, true, true)
// The W4A4 `_cols` kernels: NVFP4 activation rows decoded to f16, the weights' scale layout.
#define GEMV4_COLS_KERNEL(name, CB, BLOCKED, OBF16)                                                    \
  extern "C" __global__ void __launch_bounds__(THREADS, 2) name(const __grid_constant__ GemvParams p) { \
    gemv_tiles::run<W4A4Cols<CB, BLOCKED, OBF16>>(p);                                                  \
  }
GEMV4_COLS_KERNEL(gemv16_nvfp4_sm90_nvfp4_plain_to_f16_cols, 16, false, false)
GEMV4_COLS_KERNEL(gemv16_nvfp4_sm90_nvfp4_blocked_to_f16_cols, 16, true, false)
GEMV4_COLS_KERNEL(gemv16_nvfp4_sm90_nvfp4_plain_k16_to_f16_cols, 8, false, false)
GEMV4_COLS_KERNEL(gemv16_nvfp4_sm90_nvfp4_blocked_k16_to_f16_cols, 8, true, false)
GEMV4_COLS_KERNEL(gemv16_nvfp4_sm90_nvfp4_plain_to_bf16_cols, 16, false, true)
GEMV4_COLS_KERNEL(gemv16_nvfp4_sm90_nvfp4_blocked_to_bf16_cols, 16, true, true)
GEMV4_COLS_KERNEL(gemv16_nvfp4_sm90_nvfp4_plain_k16_to_bf16_cols, 8, false, true)
GEMV4_COLS_KERNEL(gemv16_nvfp4_sm90_nvfp4_blocked_k16_to_bf16_cols, 8, true, true)
// The `_moe` kernels (the MoE form, K % 32 == 0): 16-bit or NVFP4 tokens, the weights' scale
// layout, f16 or bf16 output.
#define GEMV16_MOE_KERNEL(name, ...)                                                                \
  extern "C" __global__ void __launch_bounds__(THREADS, 2) name(const __grid_constant__ GemvParams p) { \
    moe_walk::run<__VA_ARGS__>(p);                                                                  \
  }
GEMV16_MOE_KERNEL(gemv16_nvfp4_sm90_f16_plain_to_f16_moe, W4A16Moe<16, false, false, false>)
GEMV16_MOE_KERNEL(gemv16_nvfp4_sm90_f16_blocked_to_f16_moe, W4A16Moe<16, true, false, false>)
GEMV16_MOE_KERNEL(gemv16_nvfp4_sm90_f16_plain_to_bf16_moe, W4A16Moe<16, false, false, true>)
GEMV16_MOE_KERNEL(gemv16_nvfp4_sm90_f16_blocked_to_bf16_moe, W4A16Moe<16, true, false, true>)
GEMV16_MOE_KERNEL(gemv16_nvfp4_sm90_bf16_plain_to_f16_moe, W4A16Moe<16, false, true, false>)
GEMV16_MOE_KERNEL(gemv16_nvfp4_sm90_bf16_blocked_to_f16_moe, W4A16Moe<16, true, true, false>)
GEMV16_MOE_KERNEL(gemv16_nvfp4_sm90_bf16_plain_to_bf16_moe, W4A16Moe<16, false, true, true>)
GEMV16_MOE_KERNEL(gemv16_nvfp4_sm90_bf16_blocked_to_bf16_moe, W4A16Moe<16, true, true, true>)
GEMV16_MOE_KERNEL(gemv16_nvfp4_sm90_nvfp4_plain_to_f16_moe, W4A4Moe<16, false, false>)
GEMV16_MOE_KERNEL(gemv16_nvfp4_sm90_nvfp4_blocked_to_f16_moe, W4A4Moe<16, true, false>)
GEMV16_MOE_KERNEL(gemv16_nvfp4_sm90_nvfp4_plain_to_bf16_moe, W4A4Moe<16, false, true>)
GEMV16_MOE_KERNEL(gemv16_nvfp4_sm90_nvfp4_blocked_to_bf16_moe, W4A4Moe<16, true, true>)
