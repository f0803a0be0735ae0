// gemv_tiles.cuh: the skeleton both GEMV kernels run (gemv.cu, W4A4; gemv16.cu, W4A16): the
// persistent walk over work tiles, the windows of the vector staged in shared memory, the
// register double buffer over K-steps, and the epilogue with its split-K fixup. What it does not
// know is the family's part, a small struct `K` (gemv.cu's `W4A4`, gemv16.cu's `W4A16`):
//
//   K::CB (bytes of the matrix per thread per row per K-step), K::OUT_BF16, K::COLS (false: one
//   output column, p.cols unread; true: p.cols columns)
//   K::Cursor (where a thread reads the matrix; advance() moves it one K-step), K::Data (one
//   K-step's matrix data of a thread), K::Acc (its accumulators, zero-initialised)
//   K::first_chunk(warp, lane)           the first chunk of a K-step the thread's warp group reads
//   K::own_chunk(lane)                   the thread's chunk from there (first + own: its chunk)
//   K::row_residue(warp, lane)           r in the thread's rows K::row(rc, row0, q, r), q = 0..3
//   K::row(rc, row0, q, r)               row 128 (rc / 4) + 32 q + 8 (rc % 4) + r of row tile rc
//                                        (row0: 128 (rc / 4) + 8 (rc % 4))
//   K::cursor(p, l, row, chunk)          the cursor of batch l, rows `row`, at chunk `chunk`
//   K::stage(p, smem, wc, t, c0, c1, chunks)   tile t's vector chunks [c0, c1) into the window
//   K::load(cur, x, ok, pol)             a K-step's matrix data (nothing or zeros when !ok)
//   K::compute(t, x, smem, wc, cl, acc)  acc += x times window chunk cl
//   K::reduce(acc, warp, lane)           the row totals: an `Out` per thread (a row and a column:
//                                        the W4A4 GEMV and the one-row W4A16 GEMV have one column,
//                                        the W4A16 GEMV of several rows t.cols)
//   K::scale(p, t)                       the factor applied in f64 before the one rounding
//
// The work (backend/cuda/gemv_tiling.rs plans it): a tile is 32 rows of one batch, rows
// 128*t + 32*q + 8*(tile%4) + r, q = 0..3, r = 0..7 (in the blocked scale layout a thread's
// 4 rows share one 16 B scale group); K is walked in K-steps of 32 chunks, one K range (slice) per
// tile when split-K. CTA b runs tiles [b * tiles_per_cta, (b + 1) * tiles_per_cta) (`run`); in the
// MoE form each CTA lays out its tiles from the experts' device offsets (gemv16_moe.cuh) and
// walks them with gemv_stream.cuh's weight ring.
// The activation rows of a tile: [x_r0, x_r0 + cols) of activation batch x_l, of p.cols rows per
// batch in the `_cols` and `_moe` kernels (one otherwise); output row (x_l * rows + x_r0 + col).
#pragma once
#include "ptx.cuh"
#include "output.cuh"
#include "generated.cuh"

namespace gemv_tiles {

using gemv::KSTEP_CHUNKS;
constexpr int ROWS_PER_THREAD = 4;  // q = 0..3
static_assert(4 * gemv::ROWS_PER_CTA == 128 && gemv::ROWS_PER_CTA == 8 * ROWS_PER_THREAD, "row tiles");
static_assert(KSTEP_CHUNKS == 32, "a K-step is 32 chunks");

// One thread's share of a tile's totals: `total` is the sum of row K::row(rc, row0, q, r) and
// activation row (output column) `col` when `holds`.
struct Out {
  float total;
  int q, r, col;
  bool holds;
};

// One work tile: row tile rc of matrix batch l, K-steps [ks0, ks1) (slice `slice` of a split),
// times activation rows [x_r0, x_r0 + cols) of activation batch x_l. Tiles of one `key` share
// the vector's window when it fits one (`window_of(t)` K-steps; `key_of(t)`).
struct Tile {
  int l, rc, slice, ks0, ks1, x_l, x_r0, cols;
};

// Activation rows per batch (the output's rows per batch too).
template <class K>
__device__ __forceinline__ int batch_rows(const GemvParams& p) {
  return K::COLS ? p.cols : 1;  // a compile-time 1 keeps the one-column kernels' registers
}

// The first of tile t's 128 rows that hold its 32 (row tile rc: rows row0 + 32 q + r).
__device__ __forceinline__ int first_row(const Tile& t) { return (t.rc / 4) * 128 + (t.rc % 4) * 8; }

// The thread's rows of tile t (row_residue r).
template <class K>
__device__ __forceinline__ void tile_rows(const Tile& t, int residue, int (&row)[ROWS_PER_THREAD]) {
  const int row0 = first_row(t);
#pragma unroll
  for (int q = 0; q < ROWS_PER_THREAD; ++q) row[q] = K::row(t.rc, row0, q, residue);
}

// The epilogue of tile t (rows from row0), after its last K-step: one total per row and column,
// then f16 or bf16 (or, split, an f32 partial and the slice-order fixup).
template <class K>
__device__ __forceinline__ void finish(const GemvParams& p, const Tile& t, int row0, const typename K::Acc& acc,
                                       int warp, int lane) {
  __shared__ u32 s_last;
  const Out o = K::reduce(acc, warp, lane);
  const int my_row = K::row(t.rc, row0, o.q, o.r);
  const bool writer = o.holds && o.col < t.cols && my_row < p.m;
  const double scale = K::scale(p, t);
  const auto out_row = [&]() { return (i64)t.x_l * batch_rows<K>(p) + t.x_r0; };
  if (p.split == 1) {
    if (writer) p.c[(out_row() + o.col) * p.m + my_row] = out::of_f64((double)o.total * scale, K::OUT_BF16);
    return;
  }
  // Split-K (the dense walk only): each slice writes f32 partials [split, L, cols, M]; the last
  // CTA of a row tile (an atomic counter, reset by that CTA) adds them in slice order
  // (deterministic).
  const int cols = t.cols;
  if (writer) p.partial[(((i64)t.slice * p.l + t.l) * cols + o.col) * p.m + my_row] = o.total;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const u32 arrived = atomicAdd(p.counters + (i64)t.l * p.row_ctas + t.rc, 1u);
    s_last = arrived == (u32)p.split - 1;
  }
  __syncthreads();
  if (s_last) {
    __threadfence();
    if (threadIdx.x < 32 * cols) {
      const int tr = threadIdx.x % 32, col = threadIdx.x / 32;  // tile row, column
      const int r = K::row(t.rc, row0, tr / 8, tr % 8);
      if (r < p.m) {
        float sum = 0.f;
        for (int s = 0; s < p.split; ++s)
          sum += ptx::ld_cg_f32(p.partial + (((i64)s * p.l + t.l) * cols + col) * p.m + r);
        p.c[(out_row() + col) * p.m + r] = out::of_f64((double)sum * scale, K::OUT_BF16);
      }
    }
    if (threadIdx.x == 0) p.counters[(i64)t.l * p.row_ctas + t.rc] = 0;  // ready for the next launch
  }
}

// The tile walk of one CTA: tiles tile_of(i), i in [i0, i1), each streamed over its K range and
// its output written. (Walks of many short tiles stream better through gemv_stream.cuh's ring.)
template <class K, class TileOf, class KeyOf, class WindowOf>
__device__ void walk(const GemvParams& p, TileOf tile_of, KeyOf key_of, WindowOf window_of, int i0, int i1) {
  extern __shared__ __align__(16) u8 smem[];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int first = K::first_chunk(warp, lane), own = K::own_chunk(lane), residue = K::row_residue(warp, lane);
  const int chunks = p.k / 2 / K::CB;
  const u64 pol = ptx::policy_evict_first();
  int staged = -1;  // the key whose vector is in shared memory, when it fits one window
  typename K::Data x0, x1;

  for (int i = i0; i < i1; ++i) {
    const Tile t = tile_of(i);
    const int row0 = first_row(t);
    int row[ROWS_PER_THREAD];
    tile_rows<K>(t, residue, row);
    const int window = window_of(t);
    const bool one_window = t.ks1 - t.ks0 <= window;
    const int wc = window * KSTEP_CHUNKS;  // chunks per shared-memory window
    typename K::Acc acc = {};

    for (int ws = t.ks0; ws < t.ks1; ws += window) {
      const int we = min(ws + window, t.ks1);
      typename K::Cursor cur = K::cursor(p, t.l, row, ws * KSTEP_CHUNKS + first + own);
      if (!one_window || staged != key_of(t)) {
        // NOTE: programmatic dependent launch. Until `griddepcontrol.wait` returns, the previous
        // kernel on the stream may still run (it may be writing the vector, the activations of a
        // decode step), so nothing is read or written before it: the vector, the output and the
        // split-K workspace all come after a CTA's first wait (its first window always stages the
        // vector; later waits return at once). Then the next kernel may launch: its CTAs take SM
        // slots as ours retire. Without the launch attribute both are no-ops.
        // NOTE: no L2 prefetch of the matrix here or ahead of the loads (v9 requested a window's
        // first 4 K-steps before staging B): on the H200 every L2 prefetch variant measured
        // slower, in both protocols (NOTES.md, "GEMV floor"); dropping v9's made the graph
        // protocol 3-9% faster.
        ptx::wait_prerequisites();
        ptx::launch_dependents();
        __syncthreads();  // every warp is done with the previous window
        K::stage(p, smem, wc, t, ws * KSTEP_CHUNKS, we * KSTEP_CHUNKS, chunks);
        __syncthreads();
        staged = one_window ? key_of(t) : -1;
      }
      // Register double buffering: K-step ks + 1 is loading while ks is computed. The group's
      // first chunk decides whether a K-step is computed (W4A16: the MMA needs all 32 lanes, so
      // the test is per warp, and a lane past K within a live warp multiplies zeros); the
      // thread's own chunk whether it loads.
      K::load(cur, x0, ws * KSTEP_CHUNKS + first + own < chunks, pol);
      cur.advance();
      for (int ks = ws; ks < we; ks += 2) {
        const int c0 = ks * KSTEP_CHUNKS + first, c1 = c0 + KSTEP_CHUNKS;
        K::load(cur, x1, ks + 1 < we && c1 + own < chunks, pol);
        cur.advance();
        if (c0 < chunks) K::compute(t, x0, smem, wc, c0 + own - ws * KSTEP_CHUNKS, acc);
        if (ks + 1 >= we) break;
        K::load(cur, x0, ks + 2 < we && c1 + KSTEP_CHUNKS + own < chunks, pol);
        cur.advance();
        if (c1 < chunks) K::compute(t, x1, smem, wc, c1 + own - ws * KSTEP_CHUNKS, acc);
      }
    }
    finish<K>(p, t, row0, acc, warp, lane);
  }
}

// The dense walk: tile i = (batch l, row tile rc, slice) as the host planned it, every batch's
// activation rows p.cols (1 for the one-column kernels).
template <class K>
__device__ void run(const GemvParams& p) {
  const int ksteps = (p.k / 2 / K::CB + KSTEP_CHUNKS - 1) / KSTEP_CHUNKS;
  const auto tile_of = [&](int i) {
    Tile t;
    t.slice = i % p.split;
    const int rest = i / p.split;
    t.rc = rest % p.row_ctas;
    t.l = rest / p.row_ctas;
    t.ks0 = t.slice * p.ksteps_per_slice;
    t.ks1 = min(t.ks0 + p.ksteps_per_slice, ksteps);
    t.x_l = t.l;
    t.x_r0 = 0;
    t.cols = batch_rows<K>(p);
    return t;
  };
  const auto key_of = [&](const Tile& t) { return t.l * p.split + t.slice; };
  const auto window_of = [&](const Tile&) { return p.window_ksteps; };
  const int i0 = blockIdx.x * p.tiles_per_cta;
  walk<K>(p, tile_of, key_of, window_of, i0, min(i0 + p.tiles_per_cta, p.tiles));
}

}  // namespace gemv_tiles
