// sm90/fixup.cuh: combining a tile's K pieces (split-K, stream-K) into the consumers'
// accumulators, deterministically, whichever piece finishes last.
#pragma once

#include "sm90/mainloop.cuh"

namespace sm90 {

NVFP4_DEVICE float4 add4(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }

// The staged sum of the pieces of a tile: the other pieces' partials are bulk-copied from the
// workspace into shared memory, one tile at a time (the TMA engine keeps the whole tile in
// flight), and each thread adds its own quads from there in piece order. Piece j's own partial
// stays in the accumulators: j = 0 adds p1, p2, ...; j = 1 adds p0 first (p0 + p1 = p1 + p0);
// j >= 2 first sums p0 .. p(j-1) in a second tile of shared memory.
// NOTE: through registers the last piece kept ~16 KB in flight per SM, about 1 µs per round trip:
// ~10 µs for two pieces of a 128 x 256 tile, which made split-K and stream-K lose to no split.
template <class C>
NVFP4_DEVICE void sum_staged(Consumer<C>& cs, const Smem<C>& sm, const Unit& un, const Partials& ws) {
  using Cs = Consumer<C>;
  constexpr int QUADS = C::WM * Cs::NACC / 4;
  constexpr u32 TILE_BYTES = C::BM * C::BN * 4;
  constexpr u32 CHUNK_BYTES = 16384;  // per bulk copy
  static_assert(TILE_BYTES % CHUNK_BYTES == 0 || TILE_BYTES < CHUNK_BYTES, "whole copies");
  const u32 stage = sm.base, prefix = sm.base + TILE_BYTES;  // [QUADS][256 threads] float4, as in the workspace
  u32 phase = 0;
  // Copies piece `sl` into shared memory at `dst` and waits for it (the previous copy's readers
  // must be done: a barrier before each copy).
  const auto fetch = [&](int sl, u32 dst) {
    ptx::named_barrier(1, 256);
    if (Cs::ctid() == 0) {
      ptx::fence_proxy_async_global();  // the pieces were written by other CTAs' generic stores
      ptx::mbar_arrive_expect_tx(sm.fixup(), TILE_BYTES);
      const u8* src = reinterpret_cast<const u8*>(ws.at(sl));
      for (u32 off = 0; off < TILE_BYTES; off += CHUNK_BYTES) {
        const u32 n = TILE_BYTES - off < CHUNK_BYTES ? TILE_BYTES - off : CHUNK_BYTES;
        ptx::bulk_load(dst + off, src + off, n, sm.fixup(), ptx::policy_evict_first());
      }
    }
    ptx::mbar_wait(sm.fixup(), phase);
    phase ^= 1;
  };
  const auto quad_at = [&](u32 buf, int q) { return buf + (u32)Cs::quad_offset(q) * 4; };
  const int j = un.piece;
  if (j >= 1) {
    // The prefix p0 + ... + p(j-1), then own = prefix + own.
    fetch(0, j == 1 ? stage : prefix);
    for (int sl = 1; sl < j; ++sl) {
      fetch(sl, stage);
#pragma unroll
      for (int q = 0; q < QUADS; ++q)
        ptx::sts_f4(quad_at(prefix, q), add4(ptx::lds_f4(quad_at(prefix, q)), ptx::lds_f4(quad_at(stage, q))));
    }
    const u32 pre = j == 1 ? stage : prefix;
#pragma unroll
    for (int q = 0; q < QUADS; ++q) cs.set_quad(q, add4(ptx::lds_f4(quad_at(pre, q)), cs.quad(q)));
  }
  for (int sl = j + 1; sl < un.pieces; ++sl) {
    fetch(sl, stage);
#pragma unroll
    for (int q = 0; q < QUADS; ++q) cs.set_quad(q, add4(cs.quad(q), ptx::lds_f4(quad_at(stage, q))));
  }
}

// Combines the K pieces of the unit's tile: every piece publishes its f32 partial (the register
// image, coalesced float4 per thread) to the workspace; the piece that arrives last sums all of
// them in piece order p0 + p1 + ... (deterministic, whoever arrives last) into `cs.acc` and
// returns true. Partials start from +0 and are never -0, so the sum equals one that starts from
// zero. `staged`: this is the CTA's last unit and it has no cluster peer, so its shared memory is
// idle and may stage the other pieces (see `sum_staged`).
template <class C, class S>
NVFP4_DEVICE bool reduce_pieces(const typename S::Params& p, Consumer<C>& cs, const Smem<C>& sm, const Unit& un,
                                bool staged) {
  using Cs = Consumer<C>;
  constexpr int QUADS = C::WM * Cs::NACC / 4;
  constexpr i64 TILE_FLOATS = (i64)C::BM * C::BN;
  const Partials ws = S::partials(p, un, TILE_FLOATS);
  u32* flag = reinterpret_cast<u32*>(__cvta_shared_to_generic(sm.flag()));
  u32* counter = S::counter(p, un);
  // With at most one piece before this one the staged sum runs in place (f32 addition
  // commutes); otherwise its prefix needs a second tile of shared memory.
  // NOTE: only for 128 accumulators per thread: with 64, the register path keeps 32 KB in flight
  // per SM and measured ~2 µs faster than staging (GEMM 128x7168x16384, stream-K, 4 pieces).
  constexpr bool TWO_TILES = 2 * TILE_FLOATS * 4 <= C::BAR_OFF;
  staged = staged && C::WM * Cs::NACC >= 128 && (un.piece <= 1 || TWO_TILES);
  // A piece that finds every other piece published is the last: with the staged sum (which keeps
  // its own partial in registers) it publishes nothing. Typical in stream-K, whose head pieces
  // end their CTAs' shares.
  if (staged) {
    if (Cs::ctid() == 0) *flag = ptx::ld_acquire_gpu(counter) == (u32)un.pieces - 1;
    ptx::named_barrier(1, 256);
    if (*flag) {
      if (Cs::ctid() == 0) *counter = 0;  // ready for the next launch
      sum_staged<C>(cs, sm, un, ws);
      return true;
    }
  }
  float* mine = ws.at(un.piece);
#pragma unroll
  for (int q = 0; q < QUADS; ++q) ptx::st_cg_v4(mine + Cs::quad_offset(q), cs.quad(q));
  // One acquire-release arrival per CTA, after a barrier: it publishes every consumer thread's
  // stores, and the last arrival sees every piece.
  // NOTE: a __threadfence per thread before the arrival measured ~1% slower.
  ptx::named_barrier(1, 256);
  if (Cs::ctid() == 0) *flag = ptx::atom_add_acq_rel_gpu(counter, 1u) == (u32)un.pieces - 1;
  ptx::named_barrier(1, 256);
  const bool last = *flag;
  // Every consumer thread reads the flag before thread 0 may write it again: the next unit's
  // first write above comes after no other barrier when that unit is short (racecheck found it
  // on the grouped m256n16 stream-K launch).
  ptx::named_barrier(1, 256);
  if (!last) return false;
  if (Cs::ctid() == 0) *counter = 0;  // ready for the next launch
  if (staged) {
    sum_staged<C>(cs, sm, un, ws);
    return true;
  }
  if constexpr (QUADS <= 4) {
    // Few accumulators (m256n16): PB pieces' quads in flight at once, summed in piece order into
    // the accumulators, this piece's own from a copy of its registers.
    // NOTE: against one piece per L2 round trip (the loop below), H200, M = 16: 0.4-0.5 µs faster
    // at split 8 (4096 x 7168, ~13.4 µs), the same within noise at split 4, stream-K and MoE decode;
    // the same at m256n32 (two pieces at a time) measured 0.3-1.1 µs slower (NOTES.md, session 23).
    constexpr int PB = 16 / QUADS;
    const int j = un.piece;
    float4 own[QUADS];
#pragma unroll
    for (int q = 0; q < QUADS; ++q) own[q] = cs.quad(q);
#pragma unroll 1
    for (int s0 = 0; s0 < un.pieces; s0 += PB) {
      float4 v[PB][QUADS];
#pragma unroll
      for (int b = 0; b < PB; ++b) {
        const int sl = s0 + b;
#pragma unroll
        for (int q = 0; q < QUADS; ++q)
          v[b][q] = sl < un.pieces && sl != j ? ptx::ld_cg_v4(ws.at(sl) + Cs::quad_offset(q)) : own[q];
      }
#pragma unroll
      for (int b = 0; b < PB; ++b) {
        const int sl = s0 + b;
        if (sl < un.pieces) {
#pragma unroll
          for (int q = 0; q < QUADS; ++q) cs.set_quad(q, sl == 0 ? v[b][q] : add4(cs.quad(q), v[b][q]));
        }
      }
    }
  } else {
    // From global memory, straight into the accumulators (this piece's own partial read back too):
    // only the loads in flight of pieces 1.. need registers.
    constexpr int CHUNK = C::WM * Cs::NACC <= 64 ? 8 : 4;
    static_assert(QUADS % CHUNK == 0, "whole chunks");
#pragma unroll
    for (int q = 0; q < QUADS; ++q) cs.set_quad(q, ptx::ld_cg_v4(ws.at(0) + Cs::quad_offset(q)));
#pragma unroll 1
    for (int sl = 1; sl < un.pieces; ++sl) {
      const float* piece = ws.at(sl);
#pragma unroll
      for (int q0 = 0; q0 < QUADS; q0 += CHUNK) {
        float4 v[CHUNK];
#pragma unroll
        for (int c = 0; c < CHUNK; ++c) v[c] = ptx::ld_cg_v4(piece + Cs::quad_offset(q0 + c));
#pragma unroll
        for (int c = 0; c < CHUNK; ++c) cs.set_quad(q0 + c, add4(cs.quad(q0 + c), v[c]));
      }
    }
  }
  return true;
}

}  // namespace sm90
