// gemv16_moe.cuh: the MoE form on the `_cols` kernels (the `_moe` kernels), for decode-sized
// routings (a few rows per expert). Included by gemv16.cu inside its anonymous namespace, after
// gemv16_cols.cuh.
//
// The operands are the MoE form's: tokens [1, T, K] sorted by expert (16-bit, or NVFP4 in the
// weights' scale layout), weights [E, N, K] (matrix batch l = expert l), the experts' end rows
// `offsets` [E] on the device (never read by the host), output [1, T, N]. Each CTA reads the
// offsets once (after the launch's wait: the routing may come from the previous kernel) and lays
// out in shared memory the segments: expert e's rows in groups of at most MAX_COLS, one group per
// pass of the MMA's 8 columns. The tiles are (segment, row tile), segment-major, so that a CTA's
// consecutive tiles share their segment's staged rows; CTA b takes tiles [b * per, (b + 1) * per)
// of the launch's segments x row_ctas. An empty expert has no segment and costs nothing; the
// whole K of a tile is one CTA's (no split-K: the experts' tiles fill the GPU at decode sizes).
// The host never learns how many tiles there are: the grid is one wave, and a CTA past the
// tiles returns. An expert's K is a few K-steps, so the weights go through gemv_stream.cuh's ring
// (RING_STAGES - 1 K-steps in flight per thread across tile edges) rather than gemv_tiles.cuh's
// register double buffer: measured on the H200 (NOTES.md, "Session 16") 0.85-0.9x the time at
// Qwen3-30B-A3B's and DeepSeek-V3's decode routings, 1.05-1.07x on single tiles of 7 or more
// K-steps; 4 stages ran slower than 3.
#pragma once

namespace moe_walk {

using gemv16::MAX_COLS;
using gemv16::MOE_MAX_EXPERTS;
constexpr int EXPERTS_PER_THREAD = (MOE_MAX_EXPERTS + THREADS - 1) / THREADS;
// The dynamic shared memory (gemv16::MOE_SMEM_BYTES, the host's): the weight ring
// (gemv_stream.cuh), RING_STAGES - 1 K-steps in flight per thread, then the window of the tokens.
constexpr int RING_STAGES = 3;
constexpr int RING_BYTES = RING_STAGES * RING_STAGE_BYTES;
constexpr int WINDOW_BYTES = gemv16::MOE_SMEM_BYTES - RING_BYTES;
static_assert(WINDOW_BYTES >= MAX_COLS * (KSTEP_CHUNKS * Chunk<16>::X_BYTES + gemv16::COLS_ROW_PAD),
              "a window holds one K-step of 8 rows");

// The expert table of one CTA: seg[e] = segments of the experts before e (seg[E] = all of
// them); lo[e] = expert e's first row and lo[e + 1] its end, clamped into the T tokens as the
// grouped launch clamps them (offsets come from the device unchecked: no value reads or writes
// outside the operands; the rows of decreasing offsets are unspecified).
struct Table {
  int seg[MOE_MAX_EXPERTS + 1];
  int lo[MOE_MAX_EXPERTS + 1];
};

// Fills the table from p.offsets (E = p.l experts, T = p.cols tokens); every thread calls it.
__device__ __forceinline__ void build(const GemvParams& p, Table& tb) {
  const int e_count = p.l, t_count = p.cols;
  const int e0 = threadIdx.x * EXPERTS_PER_THREAD;
  int seg[EXPERTS_PER_THREAD], sum = 0;
#pragma unroll
  for (int j = 0; j < EXPERTS_PER_THREAD; ++j) {
    const int e = e0 + j;
    seg[j] = 0;
    if (e < e_count) {
      const int lo = e == 0 ? 0 : min(max(p.offsets[e - 1], 0), t_count);
      const int hi = min(max(p.offsets[e], lo), t_count);
      tb.lo[e] = lo;
      if (e == e_count - 1) tb.lo[e_count] = min(max(p.offsets[e], 0), t_count);
      seg[j] = (hi - lo + MAX_COLS - 1) / MAX_COLS;
      sum += seg[j];
    }
  }
  int total;
  int run = block_scan<THREADS>(sum, total);
#pragma unroll
  for (int j = 0; j < EXPERTS_PER_THREAD; ++j) {
    if (e0 + j < e_count) tb.seg[e0 + j] = run;
    run += seg[j];
  }
  if (threadIdx.x == 0) tb.seg[e_count] = total;
  __syncthreads();
}

// The activation window of a segment of `cols` rows: the whole K when it fits WINDOW_BYTES,
// else as many K-steps as fit (K::CB bytes of weights per chunk: 4 CB bytes of
// activations per row).
template <int CB>
__device__ __forceinline__ int window_ksteps(int cols, int ksteps) {
  const int per_kstep = cols * KSTEP_CHUNKS * Chunk<CB>::X_BYTES;
  return max(1, min(ksteps, (WINDOW_BYTES - cols * gemv16::COLS_ROW_PAD) / per_kstep));
}

// Expert l's factor: the one alpha (p.alpha), or (alpha_l[l] * global(A)) * global(B) in f32,
// the reference's order (round to nearest, no contraction), as the grouped launch forms it.
__device__ __forceinline__ double alpha_of(const GemvParams& p, int l) {
  if (p.alpha_l == nullptr) return p.alpha;
  return (double)__fmul_rn(__fmul_rn(__uint_as_float(ptx::ld_nc_u32(p.alpha_l + l)), p.global[0]), p.global[1]);
}

// The tiles (segment s, row tile rc), segment-major, in the order a CTA walks them; e is the
// expert of segment s: the last e with seg[e] <= s (an empty expert's seg equals the next one's,
// so the last of equal entries is the one holding s).
struct Walker {
  const Table* tb;
  int row_ctas, e_count, ksteps;
  int s, rc, e;

  __device__ __forceinline__ void find_expert() {
    int lo = 0, hi = e_count;
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (tb->seg[mid] <= s) lo = mid; else hi = mid;
    }
    e = lo;
  }
  __device__ __forceinline__ void next() {
    if (++rc < row_ctas) return;
    rc = 0;
    ++s;
    while (e + 1 < e_count && tb->seg[e + 1] <= s) ++e;
  }
  __device__ __forceinline__ gemv_tiles::Tile tile() const {
    gemv_tiles::Tile t;
    t.rc = rc;
    t.l = e;
    t.slice = 0;
    t.ks0 = 0;
    t.ks1 = ksteps;
    t.x_l = 0;
    t.x_r0 = tb->lo[e] + (s - tb->seg[e]) * MAX_COLS;
    t.cols = min(MAX_COLS, max(tb->lo[e + 1], tb->lo[e]) - t.x_r0);
    return t;
  }
};

template <class K>
__device__ void run(const GemvParams& p) {
  __shared__ Table tb;
  ptx::wait_prerequisites();  // the offsets and alphas may be the previous kernel's output
  build(p, tb);
  const int e_count = p.l;
  const int ksteps = (p.k / 2 / K::CB + KSTEP_CHUNKS - 1) / KSTEP_CHUNKS;
  const int tiles = tb.seg[e_count] * p.row_ctas;
  const int per = (tiles + gridDim.x - 1) / gridDim.x;
  // CTA b takes tiles [i0, i0 + count): its first tile's segment and row tile from one division,
  // its expert from one search, then each next tile by increments (the walk's copy side and
  // compute side each step their own Walker).
  const int i0 = blockIdx.x * per, count = max(0, min(per, tiles - i0));
  Walker w{&tb, p.row_ctas, e_count, ksteps, i0 / p.row_ctas, i0 % p.row_ctas, 0};
  w.find_expert();
  // A tile's rows: tiles of one segment share the staged window. (First row and count: with
  // decreasing device offsets two experts' segments may start on one row with other counts.)
  const auto key_of = [&](const gemv_tiles::Tile& t) { return t.x_r0 * (MAX_COLS + 1) + t.cols; };
  const auto window_of = [&](const gemv_tiles::Tile& t) { return window_ksteps<K::CB>(t.cols, ksteps); };
  extern __shared__ __align__(16) u8 smem[];
  gemv_tiles::stream<K, RING_STAGES>(p, smem + RING_BYTES, smem, w, key_of, window_of, count);
  ptx::launch_dependents();  // a CTA with no tiles never staged
}

}  // namespace moe_walk

// The `_moe` kernels' families: the `_cols` ones with each expert's factor.
template <int CB, bool BLOCKED, bool ABF16, bool OBF16>
struct W4A16Moe : W4A16Cols<CB, BLOCKED, ABF16, OBF16> {
  static __device__ __forceinline__ double scale(const GemvParams& p, const gemv_tiles::Tile& t) {
    return moe_walk::alpha_of(p, t.l) * Act<ABF16>::UNBIAS;
  }
};

template <int CB, bool BLOCKED, bool OBF16>
struct W4A4Moe : W4A4Cols<CB, BLOCKED, OBF16> {
  static __device__ __forceinline__ double scale(const GemvParams& p, const gemv_tiles::Tile& t) {
    return moe_walk::alpha_of(p, t.l) * nvfp4::W4A16_F16_UNBIAS * nvfp4::W4A16_F16_UNBIAS;
  }
};
