// sm90/producer.cuh: the producer warp and thread, which issue every load of the pipeline.
//
// W moves in raw stages of 256 K (128 bytes per row, 128-byte swizzle) with their scales, one TMA
// box per part (PART_ROWS rows of its own tensor); X moves in sub-stages of 64 K (BN rows of 128
// bytes of f16, decoded by the pre-pass). Each ring has full (landed) and empty (consumed)
// mbarriers.
// NOTE: TMA cost grows with the rows of a box, not its bytes: boxes of 32-byte rows ran at ~6
// cycles per row per SM and bounded an earlier version; every box here has 128-byte rows.
// Scales: one 2 KB bulk copy per 128-row group for blocked scales (4 consecutive 512-byte column
// groups), a tensor-map box [rows, 16 B] for plain scales (needs K % 256 == 0 for a 16-byte row
// stride), or, for plain scales with other K, byte loads by the W producer warp into the same
// [rows, 16 B] layout.
#pragma once

#include "sm90/schedule.cuh"

namespace sm90 {

// Plain scales whose rows are not 16-byte aligned (K % 256 != 0): the W producer warp copies raw
// stage q's [PART_ROWS, 16 B] of one part with byte loads, zero past the operand's rows and K.
template <class C>
NVFP4_DEVICE void copy_scales_direct(const Sm90MainloopArgs& pr, const u8* sf, u32 dst, i32 row0, i32 q, i32 l) {
  const i32 sf_cols = pr.k / 16, lane = threadIdx.x % 32;
  for (i32 r = lane; r < C::PART_ROWS; r += 32) {
    const i32 grow = row0 + r;
    u32 v[4] = {0, 0, 0, 0};
#pragma unroll
    for (int b = 0; b < 16; ++b) {
      const i32 col = 16 * q + b;
      if (grow < pr.w_rows && col < sf_cols) v[b / 4] |= ptx::ld_nc_u8(sf + ((i64)l * pr.w_rows + grow) * sf_cols + col) << (8 * (b % 4));
    }
    ptx::sts_v4(dst + r * 16, v[0], v[1], v[2], v[3]);
  }
}

// Issues part `part`'s scales for raw stage q into its area of the stage's scales (SW_PART
// bytes from `sc` per part); returns the transaction bytes. `count_only`
// computes the bytes without copying (the arrive.expect_tx must precede the copies).
template <class C>
NVFP4_DEVICE u32 issue_w_scales(const Sm90MainloopArgs& pr, int part, bool count_only, u32 sc, u32 bar, i32 row0,
                                i32 q, i32 l, u64 pol) {
  if (pr.w_sf_mode == SF_TMA) {
    if (!count_only) ptx::tma_load_3d(sc + part * C::SW_PART, &pr.tmap_sw[part], bar, q * 16, row0, l, pol);
    return C::PART_ROWS * 16;
  }
  if (pr.w_sf_mode != SF_BULK) return 0;
  const i32 sf_cols = pr.k / 16;
  const i32 R = (pr.w_rows + 127) / 128, Cg = (sf_cols + 3) / 4;  // 128-row groups, 4-block columns
  // A tile wholly past the rows (the padding tile of a CTA pair) has no scale groups.
  const i32 g0 = row0 / 128, g1 = max(g0, min(R, (row0 + C::PART_ROWS + 127) / 128));
  const u32 bytes = min(SUB, Cg - SUB * q) * SF_CHUNK;  // the K tail has fewer columns
  if (!count_only)
    for (i32 g = g0; g < g1; ++g)
      ptx::bulk_load(sc + part * C::SW_PART + (g - g0) * SUB * SF_CHUNK,
                     pr.sf_w[part] + (((i64)l * R + g) * Cg + SUB * q) * SF_CHUNK, bytes, bar, pol);
  return (g1 - g0) * bytes;
}

// The packed W of unit `u`'s tile: its 64-row groups that exist (`ng` from `g0`), each a run of
// chunks along K. A dual GEMM's pair is one packed operand of 16 rows per 8 output rows: its tile
// is BM packed rows.
struct PackedTile {
  const u8* w;
  i32 groups, stages, g0, ng, l;
  // The chunk of the tile's group i at raw stage q.
  NVFP4_DEVICE const u8* chunk(i32 i, i32 q) const { return w + (((i64)l * groups + g0 + i) * stages + q) * PACK_CHUNK; }
};

template <class C>
NVFP4_DEVICE PackedTile packed_tile(const Sm90MainloopArgs& pr, const Unit& u) {
  const i32 rows = C::PARTS == 1 ? pr.w_rows : 16 * ((pr.w_rows + 7) / 8);
  const i32 groups = (rows + PACK_ROWS - 1) / PACK_ROWS, g0 = u.tw * C::BM / PACK_ROWS;
  return {pr.sf_w[0], groups, (pr.k + PACK_K - 1) / PACK_K, g0, max(0, min(C::BM / PACK_ROWS, groups - g0)), u.l};
}

// The first raw stages of the packed W of unit `u` (its first PREFETCH_STAGES, at most), asked
// into L2 by one lane: for each 64-row group of the tile they are one contiguous run of chunks.
// NOTE: asking every later raw stage into L2 too, 2, 4 or 8 openings of the walk ahead of its TMA
// load (a second walk in the leader lane), measured 10-50% slower on the dense and MoE decode
// calls (H200, 8192^2 M = 16 19.3 -> 21.6-22.6 µs; Qwen3 down 58.8 -> 77.6): more of each SM's
// W in flight than the ring holds costs time, as more W stages did (NOTES.md, sessions 19, 23).
template <class C, class S>
NVFP4_DEVICE void prefetch_packed_w(const typename S::Params& p, const Unit& u) {
  constexpr i32 PREFETCH_STAGES = 4;
  const PackedTile t = packed_tile<C>(S::problem(p, u).main, u);
  const i32 q0 = u.k0 / SUB, q1 = min((u.k1 + SUB - 1) / SUB, q0 + PREFETCH_STAGES);
  for (i32 i = 0; i < t.ng; ++i) ptx::bulk_prefetch_l2(t.chunk(i, q0), (u32)(q1 - q0) * PACK_CHUNK);
}

// W producer (warp 0): raw stages as far ahead as the W ring allows.
// NOTE: W and X have their own producers. One warp walking both rings in lockstep was held back
// by the X ring (5 sub-stages ahead), so the 8-deep W ring never filled and the consumers spent
// 29% of their stall samples waiting for W from DRAM (ncu, 128x7168x16384).
template <class C, class S>
NVFP4_DEVICE void producer_w(const typename S::Params& p, const Smem<C>& sm) {
  const bool leader = threadIdx.x == 0;
  const u64 pol_w = ptx::policy_evict_first();  // W is streamed once
  Walk<S> w;
  w.start(p);
  if constexpr (C::ACT != ACT_NVFP4) {
    // A chained launch (programmatic dependent: the graph protocol, the Python operations) may
    // start while the previous kernel on the stream still runs, and that kernel may have written
    // these weights (a pack, a load): before `griddepcontrol.wait` only L2 prefetches, which
    // cannot return stale data (L2 is where every write lands). Without the launch attribute the
    // wait returns at once. (The W4A4 kernels' W is read after their pre-pass, which waited.)
    if constexpr (C::PACKED)
      if (leader && w.valid()) prefetch_packed_w<C, S>(p, w.cur);
    ptx::wait_prerequisites();
  }
  u32 n = 0;  // raw stages opened
  for (; w.valid(); w.advance(p)) {
    const Unit& u = w.cur;
    if (!raw_opens(u, w.kk)) continue;
    const Sm90MainloopArgs& pr = S::problem(p, u).main;
    const u32 s = n % C::RAW_STAGES;
    if (n >= (u32)C::RAW_STAGES) ptx::mbar_wait(sm.empty_w(s), ((n / C::RAW_STAGES) - 1) & 1);
    const i32 q = w.kk / SUB, row0 = u.tw * C::PART_ROWS;
    if (C::PACKED) {
      // The packed form: the tile's 64-row groups that exist, one chunk each.
      if (leader) {
        const PackedTile t = packed_tile<C>(pr, u);
        ptx::mbar_arrive_expect_tx(sm.full_w(s), (u32)t.ng * PACK_CHUNK);
        for (i32 i = 0; i < t.ng; ++i)
          ptx::bulk_load(sm.raw_w(s) + i * PACK_CHUNK, t.chunk(i, q), PACK_CHUNK, sm.full_w(s), pol_w);
      } else {
        ptx::mbar_arrive(sm.full_w(s));
      }
      ++n;
      continue;
    }
    if (pr.w_sf_mode == SF_DIRECT)
#pragma unroll
      for (int part = 0; part < C::PARTS; ++part)
        copy_scales_direct<C>(pr, pr.sf_w[part], sm.sc_w(s) + part * C::SW_PART, row0, q, u.l);
    // full_w counts every lane of this warp: each releases its own scale stores (SF_DIRECT).
    if (!leader) ptx::mbar_arrive(sm.full_w(s));
    if (leader) {
      u32 sbytes = 0;
#pragma unroll
      for (int part = 0; part < C::PARTS; ++part)
        sbytes += issue_w_scales<C>(pr, part, true, sm.sc_w(s), sm.full_w(s), row0, q, u.l, pol_w);
      ptx::mbar_arrive_expect_tx(sm.full_w(s), C::W_BYTES + sbytes);
#pragma unroll
      for (int part = 0; part < C::PARTS; ++part) {
        issue_w_scales<C>(pr, part, false, sm.sc_w(s), sm.full_w(s), row0, q, u.l, pol_w);
        ptx::tma_load_3d(sm.raw_w(s) + part * C::PART_ROWS * ROW_BYTES, &pr.tmap_w[part], sm.full_w(s), q * ROW_BYTES,
                         row0, u.l, pol_w);
      }
    }
    ++n;
  }
}

// X producer (lane 0 of warp 1): one decoded-X sub-stage per k64 step. In a cluster of two, each
// CTA loads half of the sub-stage's rows into both CTAs (TMA multicast), which halves the L2
// reads of X; either CTA's full barrier expects the whole sub-stage.
template <class C, class S>
NVFP4_DEVICE void producer_x(const typename S::Params& p, const Smem<C>& sm) {
  const u64 pol_x = ptx::policy_evict_last();  // decoded X tiles are re-read by every W tile
  const i32 cluster = S::cluster(p), rank = cluster_rank(cluster), rows = C::BN / cluster;
  const u32 part = (u32)rank * (C::X_BYTES / cluster);  // a multiple of 1024 B (swizzle atom)
  // NOTE: launched as a programmatic dependent of the X pre-pass: the setup and the W producer's
  // first stages overlap the pre-pass; X is read only after it has completed.
  ptx::wait_prerequisites();
  Walk<S> w;
  w.start(p);
  for (u32 g = 0; w.valid(); ++g, w.advance(p)) {
    const Sm90MainloopArgs& pr = S::problem(p, w.cur).main;
    const u32 xs = g % C::X_STAGES;
    // The slot is free when the consumers of every CTA it is multicast to have released it.
    if (g >= (u32)C::X_STAGES) ptx::mbar_wait(sm.empty_x(xs), ((g / C::X_STAGES) - 1) & 1);
    ptx::mbar_arrive_expect_tx(sm.full_x(xs), C::X_BYTES);
    const i32 row = w.cur.x_base + w.cur.tx * C::BN + rank * rows, l = pr.x_flat ? 0 : w.cur.l;
    if (cluster == 1)
      ptx::tma_load_3d(sm.x(xs), &pr.tmap_x, sm.full_x(xs), w.kk * ROW_BYTES, row, l, pol_x);
    else
      ptx::tma_load_3d_multicast(sm.x(xs) + part, &pr.tmap_x, sm.full_x(xs), w.kk * ROW_BYTES, row, l,
                                 (u16)((1u << cluster) - 1), pol_x);
  }
}

}  // namespace sm90
