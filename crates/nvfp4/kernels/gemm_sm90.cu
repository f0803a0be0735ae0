// gemm_sm90.cu: NVFP4 x NVFP4 GEMM on Hopper tensor cores (SPEC §3.2), c = A·Bᵀ, f16 out.
//
// Exactness: both operands are decoded to f16 with their e4m3 block scale multiplied in
// (e2m1 * e4m3 * 2^-7 is exact in f16), wgmma multiplies them exactly and sums in f32, and the
// epilogue scales the f32 sum by alpha * 2^14 and rounds once to f16 (RNE).
//
// Operands. The kernel computes D[w, x] = sum_k W[w, k] X[x, k] and stores D[w, x] at
// c[l * c_stride_l + w * c_stride_w + x * c_stride_x], so the host picks which GEMM operand
// plays W: for small M, W = B (the big weight matrix runs on the wgmma M side, 64 rows per
// instruction) and X = A (the few tokens are the wgmma N side); for large M, W = A and X = B.
// - W is decoded in registers by the consumer warpgroups and fed to wgmma as the A fragment
//   (RS form). It is never written back to shared memory.
// - X is decoded once per launch by `decode_nvfp4_f16_sm90` into an f16 copy in global memory
//   ([L, x_rows, K64], K padded with zeros to a multiple of 64), which the TMA loads straight
//   into the 128-byte-swizzled K-major layout the wgmma B descriptor reads.
// NOTE: decoding X inside the GEMM (a decoder warpgroup per CTA) re-decodes it once per W tile
// and was the bottleneck of the first five versions (ncu: consumers waited on the decoder, a
// single latency-bound warp per scheduler); the pre-pass decodes it once.
//
// K order. A dot product does not care about the order of k as long as both operands use the
// same one, and every element carries its own scale, so inside each 64-element stage the k
// order is permuted to what is cheapest to decode: the thread holding quad lane t of an A
// fragment owns scale block t of the stage (bytes 8t..8t+7 of a row, one scale), and the
// pre-pass places X elements at the matching positions (see the X pre-pass).
//
// Pipeline. W moves in raw stages of 256 K (128 bytes per row, 128-byte swizzle) with their
// scales; X moves in sub-stages of 64 K (BN rows of 128 bytes of f16). Two rings, each with
// full (TMA landed) and empty (consumers done) mbarriers.
// NOTE: TMA cost grows with the rows of a box, not its bytes: boxes of 32-byte rows ran at ~6
// cycles per row per SM and bounded an earlier version; every box here has 128-byte rows.
// Scales: one 2 KB bulk copy per 128 rows for blocked scales (4 consecutive 512-byte column
// groups), a tensor-map box [rows, 16 B] for plain scales (needs K % 256 == 0 for a 16-byte row
// stride), or, for plain scales with other K, byte loads by the W producer warp into the same
// [rows, 16 B] layout.
//
// Roles (384 threads, one CTA per SM, persistent over work units):
// - warp 0, "W producer": W's raw stages and their scales; lane 0 of warp 1, "X producer": the
//   decoded X sub-stages (the rest of the warpgroup only gives its registers away);
// - warpgroups 1, 2, "consumers": each owns WM m64 tiles of W; per sub-stage it decodes its W
//   fragments one k16 step at a time and issues WM wgmma m64nBNk16 per step, up to 4 (WM = 1)
//   or 2 (WM = 2) groups in flight (software pipeline), 4 steps per sub-stage.
//
// Work units: (W tile, X tile, batch, K slice). With split > 1 every slice writes its f32
// partial tile to the workspace; the last slice to arrive (a counter per tile) adds the slices
// in slice order (deterministic), stores, and resets the counter for the next launch.
#include "ptx.cuh"
#include "nvfp4.cuh"

// A CUtensorMap: 128 opaque bytes encoded on the host by cuTensorMapEncodeTiled.
struct alignas(64) TmaMap {
  u64 bits[16];
};

// How W's scales reach shared memory.
enum SfMode : i32 {
  SF_DIRECT = 0,  // plain layout, K % 256 != 0: byte loads by the W producer warp
  SF_TMA = 1,     // plain layout: a tensor-map box [rows, 16 B] per raw stage
  SF_BULK = 2,    // blocked layout: one 2 KB bulk copy per 128-row group per raw stage
};

// Mirrored by `GemmSm90Params` in backend/cuda/gemm.rs (#[repr(C, align(64))], same order).
struct GemmSm90Params {
  TmaMap tmap_w;        // W values: 3-D (K/2 bytes, w_rows, L) u8, box (128 B, BM, 1)
  TmaMap tmap_x;        // decoded X: 3-D (2 * K64 bytes, x_rows, L) f16, box (128 B, BN / cluster, 1)
  TmaMap tmap_sw;       // W plain scales: 3-D (K/16, w_rows, L) u8, box (16, BM, 1) (SF_TMA)
  const u8* sf_w;       // W scales: [L, w_rows, K/16] e4m3 (plain) or [L, R, C, 512] (blocked)
  u16* c;               // output f16
  float* workspace;     // [tiles, split, BM * BN] f32 split-K partials (consumer register image)
  u32* counters;        // [tiles] split-K arrivals, zero between launches
  double alpha;         // f32 sum * alpha, rounded once; alpha includes the 2^14 decode bias
  float alpha_f32;      // the same in f32 when it is a power of two (alpha_pow2)
  i32 alpha_pow2;
  i64 c_stride_w;       // elements between consecutive W rows in c
  i64 c_stride_x;       // elements between consecutive X rows in c
  i64 c_stride_l;       // elements between batches in c
  i32 w_rows, x_rows, k, l;
  i32 w_sf_mode;        // SfMode of W
  i32 tiles_w, tiles_x;  // tiles_w: a multiple of cluster
  i32 split;            // split-K: K slices per tile; stream-K: the most pieces of any tile
  i32 k_iters;          // 64-element stages in K, ceil(K / 64)
  i32 iters_per_split;  // stages per slice (every slice non-empty)
  i32 units;            // split-K: tile groups * split; stream-K: the tile groups
  i32 stream_k;         // 1: stream-K (the grid shares all stages evenly), 0: split-K
  i32 cluster;          // CTAs per cluster (1 or 2): a tile group, sharing X by TMA multicast
};

// Mirrored by `XDecodeParams` in backend/cuda/gemm.rs.
struct XDecodeParams {
  const u8* x;   // [L, rows, K/2] packed e2m1
  const u8* sf;  // [L, rows, K/16] e4m3, plain or blocked (SPEC §2)
  u16* out;      // [L, rows, K64] f16, K permuted per 64 (the X pre-pass), zero past K
  i32 rows, k, k64, l;
  i32 blocked;
  i32 pad_;
};

namespace {

constexpr int THREADS = 384;
constexpr int BK = 64;             // K elements per sub-stage: 32 bytes per W row, 4 scale blocks
constexpr int SUB = 4;             // sub-stages per raw (W) stage
constexpr int ROW_BYTES = 128;     // bytes of a W row per raw stage, of an X row per sub-stage
constexpr int SF_CHUNK = 512;      // blocked layout: bytes per (128 rows, 4 blocks)
constexpr int SMEM_CAP = 232448;   // dynamic shared memory per block on sm_90
constexpr int MIN_X_STAGES = 5;   // X ring depth reserved before the W ring takes the rest
constexpr int MAX_RAW_STAGES = 8;
constexpr int MAX_X_STAGES = 12;
constexpr int LAUNCH_REGS = 168;   // per thread at launch: 65536 / THREADS, down to a multiple of 8
constexpr int PRODUCER_REGS = 88;
constexpr int CONSUMER_REGS = 208;

// Compile-time shape of one variant. Shared memory (from a 1024-aligned base):
//   x[X_STAGES]      [BN, 64] f16, K-major, 128-byte swizzle   (wgmma B operand, one sub-stage)
//   raw[RAW_STAGES]  W: [BM, 128 B] u8 (TMA box, 128-byte swizzle), then its scales:
//                    [BM, 16 B] (SF_TMA box or SF_DIRECT copy) or [BM / 128, 4, 512 B] (SF_BULK)
//   bars             full_w, empty_w [RAW_STAGES]; full_x, empty_x [X_STAGES]; flag
// `Variant::smem_bytes` in backend/cuda/gemm.rs mirrors SMEM_BYTES.
template <int WM_, int BN_>
struct Cfg {
  static constexpr int WM = WM_;          // m64 tiles per consumer warpgroup
  static constexpr int BN = BN_;          // X rows per tile = wgmma N
  static constexpr int BM = 2 * 64 * WM;  // W rows per tile
  static constexpr int W_BYTES = BM * ROW_BYTES;
  static constexpr int SW_BYTES = BM * 16;  // = its 128-row groups * 4 * 512
  static constexpr int RAW_BYTES = W_BYTES + SW_BYTES;
  static constexpr int X_BYTES = BN * ROW_BYTES;
  // NOTE: W streams from DRAM and X from L2: the W ring gets the deeper prefetch (with 3 W
  // stages the consumers spent ~20% of their time waiting for W).
  static constexpr int RAW_FIT = (SMEM_CAP - 1024 - 512 - MIN_X_STAGES * X_BYTES) / RAW_BYTES;
  static constexpr int RAW_STAGES = RAW_FIT < MAX_RAW_STAGES ? RAW_FIT : MAX_RAW_STAGES;
  static constexpr int X_FIT = (SMEM_CAP - 1024 - 512 - RAW_STAGES * RAW_BYTES) / X_BYTES;
  static constexpr int X_STAGES = X_FIT < MAX_X_STAGES ? X_FIT : MAX_X_STAGES;
  static constexpr int X_OFF = 0;
  static constexpr int RAW_OFF = X_OFF + X_STAGES * X_BYTES;
  static constexpr int BAR_OFF = RAW_OFF + RAW_STAGES * RAW_BYTES;
  static constexpr int BAR_BYTES = (2 * RAW_STAGES + 2 * X_STAGES) * 8 + 8;
  static constexpr int SMEM_BYTES = 1024 + BAR_OFF + BAR_BYTES;  // + alignment slack
  static_assert(BN % 16 == 0 && BN <= 256, "wgmma N");
  static_assert(X_STAGES >= 3 && RAW_STAGES >= 2, "ring depths");
  static_assert(X_BYTES % 1024 == 0 && RAW_BYTES % 1024 == 0, "128-byte swizzle atoms are 1024 B");
  static_assert(SW_BYTES == (BM / 128) * SUB * SF_CHUNK, "blocked W chunks");
  static_assert(SMEM_BYTES <= SMEM_CAP, "shared memory per block");
  static_assert(WM * BN / 2 <= 128, "accumulator registers per thread");
  // NOTE: setmaxnreg.inc takes registers only from those the CTA was launched with (THREADS *
  // LAUNCH_REGS), not from the rest of the register file: a larger sum deadlocks the consumers.
  static_assert(128 * (PRODUCER_REGS + 2 * CONSUMER_REGS) <= THREADS * LAUNCH_REGS, "register pool");
};

// Shared-memory addresses of one CTA.
template <class C>
struct Smem {
  u32 base;
  NVFP4_DEVICE u32 x(u32 s) const { return base + C::X_OFF + s * C::X_BYTES; }
  NVFP4_DEVICE u32 raw_w(u32 s) const { return base + C::RAW_OFF + s * C::RAW_BYTES; }
  NVFP4_DEVICE u32 sc_w(u32 s) const { return raw_w(s) + C::W_BYTES; }
  NVFP4_DEVICE u32 full_w(u32 s) const { return base + C::BAR_OFF + s * 8; }
  NVFP4_DEVICE u32 empty_w(u32 s) const { return full_w(C::RAW_STAGES + s); }
  NVFP4_DEVICE u32 full_x(u32 s) const { return full_w(2 * C::RAW_STAGES + s); }
  NVFP4_DEVICE u32 empty_x(u32 s) const { return full_w(2 * C::RAW_STAGES + C::X_STAGES + s); }
  NVFP4_DEVICE u32 flag() const { return full_w(2 * C::RAW_STAGES + 2 * C::X_STAGES); }
};

// ---- scheduling: work units and the walk over their stages -------------------------------------

struct Unit {
  i32 tw, tx, l;      // W tile, X tile, batch
  i32 tile;           // index of (tw, tx, l) for the split-K workspace and counters
  i32 piece, pieces;  // this K piece of the tile, and how many the tile has
  i32 k0, k1;         // stages [k0, k1)
};

// Scheduling is per cluster ("slot"): the CTAs of a cluster walk the same units of a tile group
// (cluster consecutive W tiles, one X tile, one batch) and differ only in their W tile, so they
// load the same X sub-stages, each CTA half of it, multicast to both.
NVFP4_DEVICE i32 slot_index(const GemmSm90Params& p) { return blockIdx.x / p.cluster; }
NVFP4_DEVICE i32 slot_count(const GemmSm90Params& p) { return gridDim.x / p.cluster; }
// This CTA's rank in its cluster. NOTE: `&`, not `%` (cluster is 1 or 2): a `%` by a runtime
// value is a division, which in the consumers' loop cost ~12% of their stall samples.
NVFP4_DEVICE i32 cluster_rank(const GemmSm90Params& p) { return (i32)(blockIdx.x & (p.cluster - 1)); }

// Stream-K: slot c owns the global stages [first(c), first(c + 1)) of the tile groups' stages
// laid end to end (group-major), an even share of the whole problem.
NVFP4_DEVICE i64 stream_first(const GemmSm90Params& p, i64 c) {
  return c * ((i64)p.units * p.k_iters) / slot_count(p);
}
// The slot whose share holds global stage i.
NVFP4_DEVICE i32 stream_owner(const GemmSm90Params& p, i64 i) {
  return (i32)(((i + 1) * slot_count(p) - 1) / ((i64)p.units * p.k_iters));
}

// The unit that starts at `u`: split-K, unit index u (group u / split, slice u % split); stream-K,
// global stage u, up to the end of its group's K or of this slot's share `end`.
NVFP4_DEVICE Unit unit_at(const GemmSm90Params& p, i64 u, i64 end) {
  Unit r;
  i32 group;
  if (p.stream_k) {
    group = (i32)(u / p.k_iters);
    const i64 t0 = (i64)group * p.k_iters;
    r.k0 = (i32)(u - t0);
    r.k1 = (i32)min((i64)p.k_iters, end - t0);
    const i32 owner0 = stream_owner(p, t0);
    r.piece = slot_index(p) - owner0;
    r.pieces = stream_owner(p, t0 + p.k_iters - 1) - owner0 + 1;
  } else {
    r.piece = (i32)(u % p.split);
    group = (i32)(u / p.split);
    r.pieces = p.split;
    r.k0 = r.piece * p.iters_per_split;
    r.k1 = min(p.k_iters, r.k0 + p.iters_per_split);
  }
  const i32 groups_w = p.tiles_w / p.cluster;
  r.tw = (group % groups_w) * p.cluster + cluster_rank(p);
  r.tx = (group / groups_w) % p.tiles_x;
  r.l = group / (groups_w * p.tiles_x);
  r.tile = (r.l * p.tiles_x + r.tx) * p.tiles_w + r.tw;
  return r;
}

// The sequence of (unit, stage) a CTA processes: split-K, units slot, +slots, ...; stream-K, the
// pieces of the groups its slot's share covers. Every role walks the same sequence, so sub-stage
// number g means the same data everywhere (and in both CTAs of a cluster).
struct Walk {
  i64 u, end;  // the current unit's start (unit index or global stage), the end of the walk
  Unit cur;
  i32 kk;
  NVFP4_DEVICE void start(const GemmSm90Params& p) {
    if (p.stream_k) {
      u = stream_first(p, slot_index(p));
      end = stream_first(p, slot_index(p) + 1);
    } else {
      u = slot_index(p);
      end = p.units;
    }
    if (u < end) {
      cur = unit_at(p, u, end);
      kk = cur.k0;
    }
  }
  NVFP4_DEVICE bool valid() const { return u < end; }
  NVFP4_DEVICE void next_unit(const GemmSm90Params& p) {
    u = p.stream_k ? (u / p.k_iters + 1) * p.k_iters : u + slot_count(p);
    if (u < end) {
      cur = unit_at(p, u, end);
      kk = cur.k0;
    }
  }
  NVFP4_DEVICE void advance(const GemmSm90Params& p) {
    if (++kk >= cur.k1) next_unit(p);
  }
};

// A sub-stage opens a raw stage when it is the first of its unit or of an aligned group of
// SUB; it closes it when it is the last of its unit or of the group. Both roles see the same
// events, so the n-th opened raw stage is slot n % RAW_STAGES everywhere.
NVFP4_DEVICE bool raw_opens(const Unit& u, i32 kk) { return kk == u.k0 || kk % SUB == 0; }
NVFP4_DEVICE bool raw_closes(const Unit& u, i32 kk) { return kk == u.k1 - 1 || kk % SUB == SUB - 1; }

// ---- X pre-pass: FP4 -> f16 in the GEMM's k order ----------------------------------------------

// The decoded X row order: 16-byte chunk c = 2j + h of a 64-element group holds k slots
// 16j + 8h .. +7 of k16 step j: for quad lane t the f16x2 it pairs with its A fragment
// registers (h = 0: fragment pair 0, h = 1: pair 1), i.e. for j = 2J + i, (e_{4i}, e_{4i+2})
// (h = 0) and (e_{4i+1}, e_{4i+3}) (h = 1) of word J (elements 16t + 8J .. +7) of scale block
// t. This is the order in which the consumers take W's elements (`Consumer::mainloop`).

}  // namespace

// One thread per 16-byte output chunk: chunk c (J = c / 4, q = c % 4) of 64-element group gi of
// a row takes pair q of word J of each of the group's 4 scale blocks (the order above), so a
// warp stores 512 contiguous bytes and the 8 lanes of a group load the same 16 input bytes.
// 32-bit indexing: the host checks that L * rows * K64 fits.
extern "C" __global__ void __launch_bounds__(256) decode_nvfp4_f16_sm90(const __grid_constant__ XDecodeParams p) {
  ptx::launch_dependents();  // the GEMM may start its setup and W loads now
  const i32 groups = p.k64 / BK;
  const i32 idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= p.l * p.rows * groups * 8) return;
  const i32 c = idx & 7, J = c >> 2, q = c & 3;
  const i32 gi = (idx >> 3) % groups;
  const i32 lr = (idx >> 3) / groups;  // l * rows + row
  const i32 sf_cols = p.k / 16;
  // K % 16 == 0: a row starts 8-byte aligned and every 8-element word lies wholly inside or
  // wholly past K.
  const u8* src = p.x + (i64)lr * (p.k / 2) + 32 * gi + 4 * J;
  u32 out[4];
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const i32 col = 4 * gi + t;  // scale block t of the group
    const bool in_k = col < sf_cols;
    const u32 w = in_k ? ptx::ld_nc_u32(src + 8 * t) : 0u;
    const u32 sc =
        in_k ? ptx::ld_nc_u8(p.sf + nvfp4::scale_offset(p.blocked != 0, p.rows, sf_cols, lr % p.rows, col, lr / p.rows))
             : 0u;
    u32 even, odd;
    nvfp4::e2m1x8_spread(w, even, odd);
    out[t] = ptx::hmul2(nvfp4::f16x2_of_spread(q & 1 ? odd : even, q >> 1), nvfp4::scale_f16x2_x128(sc));
  }
  *reinterpret_cast<uint4*>(p.out + (i64)lr * p.k64 + BK * gi + 8 * c) = make_uint4(out[0], out[1], out[2], out[3]);
}

namespace {

// ---- producers: every TMA load ----------------------------------------------------------------

// Plain scales whose rows are not 16-byte aligned (K % 256 != 0): the W producer warp copies raw
// stage q's [BM, 16 B] with byte loads, zero past the operand's rows and K.
template <class C>
NVFP4_DEVICE void copy_scales_direct(const GemmSm90Params& p, u32 dst, i32 row0, i32 q, i32 l) {
  const i32 sf_cols = p.k / 16, lane = threadIdx.x % 32;
  for (i32 r = lane; r < C::BM; r += 32) {
    const i32 grow = row0 + r;
    u32 v[4] = {0, 0, 0, 0};
#pragma unroll
    for (int b = 0; b < 16; ++b) {
      const i32 col = 16 * q + b;
      if (grow < p.w_rows && col < sf_cols) v[b / 4] |= ptx::ld_nc_u8(p.sf_w + ((i64)l * p.w_rows + grow) * sf_cols + col) << (8 * (b % 4));
    }
    ptx::sts_v4(dst + r * 16, v[0], v[1], v[2], v[3]);
  }
}

// Issues W's scales for raw stage q into `dst`; returns the transaction bytes. `count_only`
// computes the bytes without copying (the arrive.expect_tx must precede the copies).
template <class C>
NVFP4_DEVICE u32 issue_w_scales(const GemmSm90Params& p, bool count_only, u32 dst, u32 bar, i32 row0, i32 q, i32 l,
                                u64 pol) {
  if (p.w_sf_mode == SF_TMA) {
    if (!count_only) ptx::tma_load_3d(dst, &p.tmap_sw, bar, q * 16, row0, l, pol);
    return C::BM * 16;
  }
  if (p.w_sf_mode != SF_BULK) return 0;
  const i32 sf_cols = p.k / 16;
  const i32 R = (p.w_rows + 127) / 128, Cg = (sf_cols + 3) / 4;  // 128-row groups, 4-block columns
  // A tile wholly past the rows (the padding tile of a CTA pair) has no scale groups.
  const i32 g0 = row0 / 128, g1 = max(g0, min(R, (row0 + C::BM + 127) / 128));
  const u32 bytes = min(SUB, Cg - SUB * q) * SF_CHUNK;  // the K tail has fewer columns
  if (!count_only)
    for (i32 g = g0; g < g1; ++g)
      ptx::bulk_load(dst + (g - g0) * SUB * SF_CHUNK, p.sf_w + (((i64)l * R + g) * Cg + SUB * q) * SF_CHUNK, bytes, bar,
                     pol);
  return (g1 - g0) * bytes;
}

// W producer (warp 0): raw stages as far ahead as the W ring allows.
// NOTE: W and X have their own producer warps. One warp walking both rings in lockstep was held
// back by the X ring (5 sub-stages ahead), so the 8-deep W ring never filled and the consumers
// spent 29% of their stall samples waiting for W from DRAM (ncu, 128x7168x16384).
template <class C>
NVFP4_DEVICE void producer_w(const GemmSm90Params& p, const Smem<C>& sm) {
  const bool leader = threadIdx.x == 0;
  const u64 pol_w = ptx::policy_evict_first();  // W is streamed once
  Walk w;
  w.start(p);
  u32 n = 0;  // raw stages opened
  for (; w.valid(); w.advance(p)) {
    const Unit& u = w.cur;
    if (!raw_opens(u, w.kk)) continue;
    const u32 s = n % C::RAW_STAGES;
    if (n >= (u32)C::RAW_STAGES) ptx::mbar_wait(sm.empty_w(s), ((n / C::RAW_STAGES) - 1) & 1);
    const i32 q = w.kk / SUB, row0 = u.tw * C::BM;
    if (p.w_sf_mode == SF_DIRECT) copy_scales_direct<C>(p, sm.sc_w(s), row0, q, u.l);
    // full_w counts every lane of this warp: each releases its own scale stores (SF_DIRECT).
    if (!leader) ptx::mbar_arrive(sm.full_w(s));
    if (leader) {
      const u32 sbytes = issue_w_scales<C>(p, true, sm.sc_w(s), sm.full_w(s), row0, q, u.l, pol_w);
      ptx::mbar_arrive_expect_tx(sm.full_w(s), C::W_BYTES + sbytes);
      issue_w_scales<C>(p, false, sm.sc_w(s), sm.full_w(s), row0, q, u.l, pol_w);
      ptx::tma_load_3d(sm.raw_w(s), &p.tmap_w, sm.full_w(s), q * ROW_BYTES, row0, u.l, pol_w);
    }
    ++n;
  }
}

// X producer (lane 0 of warp 1): one decoded-X sub-stage per k64 step. In a cluster of two, each
// CTA loads half of the sub-stage's rows into both CTAs (TMA multicast), which halves the L2
// reads of X; either CTA's full barrier expects the whole sub-stage.
template <class C>
NVFP4_DEVICE void producer_x(const GemmSm90Params& p, const Smem<C>& sm) {
  const u64 pol_x = ptx::policy_evict_last();  // decoded X tiles are re-read by every W tile
  const i32 rank = cluster_rank(p), rows = C::BN / p.cluster;
  const u32 part = (u32)rank * (C::X_BYTES / p.cluster);  // a multiple of 1024 B (swizzle atom)
  // NOTE: launched as a programmatic dependent of the X pre-pass: the setup and the W producer's
  // first stages overlap the pre-pass; X is read only after it has completed.
  ptx::wait_prerequisites();
  Walk w;
  w.start(p);
  for (u32 g = 0; w.valid(); ++g, w.advance(p)) {
    const u32 xs = g % C::X_STAGES;
    // The slot is free when the consumers of every CTA it is multicast to have released it.
    if (g >= (u32)C::X_STAGES) ptx::mbar_wait(sm.empty_x(xs), ((g / C::X_STAGES) - 1) & 1);
    ptx::mbar_arrive_expect_tx(sm.full_x(xs), C::X_BYTES);
    const i32 row = w.cur.tx * C::BN + rank * rows;
    if (p.cluster == 1)
      ptx::tma_load_3d(sm.x(xs), &p.tmap_x, sm.full_x(xs), w.kk * ROW_BYTES, row, w.cur.l, pol_x);
    else
      ptx::tma_load_3d_multicast(sm.x(xs) + part, &p.tmap_x, sm.full_x(xs), w.kk * ROW_BYTES, row, w.cur.l,
                                 (u16)((1u << p.cluster) - 1), pol_x);
  }
}

// ---- consumer warpgroups: W fragments, wgmma, epilogue ------------------------------------------

template <class C>
struct Consumer {
  static constexpr int NACC = C::BN / 2;  // f32 accumulators per m64 tile per thread
  float acc[C::WM][NACC];
  // Thread coordinates, recomputed on use (registers are the scarce resource here).
  NVFP4_DEVICE static int ctid() { return threadIdx.x - 128; }  // 0..255 over both warpgroups
  NVFP4_DEVICE static int wg() { return ctid() / 128; }
  NVFP4_DEVICE static int warp() { return (ctid() / 32) % 4; }
  NVFP4_DEVICE static int lane_() { return ctid() % 32; }

  // Row (within the tile) of fragment row h of m-tile mt: the A-fragment rows lane / 4 (+8).
  NVFP4_DEVICE static int frag_row(int mt, int h) { return wg() * C::WM * 64 + mt * 64 + warp() * 16 + lane_() / 4 + 8 * h; }

  // Hands X slot s back when `pred`: one arrival per warp (its wgmmas reading the slot have
  // retired) on this CTA's empty barrier and, in a cluster, on the peer CTA's, whose producer
  // multicasts into this CTA's slot too.
  NVFP4_DEVICE static void release_x(const GemmSm90Params& p, const Smem<C>& sm, u32 s, bool pred) {
    const bool lead = pred && lane_() == 0;
    ptx::mbar_arrive_if(sm.empty_x(s), lead);
    const u32 peer = (u32)(cluster_rank(p) ^ (p.cluster - 1));  // itself without a cluster
    ptx::mbar_arrive_cluster_if(ptx::map_shared_rank(sm.empty_x(s), peer), lead && p.cluster > 1);
  }

  // One work unit's K range: acc = sum over its sub-stages. `g` and `n` are the CTA's running
  // sub-stage and raw-stage counts (the same numbering as the producer's walk).
  NVFP4_DEVICE void mainloop(const GemmSm90Params& p, const Smem<C>& sm, const Unit& un, u32& g, u32& n) {
    const int lane = lane_(), t = lane % 4;
    const int r0 = frag_row(0, 0);
    // This thread's 8 bytes (block t) of fragment row r in sub-stage `sub` of a raw W row: 16-byte
    // chunk 2 * sub + t / 2 sits at chunk (2 * sub + t / 2) ^ (r % 8) (128-byte swizzle), and
    // r % 8 = lane / 4 for every fragment row of this thread.
    const u32 swz = (u32)((t / 2) ^ (lane / 4));
    const u32 w_off = r0 * ROW_BYTES + 8 * (t % 2);
    // Its scale byte (block t of sub-stage sub) of row r0 in the raw stage's scale area; rows
    // r0 + 8 are 128 bytes further in both layouts, r0 + 64 (next m-tile) `sc_mt` further.
    const bool bulk = p.w_sf_mode == SF_BULK;
    const u32 sc_off = bulk ? (r0 / 128) * (SUB * SF_CHUNK) + (r0 % 32) * 16 + ((r0 % 128) / 32) * 4 + t : r0 * 16 + t;
    const u32 sc_mt = bulk ? 8 : 64 * 16, sc_sub = bulk ? SF_CHUNK : 4;
    const i32 sf_cols = p.k / 16;
#pragma unroll
    for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
      for (int i = 0; i < NACC; ++i) acc[mt][i] = 0.f;

    // A fragments of the k16 steps in flight, [step % NBUF][mt][reg]. NOTE: the decode of a step
    // sits between two wgmma waits; one m64n128k16 per step is short (64 tensor cycles), so 4
    // buffers (3 groups in flight) hide the decode behind the tensor cores. Longer steps (two
    // m-tiles, or N = 256) do with 2, and have no registers for more.
    constexpr int NBUF = C::WM == 1 && C::BN <= 128 ? 4 : 2;
    u32 frag[NBUF][C::WM][4];
    u32 prev_xs = 0;
    bool has_prev = false;  // a sub-stage of this unit whose X slot is not yet handed back
    u32 rs = 0;
    for (i32 kk = un.k0; kk < un.k1; ++kk, ++g) {
      if (raw_opens(un, kk)) {
        rs = n % C::RAW_STAGES;
        ptx::mbar_wait(sm.full_w(rs), (n / C::RAW_STAGES) & 1);
        ++n;
      }
      const u32 sub = kk % SUB;
      const u32 wa = sm.raw_w(rs) + w_off + (((2 * sub) ^ swz) << 4);
      const u32 sa = sm.sc_w(rs) + sc_off + sub * sc_sub;
      const bool in_k = 4 * kk + t < sf_cols;  // blocks past K: scale 0 (padding may be NaN)
      uint2 raw[C::WM][2];                     // row's bytes 8t..8t+7 of the sub-stage: block t
      u32 s2[C::WM][2];                        // its scale, as f16x2 (scale * 2^7)
#pragma unroll
      for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          raw[mt][h] = ptx::lds_v2(wa + (mt * 64 + 8 * h) * ROW_BYTES);
          const u32 sc = ptx::lds_u8(sa + mt * sc_mt + 128 * h);
          s2[mt][h] = nvfp4::scale_f16x2_x128(in_k ? sc : 0u);
        }
      // NOTE: arrivals are made by every thread and predicated, never branched around: a branch
      // between wgmmas makes ptxas serialize the whole wgmma pipeline. A release arrival also
      // orders this thread's loads of the slot before it.
      ptx::mbar_arrive_if(sm.empty_w(rs), raw_closes(un, kk));
      const u32 xs = g % C::X_STAGES;
      ptx::mbar_wait(sm.full_x(xs), (g / C::X_STAGES) & 1);
      const u64 desc = ptx::wgmma_desc_k128b(sm.x(xs));

      // Software pipeline over the 4 k16 steps: decode step j's A fragments while earlier
      // wgmma groups run. Fragment regs [mt][reg] = (row g, pair 0), (row g+8, pair 0),
      // (row g, pair 1), (row g+8, pair 1); word J of the block feeds steps 2J and 2J + 1.
      u32 spread[C::WM][2][2];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (j % 2 == 0) {
#pragma unroll
          for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              nvfp4::e2m1x8_spread(j == 0 ? raw[mt][h].x : raw[mt][h].y, spread[mt][h][0], spread[mt][h][1]);
        }
        // frag[j % NBUF] was last read by the group NBUF steps back: at most NBUF - 1 groups may
        // still run before it is overwritten.
        ptx::wgmma_wait<NBUF - 1>();
        // After step NBUF - 1's wait every group of the previous sub-stage has retired: its X
        // slot goes back to the producer.
        if (j == NBUF - 1) release_x(p, sm, prev_xs, has_prev);
        u32(&f)[C::WM][4] = frag[j % NBUF];
#pragma unroll
        for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            f[mt][h] = ptx::hmul2(nvfp4::f16x2_of_spread(spread[mt][h][0], j & 1), s2[mt][h]);
            f[mt][2 + h] = ptx::hmul2(nvfp4::f16x2_of_spread(spread[mt][h][1], j & 1), s2[mt][h]);
          }
        ptx::wgmma_fence();
#pragma unroll
        for (int mt = 0; mt < C::WM; ++mt) ptx::wgmma_rs<C::BN>(acc[mt], f[mt], desc + 2 * j);  // +32 B
        ptx::wgmma_commit();
      }
      prev_xs = xs;
      has_prev = true;
    }
    ptx::wgmma_wait<0>();
#pragma unroll
    for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
      for (int i = 0; i < NACC; ++i) ptx::reg_fence(acc[mt][i]);
    release_x(p, sm, prev_xs, has_prev);
  }

  // v * alpha rounded once to f16: in f32 when alpha is a power of two (the product is exact),
  // else in f64 (a product of two f32 is exact in f64).
  NVFP4_DEVICE static u32 to_f16(const GemmSm90Params& p, float v) {
    return p.alpha_pow2 ? ptx::f32_to_f16_rn(v * p.alpha_f32) : ptx::f64_to_f16_rn((double)v * p.alpha);
  }
  // Two of them as an f16x2, for a power-of-two alpha.
  NVFP4_DEVICE static u32 to_f16x2_pow2(const GemmSm90Params& p, float lo, float hi) {
    return ptx::f32x2_to_f16x2_rn(lo * p.alpha_f32, hi * p.alpha_f32);
  }

  // Stores the tile held in `v` (this thread's accumulator image). Offsets are 32-bit: the host
  // checks that L * M * N fits. A tile wholly inside c with even strides takes a fast path of
  // 4-byte stores of f16 pairs: adjacent X for W = A (c rows run along X); for W = B (c rows run
  // along W) the pairs of adjacent W rows, held by lanes 4 apart, are formed by one exchange.
  template <bool POW2>
  NVFP4_DEVICE void store_tile_as(const GemmSm90Params& p, const Unit& un, const float (&v)[C::WM][NACC]) const {
    u16* cl = p.c + (i64)un.l * p.c_stride_l;
    const int t = lane_() % 4, r0 = frag_row(0, 0);
    const i32 sw = (i32)p.c_stride_w, sx = (i32)p.c_stride_x, w0 = un.tw * C::BM, x0 = un.tx * C::BN;
    // NOTE: the paired fast paths only with a power-of-two alpha: batched f64 conversions of the
    // general alpha spill registers. The general path below is exact for any alpha.
    const bool full = POW2 && w0 + C::BM <= p.w_rows && x0 + C::BN <= p.x_rows && p.c_stride_l % 2 == 0;
    if (full && sx == 1 && sw % 2 == 0) {
#pragma unroll
      for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          u16* row = cl + (w0 + (r0 + 64 * mt + 8 * h)) * sw + x0 + 2 * t;
#pragma unroll
          for (int q = 0; q < C::BN / 8; ++q)
            *reinterpret_cast<u32*>(row + 8 * q) = to_f16x2_pow2(p, v[mt][4 * q + 2 * h], v[mt][4 * q + 2 * h + 1]);
        }
      return;
    }
    // NOTE: not for 2 m-tiles per warpgroup: its exchange code would spill there, and the
    // heuristic gives W = B (small M) to the 1-m-tile variants.
    if (C::WM == 1 && full && sw == 1 && sx % 2 == 0) {
      // Lane pairs (g, g+1), g even, hold W rows w, w+1: the even lane keeps column x and stores
      // c[x][w, w+1]; the odd lane keeps column x+1 and stores c[x+1][w-1, w].
      const bool even = (lane_() / 4) % 2 == 0;
#pragma unroll
      for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const i32 w = w0 + (r0 + 64 * mt + 8 * h) - (even ? 0 : 1);
          u16* col = cl + (x0 + 2 * t + (even ? 0 : 1)) * sx + w;
#pragma unroll
          for (int q = 0; q < C::BN / 8; ++q) {
            const u32 ab = to_f16x2_pow2(p, v[mt][4 * q + 2 * h], v[mt][4 * q + 2 * h + 1]);  // (x, x+1)
            const u32 other = __shfl_xor_sync(0xFFFFFFFFu, even ? ab >> 16 : ab & 0xFFFF, 4);
            *reinterpret_cast<u32*>(col + 8 * q * sx) = even ? (ab & 0xFFFF) | (other << 16) : other | (ab & 0xFFFF0000u);
          }
        }
      return;
    }
    // Edge tiles and odd strides: element by element.
#pragma unroll
    for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
      for (int i = 0; i < NACC; ++i) {
        const i32 w = w0 + (r0 + 64 * mt + 8 * ((i >> 1) & 1)), x = x0 + 8 * (i >> 2) + 2 * t + (i & 1);
        if (w < p.w_rows && x < p.x_rows) cl[w * sw + x * sx] = (u16)to_f16(p, v[mt][i]);
      }
  }

  NVFP4_DEVICE void store_tile(const GemmSm90Params& p, const Unit& un, const float (&v)[C::WM][NACC]) const {
    if (p.alpha_pow2)
      store_tile_as<true>(p, un, v);
    else
      store_tile_as<false>(p, un, v);
  }

  // Quad q of this thread's accumulators (4 consecutive f32 of one m-tile), and its place in a
  // workspace tile: the register image, so that a CTA's stores and loads are coalesced float4s.
  NVFP4_DEVICE float4 quad(int q) const {
    const int mt = q / (NACC / 4), i = 4 * (q % (NACC / 4));
    return make_float4(acc[mt][i], acc[mt][i + 1], acc[mt][i + 2], acc[mt][i + 3]);
  }
  NVFP4_DEVICE void set_quad(int q, float4 v) {
    const int mt = q / (NACC / 4), i = 4 * (q % (NACC / 4));
    acc[mt][i] = v.x;
    acc[mt][i + 1] = v.y;
    acc[mt][i + 2] = v.z;
    acc[mt][i + 3] = v.w;
  }
  NVFP4_DEVICE static int quad_offset(int q) { return (q * 256 + ctid()) * 4; }

  NVFP4_DEVICE void epilogue(const GemmSm90Params& p, const Smem<C>& sm, const Unit& un) {
    if (un.pieces == 1) {
      store_tile(p, un, acc);
      return;
    }
    // Split-K: publish this slice's partial (register image, coalesced float4 per thread).
    constexpr int QUADS = C::WM * NACC / 4;
    constexpr i64 TILE_FLOATS = (i64)C::BM * C::BN;
    float* ws_tile = p.workspace + (i64)un.tile * p.split * TILE_FLOATS;
    float* mine = ws_tile + un.piece * TILE_FLOATS;
#pragma unroll
    for (int q = 0; q < QUADS; ++q) ptx::st_cg_v4(mine + quad_offset(q), quad(q));
    __threadfence();
    ptx::named_barrier(1, 256);
    u32* flag = reinterpret_cast<u32*>(__cvta_shared_to_generic(sm.flag()));
    if (ctid() == 0) *flag = atomicAdd(p.counters + un.tile, 1u) == (u32)un.pieces - 1;
    ptx::named_barrier(1, 256);
    if (!*flag) return;
    // Last slice: sum all slices in slice order, whoever arrived last (deterministic), in place,
    // CHUNK quads at a time (quad q of acc is read as this slice's partial before it is
    // overwritten by the sum).
    // NOTE: a slice's loads of a chunk are issued together: one dependent L2 round trip per quad
    // and slice cost ~4.6 µs per slice of the tail (128x7168x2048: split 2 lost to split 1).
    __threadfence();
    constexpr int CHUNK = C::WM * NACC <= 64 ? 8 : 1;  // with 128 accumulators, 2 spill
#pragma unroll
    for (int q0 = 0; q0 < QUADS; q0 += CHUNK) {
      float4 sum[CHUNK];
#pragma unroll
      for (int c = 0; c < CHUNK; ++c) sum[c] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 1
      for (int sl = 0; sl < un.pieces; ++sl) {
        float4 v[CHUNK];
#pragma unroll
        for (int c = 0; c < CHUNK; ++c)
          v[c] = sl == un.piece ? quad(q0 + c) : ptx::ld_cg_v4(ws_tile + sl * TILE_FLOATS + quad_offset(q0 + c));
#pragma unroll
        for (int c = 0; c < CHUNK; ++c) {
          sum[c].x += v[c].x;
          sum[c].y += v[c].y;
          sum[c].z += v[c].z;
          sum[c].w += v[c].w;
        }
      }
#pragma unroll
      for (int c = 0; c < CHUNK; ++c) set_quad(q0 + c, sum[c]);
    }
    store_tile(p, un, acc);
    if (ctid() == 0) p.counters[un.tile] = 0;
  }
};

template <class C>
NVFP4_DEVICE void consumer_role(const GemmSm90Params& p, const Smem<C>& sm) {
  Consumer<C> cs;
  Walk walk;
  walk.start(p);
  u32 g = 0, n = 0;
  for (; walk.valid(); walk.next_unit(p)) {
    cs.mainloop(p, sm, walk.cur, g, n);
    // NOTE: the unit is recomputed rather than kept: its fields would otherwise stay live across
    // the mainloop.
    cs.epilogue(p, sm, unit_at(p, walk.u, walk.end));
  }
}

template <int WM, int BN>
NVFP4_DEVICE void gemm_sm90(const GemmSm90Params& p) {
  using C = Cfg<WM, BN>;
  extern __shared__ __align__(1024) u8 smem_raw[];
  Smem<C> sm;
  sm.base = (ptx::smem_u32(smem_raw) + 1023u) & ~1023u;
  if (ptx::dynamic_smem_size() < (u32)C::SMEM_BYTES) __trap();  // host/kernel shape mismatch

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::RAW_STAGES; ++s) {
      ptx::mbar_init(sm.full_w(s), 32);    // every producer lane, the leader with expect_tx
      ptx::mbar_init(sm.empty_w(s), 256);  // every consumer thread
    }
    for (int s = 0; s < C::X_STAGES; ++s) {
      ptx::mbar_init(sm.full_x(s), 1);
      ptx::mbar_init(sm.empty_x(s), 8 * p.cluster);  // every consumer warp of the cluster
    }
    ptx::fence_mbar_init();
    ptx::prefetch_tensormap(&p.tmap_w);
    ptx::prefetch_tensormap(&p.tmap_x);
  }
  // In a cluster, no CTA may multicast into (or arrive on) the other's barriers before they are
  // initialised, nor exit while the other may still do so.
  if (p.cluster > 1)
    ptx::cluster_sync();
  else
    __syncthreads();

  if (threadIdx.x < 128) {
    ptx::setmaxnreg_dec<PRODUCER_REGS>();
    if (threadIdx.x < 32) producer_w<C>(p, sm);
    else if (threadIdx.x == 32) producer_x<C>(p, sm);
  } else {
    ptx::setmaxnreg_inc<CONSUMER_REGS>();
    consumer_role<C>(p, sm);
  }
  if (p.cluster > 1) ptx::cluster_sync();
}

}  // namespace

// Kernel variants: gemm_nvfp4_sm90_ws_m{BM}n{BN}. The host picks one per problem (gemm.rs).
#define GEMM_SM90_VARIANT(BM, BN)                                                                 \
  extern "C" __global__ void __launch_bounds__(THREADS, 1)                                        \
      gemm_nvfp4_sm90_ws_m##BM##n##BN(const __grid_constant__ GemmSm90Params p) {                \
    static_assert(BM % 128 == 0, "two consumer warpgroups of 64-row tiles");                      \
    gemm_sm90<BM / 128, BN>(p);                                                                   \
  }

GEMM_SM90_VARIANT(256, 16)
GEMM_SM90_VARIANT(256, 32)
GEMM_SM90_VARIANT(256, 64)
GEMM_SM90_VARIANT(256, 128)
GEMM_SM90_VARIANT(128, 128)
GEMM_SM90_VARIANT(128, 256)
