// gemv_stream.cuh: the GEMV skeleton's tile walk with the weights streamed through a ring in
// shared memory, for walks of many short tiles (the `_moe` kernels: an expert's K is 2 to 7
// K-steps). gemv_tiles.cuh's `walk` holds a K-step's data in registers, two deep: at each tile's
// end the stream drains to one K-step, and a tile of 2 K-steps waits a full memory latency for
// little data. Here every thread keeps STAGES - 1 K-steps of copies in flight (cp.async into its
// own slots of a ring stage, K::issue), across tile edges and epilogues: the copy side walks the
// same tiles STAGES - 1 K-steps ahead of the compute side. A thread reads back what it or its
// warp copied (K::fetch, after its own `cp.async.wait_group`, and then a warp barrier where lanes
// copy for each other), so no CTA barrier guards the ring.
//
// Beyond gemv_tiles.cuh's hooks, K provides:
//   K::RING_STAGE_BYTES                      bytes of one stage (every thread's slots)
//   K::issue(p, cur, stage, ok, pol)         copies the K-step at `cur` into stage `stage` (a
//                                            shared-window address; zeros when !ok)
//   K::ring_info(p, cur)                     what fetch needs of a tile (from its first cursor)
//   K::fetch(stage, info, x)                 the K-step's data from stage `stage`
#pragma once
#include "gemv_tiles.cuh"

namespace gemv_tiles {

// `count` tiles from `first` (a walker: `first.tile()` the tile, `first.next()` steps to the next
// one), as `walk` runs its tiles, the ring the lookahead (every tile has at least one K-step: the
// copy side moves to the next tile when it has issued a tile's last one); the window of the vector
// is `smem`, the ring (STAGES x K::RING_STAGE_BYTES) `ring`.
template <class K, int STAGES, class Walker, class KeyOf, class WindowOf>
__device__ void stream(const GemvParams& p, u8* smem, u8* ring, const Walker& first, KeyOf key_of, WindowOf window_of,
                       int count) {
  static_assert(STAGES >= 2, "a stage being read and one being copied");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int lead = K::first_chunk(warp, lane), own = K::own_chunk(lane), residue = K::row_residue(warp, lane);
  const int chunks = p.k / 2 / K::CB;
  const u64 pol = ptx::policy_evict_first();
  ptx::wait_prerequisites();  // the matrix, like the vector, comes after the launch's wait

  // The copy side: its tile cw (the ci-th) at K-step cks of [.., cks1), its cursor ccur, into
  // stage cstage.
  Walker cw = first;
  int ci = 0, cks = 0, cks1 = 0, cstage = 0;
  typename K::Cursor ccur;
  const auto open = [&]() {
    const Tile t = cw.tile();
    int row[ROWS_PER_THREAD];
    tile_rows<K>(t, residue, row);
    ccur = K::cursor(p, t.l, row, t.ks0 * KSTEP_CHUNKS + lead + own);
    cks = t.ks0;
    cks1 = t.ks1;
  };
  if (ci < count) open();
  const u32 ring_u32 = ptx::smem_u32(ring);
  const auto copy_next = [&]() {
    if (ci < count) {
      K::issue(p, ccur, ring_u32 + cstage * K::RING_STAGE_BYTES, cks * KSTEP_CHUNKS + lead + own < chunks, pol);
      ccur.advance();
      if (++cks == cks1 && ++ci < count) {
        cw.next();
        open();
      }
    }
    ptx::cp_async_commit();  // past the last tile an empty group: one group per K-step
    cstage = cstage + 1 == STAGES ? 0 : cstage + 1;
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) copy_next();

  // The compute side: the K-step in stage `stage`; K-step n's group is the (n + 1)-th committed.
  Walker w = first;
  int stage = 0, staged = -1;
  for (int i = 0; i < count; ++i, w.next()) {
    const Tile t = w.tile();
    const int row0 = first_row(t);
    int row[ROWS_PER_THREAD];
    tile_rows<K>(t, residue, row);
    const u32 info = K::ring_info(p, K::cursor(p, t.l, row, t.ks0 * KSTEP_CHUNKS + lead + own));
    const int window = window_of(t);
    const bool one_window = t.ks1 - t.ks0 <= window;
    const int wc = window * KSTEP_CHUNKS;
    typename K::Acc acc = {};
    for (int ws = t.ks0; ws < t.ks1; ws += window) {
      const int we = min(ws + window, t.ks1);
      if (!one_window || staged != key_of(t)) {
        ptx::launch_dependents();  // as in `walk`: after the first wait, with the first window
        __syncthreads();           // every warp is done with the previous window
        K::stage(p, smem, wc, t, ws * KSTEP_CHUNKS, we * KSTEP_CHUNKS, chunks);
        __syncthreads();
        staged = one_window ? key_of(t) : -1;
      }
      for (int ks = ws; ks < we; ++ks) {
        // Groups committed: STAGES - 1 + (K-steps before this one); this K-step's is complete
        // when at most STAGES - 2 are pending.
        ptx::cp_async_wait<STAGES - 2>();
        typename K::Data x;
        K::fetch(ring + stage * K::RING_STAGE_BYTES, info, x);
        copy_next();  // into the stage the previous K-step was read from
        stage = stage + 1 == STAGES ? 0 : stage + 1;
        const int c0 = ks * KSTEP_CHUNKS + lead;
        if (c0 < chunks) K::compute(t, x, smem, wc, c0 + own - ws * KSTEP_CHUNKS, acc);
      }
    }
    finish<K>(p, t, row0, acc, warp, lane);
  }
  ptx::cp_async_wait<0>();
}

}  // namespace gemv_tiles
