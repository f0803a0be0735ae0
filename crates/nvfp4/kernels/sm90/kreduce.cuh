// sm90/kreduce.cuh: combining a tile's K pieces inside a thread-block cluster (split-K with one
// unit per CTA, the pieces of a tile in one cluster, piece = cluster rank): the pieces 1.. send
// their f32 accumulators straight into piece 0's shared memory (st.async, counted on one
// mbarrier), and piece 0 sums them in piece order p0 + p1 + ... into its accumulators.
// NOTE: written because removing the workspace fixup (fixup.cuh: a partial tile's write, an
// atomic round trip and a read back through L2 in series) took 3.0 µs off the 20.4 µs of
// 128x7168x2048 (split 2) and 4.3 µs off the 27.8 µs of 128x4096x7168 (split 4) on the H200. It
// measured no faster than the workspace sum (21.1 vs 20.6 µs, 27.3 vs 27.3 µs in one run): the
// cost is waiting for the tile's slowest piece, not the L2 round trips. The plan uses it only
// when forced (`s2d`).
#pragma once

#include "sm90/fixup.cuh"

namespace sm90 {

// The variants that sum K pieces in a cluster (the host's plan, `kcluster_ok`, knows the same
// rule): a GEMM's (one part), fewer than 128 accumulators per thread.
template <class C>
constexpr bool KCLUSTER_FITS = C::PARTS == 1 && C::WM * C::BN / 2 < 128;

// Piece 0 returns true with the tile's sum in `cs.acc`; the other pieces return false once their
// partial is sent. Piece 0's rings are idle once its own consumers are past their mainloop (one
// unit per CTA: every load was consumed), so the partials land from its shared memory's start,
// (piece - 1) tiles in; it tells the others when they may send (the "go" barrier).
template <class C>
NVFP4_DEVICE bool reduce_in_cluster(Consumer<C>& cs, const Smem<C>& sm, const Unit& un) {
  using Cs = Consumer<C>;
  constexpr int QUADS = C::WM * Cs::NACC / 4;
  constexpr u32 TILE_BYTES = C::BM * C::BN * 4;
  const int j = un.piece;
  // NOTE: a fresh read of the thread index (as in the mainloop): with 128 accumulators ptxas
  // otherwise keeps the offsets from the kernel's start and spills.
  const u32 ct = ptx::tid_x_here() - 128;
  const auto quad_at = [&](u32 buf, int q) { return buf + ((u32)q * 256 + ct) * 16; };
  if (j == 0) {
    ptx::named_barrier(1, 256);  // every consumer's wgmmas have retired: the rings are free
    if (Cs::ctid() == 0) {
      ptx::mbar_arrive_expect_tx(sm.kred(), (u32)(un.pieces - 1) * TILE_BYTES);
      for (int r = 1; r < un.pieces; ++r) ptx::mbar_arrive_remote(ptx::map_shared_rank(sm.kgo(), (u32)r));
    }
    ptx::mbar_wait_cluster(sm.kred(), 0);
    for (int r = 1; r < un.pieces; ++r) {
      const u32 buf = sm.base + (u32)(r - 1) * TILE_BYTES;
#pragma unroll
      for (int q = 0; q < QUADS; ++q) cs.set_quad(q, add4(cs.quad(q), ptx::lds_f4(quad_at(buf, q))));
    }
    return true;
  }
  ptx::mbar_wait_cluster(sm.kgo(), 0);
  const u32 dst = ptx::map_shared_rank(sm.base + (u32)(j - 1) * TILE_BYTES, 0);
  const u32 bar = ptx::map_shared_rank(sm.kred(), 0);
#pragma unroll
  for (int q = 0; q < QUADS; ++q) ptx::st_async_f4(quad_at(dst, q), cs.quad(q), bar);
  return false;
}

}  // namespace sm90
