// sm90/grouped.cuh: the grouped launch's work table: its builder (run by the pre-pass) and the
// scheduler that walks it (sm90/schedule.cuh's interface).
//
// Segments. A group's X rows, in tiles of BN, times its W tiles, are its tile groups; each has
// k_iters 64-element k-steps. Segment s is group s of a list (its own problem, tensors and
// shape), or expert s of a MoE launch: one problem whose W batch is the expert and whose X rows
// [offsets[s - 1], offsets[s]) come from the device (the routing), read only here.
//
// Table. The tile groups of all segments are laid end to end. Where they are many and of one
// length, whole waves of them are dealt round robin (tile group t to CTA t % slots); the rest,
// and every tile group otherwise, are shared as k-steps, laid end to end, evenly among the
// persistent CTAs (stream-K: a few large groups do not leave SMs idle). CTA c owns the
// stream-K k-steps [c * total / slots, (c + 1) * total / slots); a tile group that crosses a
// share's edge is cut into pieces, summed by the piece that finishes last (sm90/fixup.cuh). The
// builder writes every CTA's entries (its whole tile groups, then its pieces), in CTA order, and
// where each CTA's entries start.
//
// Workspace. A CTA's stream-K share is contiguous, so only its first piece can be the tail
// (j >= 1) of a cut tile and only its last the head (j = 0) of one: two partial tiles per CTA
// hold every piece (2 c for a tail, 2 c + 1 for a head), and the head CTA's counter counts the
// tile's arrivals. The workspace does not grow with the groups.
#pragma once

#include "sm90/schedule.cuh"
#include "block_scan.cuh"

namespace sm90 {

// The fewest k-steps of a CTA's share when the launch has fewer than that many per CTA (the
// builder then shares them among fewer CTAs; the kernel alone reads this).
constexpr i64 MIN_SHARE = 4;

// One segment, resolved.
struct Segment {
  i32 prob, l, x_base, x_end, tiles_w, k_iters;
};

NVFP4_DEVICE Segment segment_of(const GroupedBuild& b, i32 s) {
  Segment r;
  if (b.offsets != nullptr) {
    // NOTE: offsets come from the device, unchecked: clamped into the tokens, so that no value
    // reads or writes outside the operands (rows of decreasing offsets are unspecified).
    const i32 lo = s == 0 ? 0 : b.offsets[s - 1], hi = b.offsets[s];
    r.x_base = min(max(lo, 0), b.moe_rows);
    r.x_end = min(max(hi, r.x_base), b.moe_rows);
    r.prob = 0;
    r.l = s;
    r.tiles_w = b.moe_tiles_w;
    r.k_iters = b.moe_k_iters;
  } else {
    const GroupSegment g = b.segs[s];
    r.prob = g.prob;
    r.l = g.l;
    r.x_base = g.x_base;
    r.x_end = g.x_base + g.x_rows;
    r.tiles_w = g.tiles_w;
    r.k_iters = g.k_iters;
  }
  return r;
}

// The segment holding tile group t: the last one starting at or before it (segments without
// rows start where the next one does).
NVFP4_DEVICE i32 segment_holding(const i32* tg_start, i32 n, i32 t) {
  i32 lo = 0, hi = n - 1;
  while (lo < hi) {
    const i32 mid = (lo + hi + 1) / 2;
    if (tg_start[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Table entry `idx`: piece j of `pieces` of tile group `local` of segment g, k-steps [k0, k1) of it.
// W tiles vary fastest: consecutive tile groups share the X tile in L2.
NVFP4_DEVICE void put_unit(const GroupedBuild& b, i64 idx, const Segment& g, i32 local, i32 j, i32 pieces, i32 k0,
                           i32 k1) {
  if (idx >= b.max_units) return;
  GroupedUnit u;
  u.prob = g.prob;
  u.l = g.l;
  u.tw = local % g.tiles_w;
  u.x_base = g.x_base + local / g.tiles_w * b.bn;
  u.x_end = g.x_end;
  u.pieces = j | pieces << 16;
  u.ks = k0 | k1 << 16;
  u.pad = 0;
  b.units[idx] = u;
}

// Writes the table (one block of THREADS threads: BUILD_THREADS in the W4A4 pre-pass, whose other
// blocks decode; TABLE_THREADS in the W4A16 table kernel, where more threads mean fewer of the
// latency-bound passes below on the launch's critical path).
//
// Two parts. Where the host allows it (`deal`: tiles that reuse their operands), every tile group
// has the same k-steps and there are at least two per CTA, the first `dp` waves of tile groups
// are dealt whole, round robin: at any time the CTAs work on neighbouring tile groups, which
// share their X tile and W tiles in L2. The rest (one to two waves) is shared as k-steps
// (stream-K), which balances the end. CTA c's entries are its dp whole tile groups, then its
// stream-K pieces.
// NOTE: stream-K over a whole prefill-sized launch gave every CTA a contiguous run of tile
// groups, so the tiles in flight were far apart and read their W and X tiles from DRAM: Mixtral's
// experts at 8192 routed rows (W4A4, H100) took 5.6 ms for gate/up and 3.3 ms for down, 3.8 and
// 1.9 ms dealt.
template <int THREADS>
NVFP4_DEVICE void build_units(const GroupedBuild& b) {
  __shared__ i32 tg_start[MAX_SEGMENTS + 1];  // first tile group of each segment
  __shared__ i64 ks_start[MAX_SEGMENTS + 1];  // its first k-step
  __shared__ i32 k_lo, k_hi;                  // the fewest and most k-steps of a tile group
  const i32 n = b.segments, tid = threadIdx.x;
  if (tid == 0) {
    k_lo = 0x7FFFFFFF;
    k_hi = 0;
  }
  __syncthreads();
  i64 tg_run = 0, ks_run = 0;
  for (i32 s0 = 0; s0 < n; s0 += THREADS) {
    const i32 s = s0 + tid;
    i64 tg = 0, ks = 0, tg_sum, ks_sum;
    if (s < n) {
      const Segment g = segment_of(b, s);
      tg = (i64)((g.x_end - g.x_base + b.bn - 1) / b.bn) * g.tiles_w;
      ks = tg * g.k_iters;
      if (tg > 0) {
        atomicMin(&k_lo, g.k_iters);
        atomicMax(&k_hi, g.k_iters);
      }
    }
    const i64 tg_before = block_scan<THREADS>(tg, tg_sum),
              ks_before = block_scan<THREADS>(ks, ks_sum);
    if (s < n) {
      tg_start[s] = (i32)(tg_run + tg_before);
      ks_start[s] = ks_run + ks_before;
    }
    tg_run += tg_sum;
    ks_run += ks_sum;
  }
  for (i32 c = tid; c <= b.slots; c += THREADS) b.slot_first[c] = -1;
  __syncthreads();

  // The whole waves (none where tile groups differ in length: dealt round robin, they would not
  // balance), leaving the remainder and one wave to stream-K unless the waves are exact.
  const i64 all = b.slots, waves = tg_run / all;
  const i64 dp = !b.deal || k_lo != k_hi || waves < 2 ? 0 : tg_run % all == 0 ? waves : waves - 1;
  const i64 dealt = dp * all;  // tile groups [0, dealt) are dealt whole, each of k_hi k-steps

  // A launch of few k-steps is not cut finer than MIN_SHARE k-steps per CTA: cut into the
  // launch's every CTA, a 2-expert call of 16 k-steps ran 132 pieces and their fix-ups (26 us on
  // an H200, for what one CTA per tile group does at once). The CTAs past `slots` get no share.
  const i64 ks0 = dealt * k_hi, total = ks_run - ks0, slots = min(all, max(total / MIN_SHARE, (i64)1));
  // 32-bit quotients when every product below fits (c <= slots, i < total): a 64-bit division is
  // a long subroutine, and this kernel's time is on the launch's critical path (the pieces loop
  // below took ~8 us of a decode-sized MoE launch's ~11 us builder with 64-bit ones, H200).
  const bool narrow = (total + 1) * (slots + 1) < (i64(1) << 32);
  const auto first = [&](i64 c) -> i64 {  // CTA c's first stream-K k-step
    return narrow ? (i64)((u32)(c * total) / (u32)slots) : c * total / slots;
  };
  const auto owner = [&](i64 i) -> i32 {  // the CTA owning stream-K k-step i
    return narrow ? (i32)((u32)((i + 1) * slots - 1) / (u32)total) : (i32)(((i + 1) * slots - 1) / total);
  };
  // The stream-K pieces, numbered in CTA order; CTA c's go after its dp whole tile groups, so
  // piece i of CTA c is entry i + (c + 1) dp. slot_first[c] gets the number of CTA c's first.
  i64 written = 0;
  for (i32 t0 = (i32)dealt; total > 0 && t0 < (i32)tg_run; t0 += THREADS) {
    const i32 t = t0 + tid;
    Segment g{};
    i32 local = 0, pieces = 0;
    i64 k_first = 0;
    if (t < (i32)tg_run) {
      const i32 s = segment_holding(tg_start, n, t);
      g = segment_of(b, s);
      local = t - tg_start[s];
      k_first = ks_start[s] + (i64)local * g.k_iters - ks0;
      pieces = owner(k_first + g.k_iters - 1) - owner(k_first) + 1;
    }
    i64 chunk;
    const i64 p0 = written + block_scan<THREADS>((i64)pieces, chunk);
    if (pieces > 0) {
      const i32 o0 = owner(k_first);
      i64 f0 = first(o0);  // first(c), carried: one quotient per piece
      for (i32 j = 0; j < pieces; ++j) {
        const i64 idx = p0 + j, c = o0 + j, f1 = first(c + 1);
        const i64 k0 = max(k_first, f0), k1 = min(k_first + g.k_iters, f1);
        put_unit(b, idx + (c + 1) * dp, g, local, j, pieces, (i32)(k0 - k_first), (i32)(k1 - k_first));
        if (k0 == f0) b.slot_first[c] = (i32)idx;
        f0 = f1;
      }
    }
    written += chunk;
  }
  __syncthreads();
  // CTAs without a stream-K share (fewer k-steps than CTAs) start theirs where the next one does.
  if (tid == 0) {
    i32 next = (i32)written;
    b.slot_first[b.slots] = next;
    for (i32 c = b.slots - 1; c >= 0; --c) {
      if (b.slot_first[c] < 0) b.slot_first[c] = next;
      next = b.slot_first[c];
    }
  }
  __syncthreads();
  // The whole tile groups: t goes to CTA t % all, as its (t / all)-th entry.
  for (i64 t = tid; t < dealt; t += THREADS) {
    const i32 s = segment_holding(tg_start, n, (i32)t), c = (i32)(t % all);
    put_unit(b, c * dp + b.slot_first[c] + t / all, segment_of(b, s), (i32)t - tg_start[s], 0, 1, 0, k_hi);
  }
  __syncthreads();
  for (i32 c = tid; c <= b.slots; c += THREADS) b.slot_first[c] = (i32)min(c * dp + b.slot_first[c], (i64)b.max_units);
}

// The scheduler of a grouped launch: CTA c walks entries [slot_first[c], slot_first[c + 1]).
struct Grouped {
  using Params = Sm90GroupedParams;
  static constexpr bool TABLE_ON_DEVICE = true;

  NVFP4_DEVICE static const Sm90Problem& problem(const Params& p, const Unit& u) { return p.problems[u.prob]; }
  NVFP4_DEVICE static i32 cluster(const Params&) { return 1; }
  NVFP4_DEVICE static i32 kcluster(const Params&) { return 1; }
  NVFP4_DEVICE static void prefetch_tensormaps(const Params&, int) {}
  NVFP4_DEVICE static Partials partials(const Params& p, const Unit& u, i64 tile_floats) {
    return Partials{p.workspace + 2 * (i64)u.tile * tile_floats, 2 * tile_floats, tile_floats};
  }
  NVFP4_DEVICE static u32* counter(const Params& p, const Unit& u) { return p.counters + u.tile; }

  // NOTE: the table is rewritten by every launch's pre-pass: read through L2 (ld.cg), never from
  // a line an earlier launch left in this SM's L1.
  NVFP4_DEVICE static void first(const Params& p, i64& u, i64& end) {
    u = __ldcg(p.slot_first + blockIdx.x);
    end = __ldcg(p.slot_first + blockIdx.x + 1);
  }
  NVFP4_DEVICE static i64 next(const Params&, i64 u) { return u + 1; }
  NVFP4_DEVICE static Unit unit_at(const Params& p, i64 u, i64) {
    const int4* e = reinterpret_cast<const int4*>(p.units + u);
    const int4 a = __ldcg(e), b = __ldcg(e + 1);  // prob, l, tw, x_base | x_end, pieces, ks, pad
    Unit r;
    r.prob = a.x;
    r.l = a.y;
    r.tw = a.z;
    r.tx = 0;
    r.x_base = a.w;
    r.x_end = b.x;
    r.piece = b.y & 0xFFFF;
    r.pieces = (i32)((u32)b.y >> 16);
    r.k0 = b.z & 0xFFFF;
    r.k1 = (i32)((u32)b.z >> 16);
    r.tile = (i32)blockIdx.x - r.piece;  // the CTA holding the tile's head piece
    return r;
  }
};

}  // namespace sm90
