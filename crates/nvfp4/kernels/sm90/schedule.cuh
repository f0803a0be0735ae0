// sm90/schedule.cuh: work units and the walk every role of a CTA makes over them.
//
// A scheduler tells the pipeline which work units a CTA computes, in order, and which problem
// (operands, output) each belongs to; the producers, the consumers and the epilogue know nothing
// else about the launch. A scheduler type provides:
//   Params                      the kernel's parameter struct
//   problem(p, unit)            the Sm90Problem the unit computes on: the producers and the
//                               mainloop read its `main` part, the epilogue its `epi` part
//   cluster(p)                  CTAs per cluster that share X by multicast (1 or 2)
//   kcluster(p)                 CTAs per cluster that hold the K pieces of one tile (1: none;
//                               more: every CTA has one unit, its piece = its cluster rank)
//   first(p, u, end)            the CTA's first unit start and the end of its walk
//   next(p, u)                  the start of the unit after the one at u
//   unit_at(p, u, end)          the unit that starts at u
//   partials(p, u, floats)      where the pieces of the unit's tile keep their f32 partials
//   counter(p, u)               the arrival counter of the unit's tile (zero between launches)
//   prefetch_tensormaps(p, n)   warms the descriptor cache for the tensor maps of n W parts and X
//   TABLE_ON_DEVICE             the walk reads a table the pre-pass writes: every role waits for
//                               the pre-pass before its first unit
#pragma once

#include "sm90/config.cuh"

namespace sm90 {

// One tile of one problem over a range of k-steps.
struct Unit {
  i32 tw, tx, l;      // W tile, X tile, batch
  i32 tile;           // index of (tw, tx, l) for the split-K workspace and counters
  i32 piece, pieces;  // this K piece of the tile, and how many the tile has
  i32 k0, k1;         // 64-element k-steps [k0, k1)
  i32 prob;           // the problem (a grouped launch's group)
  i32 x_base, x_end;  // the tile's X rows start at x_base + tx * BN; rows from x_end on (another
                      // group's) are not stored, nor rows past the problem's x_rows
};

// Where a tile's K pieces keep their f32 partial tiles: piece j's at base + j * stride, and the
// first piece's `head` further.
struct Partials {
  float* base;
  i64 stride, head;
  NVFP4_DEVICE float* at(i32 j) const { return base + j * stride + (j == 0 ? head : 0); }
};

// One problem, its tiles cut along K by split-K or stream-K.
// Scheduling is per cluster ("slot"): the CTAs of a cluster walk the same units of a tile group
// (cluster consecutive W tiles, one X tile, one batch) and differ only in their W tile, so they
// load the same X sub-stages, each CTA half of it, multicast to both.
struct SingleProblem {
  using Params = Sm90Params;
  static constexpr bool TABLE_ON_DEVICE = false;

  NVFP4_DEVICE static const Sm90Problem& problem(const Params& p, const Unit&) { return p.prob; }
  NVFP4_DEVICE static i32 cluster(const Params& p) { return p.sched.cluster; }
  NVFP4_DEVICE static i32 kcluster(const Params& p) { return p.sched.k_mode == K_CLUSTER ? p.sched.split : 1; }
  NVFP4_DEVICE static void prefetch_tensormaps(const Params& p, int parts) {
    for (int part = 0; part < parts; ++part) ptx::prefetch_tensormap(&p.prob.main.tmap_w[part]);
    ptx::prefetch_tensormap(&p.prob.main.tmap_x);
  }
  // The f32 partial tiles of a unit's tile pieces (split-K, stream-K: `split` pieces at most per
  // tile, one after the other) and the tile's arrival counter.
  NVFP4_DEVICE static Partials partials(const Params& p, const Unit& u, i64 tile_floats) {
    return Partials{p.workspace + (i64)u.tile * p.sched.split * tile_floats, tile_floats, 0};
  }
  NVFP4_DEVICE static u32* counter(const Params& p, const Unit& u) { return p.counters + u.tile; }

  NVFP4_DEVICE static i32 slot_index(const Params& p) { return blockIdx.x / p.sched.cluster; }
  NVFP4_DEVICE static i32 slot_count(const Params& p) { return gridDim.x / p.sched.cluster; }

  // Stream-K: slot c owns the global k-steps [first(c), first(c + 1)) of the tile groups' k-steps
  // laid end to end (group-major), an even share of the whole problem.
  NVFP4_DEVICE static i64 stream_first(const Params& p, i64 c) {
    return c * ((i64)p.sched.units * p.sched.k_iters) / slot_count(p);
  }
  // The slot whose share holds global k-step i.
  NVFP4_DEVICE static i32 stream_owner(const Params& p, i64 i) {
    return (i32)(((i + 1) * slot_count(p) - 1) / ((i64)p.sched.units * p.sched.k_iters));
  }

  // The unit that starts at `u`: split-K, unit index u (group u / split, slice u % split);
  // stream-K, global k-step u, up to the end of its group's K or of this slot's share `end`.
  NVFP4_DEVICE static Unit unit_at(const Params& p, i64 u, i64 end) {
    const Sm90Schedule& s = p.sched;
    Unit r;
    i32 group;
    if (s.k_mode == K_STREAM) {
      group = (i32)(u / s.k_iters);
      const i64 t0 = (i64)group * s.k_iters;
      r.k0 = (i32)(u - t0);
      r.k1 = (i32)min((i64)s.k_iters, end - t0);
      const i32 owner0 = stream_owner(p, t0);
      r.piece = slot_index(p) - owner0;
      r.pieces = stream_owner(p, t0 + s.k_iters - 1) - owner0 + 1;
    } else {
      r.piece = (i32)(u % s.split);
      group = (i32)(u / s.split);
      r.pieces = s.split;
      r.k0 = r.piece * s.iters_per_split;
      r.k1 = min(s.k_iters, r.k0 + s.iters_per_split);
    }
    const i32 groups_w = s.tiles_w / s.cluster;
    r.tw = (group % groups_w) * s.cluster + cluster_rank(s.cluster);
    r.tx = (group / groups_w) % s.tiles_x;
    r.l = group / (groups_w * s.tiles_x);
    r.tile = (r.l * s.tiles_x + r.tx) * s.tiles_w + r.tw;
    r.prob = 0;
    r.x_base = 0;
    r.x_end = 0x7FFFFFFF;  // the operand's rows (store.cuh clips at x_rows)
    return r;
  }

  // Split-K: units slot, slot + slots, ...; stream-K: the pieces of the groups this slot's share
  // covers.
  NVFP4_DEVICE static void first(const Params& p, i64& u, i64& end) {
    if (p.sched.k_mode == K_STREAM) {
      u = stream_first(p, slot_index(p));
      end = stream_first(p, slot_index(p) + 1);
    } else {
      u = slot_index(p);
      end = p.sched.units;
    }
  }
  NVFP4_DEVICE static i64 next(const Params& p, i64 u) {
    return p.sched.k_mode == K_STREAM ? (u / p.sched.k_iters + 1) * p.sched.k_iters : u + slot_count(p);
  }
};

// The sequence of (unit, k-step) a CTA processes. Every role walks the same sequence, so
// sub-stage number g means the same data everywhere (and in both CTAs of a cluster).
template <class S>
struct Walk {
  i64 u, end;  // the current unit's start, the end of the walk
  Unit cur;
  i32 kk;
  NVFP4_DEVICE void start(const typename S::Params& p) {
    S::first(p, u, end);
    if (u < end) {
      cur = S::unit_at(p, u, end);
      kk = cur.k0;
    }
  }
  NVFP4_DEVICE bool valid() const { return u < end; }
  NVFP4_DEVICE void next_unit(const typename S::Params& p) {
    u = S::next(p, u);
    if (u < end) {
      cur = S::unit_at(p, u, end);
      kk = cur.k0;
    }
  }
  NVFP4_DEVICE void advance(const typename S::Params& p) {
    if (++kk >= cur.k1) next_unit(p);
  }
};

// A sub-stage opens a raw stage when it is the first of its unit or of an aligned group of
// SUB; it closes it when it is the last of its unit or of the group. Every role sees the same
// events, so the n-th opened raw stage is slot n % RAW_STAGES everywhere.
NVFP4_DEVICE bool raw_opens(const Unit& u, i32 kk) { return kk == u.k0 || kk % SUB == 0; }
NVFP4_DEVICE bool raw_closes(const Unit& u, i32 kk) { return kk == u.k1 - 1 || kk % SUB == SUB - 1; }

}  // namespace sm90
