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
// - X must be f16 in shared memory: a decoder warpgroup turns each TMA-loaded FP4 X tile into
//   the 128-byte-swizzled K-major f16 layout that the wgmma B descriptor reads.
//
// K order. A dot product does not care about the order of k as long as both operands use the
// same one, and every element carries its own scale, so inside each 64-element stage the k
// order is permuted to what is cheapest to decode: the thread holding quad lane t of an A
// fragment owns scale block t of the stage (bytes 8t..8t+7 of a row, one scale), and the
// decoder places X elements at the matching positions (see `decode_x_row`).
//
// Pipeline. The TMA moves 256 K elements per stage ("raw stage": 128 bytes per row, 128-byte
// swizzle), and the roles compute it as 4 sub-stages of 64 K (one wgmma k16 per scale block).
// NOTE: TMA cost grows with the rows of a box, not its bytes: boxes of 32-byte rows ran at ~6
// cycles per row per SM and bounded the whole kernel; 128-byte rows quarter the row count.
// Scales travel in the same raw stage: one 2 KB bulk copy per 128 rows for blocked scales (4
// consecutive 512-byte column groups), or a tensor-map box [rows, 16 B] for plain scales (needs
// K % 256 == 0 for a 16-byte row stride). Plain scales with other K fall back to direct global
// loads, which are slow: the release arrivals and proxy fences of every stage wait for them.
//
// Roles (384 threads, one CTA per SM, persistent over work units):
// - warpgroup 0, "decoder": decodes the X tile of every sub-stage into an f16 ring; its thread
//   0 also issues the TMA loads (W and X FP4 tiles and their scales) LEAD raw stages ahead.
// - warpgroups 1, 2, "consumers": each owns WM m64 tiles of W; per sub-stage it decodes its W
//   fragments one k16 step at a time and issues WM wgmma m64nBNk16 per step, up to 2 groups in
//   flight (software pipeline), 4 steps per sub-stage.
// Barriers: full[raw] (TMA landed: values and scales), empty[raw] (consumers read their W bytes
// and scales of its last sub-stage after the decoder read its X bytes), xready[xf] (decoder
// wrote a sub-stage's f16 X), xfree[xf] (consumers' wgmmas are done with it).
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

// How an operand's scales reach the kernel.
enum SfMode : i32 {
  SF_DIRECT = 0,  // plain layout, K % 256 != 0: global loads by the threads that use them
  SF_TMA = 1,     // plain layout: a tensor-map box [rows, 16 B] per raw stage
  SF_BULK = 2,    // blocked layout: one 2 KB bulk copy per 128-row group per raw stage
};

// Mirrored by `GemmSm90Params` in backend/cuda/gemm.rs (#[repr(C, align(64))], same order).
struct GemmSm90Params {
  TmaMap tmap_w;        // W values: 3-D (K/2 bytes, w_rows, L) u8, box (32, BM, 1)
  TmaMap tmap_x;        // X values: 3-D (K/2 bytes, x_rows, L) u8, box (32, BN, 1)
  TmaMap tmap_sw;       // W plain scales: 3-D (K/16, w_rows, L) u8, box (16, BM, 1) (SF_TMA)
  TmaMap tmap_sx;       // X plain scales: 3-D (K/16, x_rows, L) u8, box (16, BN, 1) (SF_TMA)
  const u8* sf_w;       // W scales: [L, w_rows, K/16] e4m3 (plain) or [L, R, C, 512] (blocked)
  const u8* sf_x;       // X scales, the same
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
  i32 w_sf_mode, x_sf_mode;  // SfMode of each operand
  i32 tiles_w, tiles_x;
  i32 split;            // K slices per tile
  i32 k_iters;          // 64-element stages in K, ceil(K / 64)
  i32 iters_per_split;  // stages per slice (every slice non-empty)
  i32 units;            // tiles_w * tiles_x * l * split
};

namespace {

constexpr int THREADS = 384;
constexpr int BK = 64;             // K elements per sub-stage: 32 bytes per row, 4 scale blocks
constexpr int SUB = 4;             // sub-stages per raw (TMA) stage
constexpr int ROW_BYTES = 128;     // bytes of a row per raw stage (256 K elements)
constexpr int SF_CHUNK = 512;      // blocked layout: bytes per (128 rows, 4 blocks)

// Compile-time shape of one variant. Shared memory (from a 1024-aligned base):
//   xf[XF_STAGES]    [BN, 64] f16, K-major, 128-byte swizzle   (wgmma B operand, one sub-stage)
//   raw[RAW_STAGES]  W: [BM, 128 B] u8, X: [BN, 128 B] u8 (TMA boxes, 128-byte swizzle), then
//                    the raw stage's scales, W then X: [rows, 16 B] (SF_TMA boxes) or
//                    [128-row groups, 4, 512 B] (SF_BULK chunks)
//   bars             full, empty [RAW_STAGES]; xready, xfree [XF_STAGES]; flag
// `Variant::smem_bytes` in backend/cuda/gemm.rs mirrors SMEM_BYTES.
template <int WM_, int BN_>
struct Cfg {
  static constexpr int WM = WM_;          // m64 tiles per consumer warpgroup
  static constexpr int BN = BN_;          // X rows per tile = wgmma N
  static constexpr int BM = 2 * 64 * WM;  // W rows per tile
  static constexpr int W_BYTES = BM * ROW_BYTES;
  static constexpr int X_BYTES = BN * ROW_BYTES;
  static constexpr int VAL_BYTES = W_BYTES + X_BYTES;  // the raw stage's FP4 values
  static constexpr int SW_BYTES = BM * 16;             // = its 128-row groups * 4 * 512
  static constexpr int SX_BYTES = BN * 16 > SUB * SF_CHUNK ? BN * 16 : SUB * SF_CHUNK;
  static constexpr int RAW_BYTES = VAL_BYTES + SW_BYTES + SX_BYTES;
  static constexpr int XF_BYTES = BN * BK * 2;
  static constexpr int RAW_STAGES = BN >= 256 ? 2 : 3;
  static constexpr int XF_STAGES = BN >= 256 || BM * BN >= 256 * 128 ? 3 : 5;
  // Raw stages issued ahead of the decoder. The issuer waits for the slot of raw stage
  // r + LEAD - RAW_STAGES, which consumers free at that stage's last sub-stage: LEAD = RAW - 2
  // lets the decoder run a raw stage ahead of the consumers (LEAD = RAW - 1 would hold it back
  // to the consumers' sub-stage at every raw boundary).
  static constexpr int LEAD = RAW_STAGES > 2 ? RAW_STAGES - 2 : 1;
  // setmaxnreg budgets, 128 * (DECODER_REGS + 2 * CONSUMER_REGS) <= 384 * 168 (the launch's):
  // two X rows per decoder thread need more decoder registers.
  static constexpr int DECODER_REGS = BN > 128 ? 88 : 80;
  static constexpr int CONSUMER_REGS = 208;
  static constexpr int XF_OFF = 0;
  static constexpr int RAW_OFF = XF_OFF + XF_STAGES * XF_BYTES;
  static constexpr int BAR_OFF = RAW_OFF + RAW_STAGES * RAW_BYTES;
  static constexpr int BAR_BYTES = (2 * RAW_STAGES + 2 * XF_STAGES) * 8 + 8;
  static constexpr int SMEM_BYTES = 1024 + BAR_OFF + BAR_BYTES;  // + alignment slack
  static_assert(BN % 16 == 0 && BN <= 256, "wgmma N");
  static_assert(XF_BYTES % 1024 == 0, "128-byte swizzle atoms are 1024 B");
  static_assert(W_BYTES % 1024 == 0 && X_BYTES % 1024 == 0 && RAW_BYTES % 1024 == 0, "swizzled TMA boxes");
  static_assert(SW_BYTES == (BM / 128) * SUB * SF_CHUNK, "blocked W chunks");
  static_assert(SMEM_BYTES <= 232448, "shared memory per block");
  static_assert(WM * BN / 2 <= 128, "accumulator registers per thread");
  static_assert(BN >= 128 || 128 % BN == 0, "an X tile of BN < 128 rows lies in one 128-row group");
  static_assert(128 * (DECODER_REGS + 2 * CONSUMER_REGS) <= THREADS * 168, "register file");
};

// Shared-memory addresses of one CTA.
template <class C>
struct Smem {
  u32 base;
  NVFP4_DEVICE u32 xf(u32 s) const { return base + C::XF_OFF + s * C::XF_BYTES; }
  NVFP4_DEVICE u32 raw_w(u32 s) const { return base + C::RAW_OFF + s * C::RAW_BYTES; }
  NVFP4_DEVICE u32 raw_x(u32 s) const { return raw_w(s) + C::W_BYTES; }
  NVFP4_DEVICE u32 sc_w(u32 s) const { return raw_w(s) + C::VAL_BYTES; }
  NVFP4_DEVICE u32 sc_x(u32 s) const { return sc_w(s) + C::SW_BYTES; }
  NVFP4_DEVICE u32 full(u32 s) const { return base + C::BAR_OFF + s * 8; }
  NVFP4_DEVICE u32 empty(u32 s) const { return full(C::RAW_STAGES + s); }
  NVFP4_DEVICE u32 xready(u32 s) const { return full(2 * C::RAW_STAGES + s); }
  NVFP4_DEVICE u32 xfree(u32 s) const { return full(2 * C::RAW_STAGES + C::XF_STAGES + s); }
  NVFP4_DEVICE u32 flag() const { return full(2 * C::RAW_STAGES + 2 * C::XF_STAGES); }
};

// ---- scheduling: work units and the walk over their stages -------------------------------------

struct Unit {
  i32 tw, tx, l, split;  // W tile, X tile, batch, K slice
  i32 tile;              // index of (tw, tx, l) for the split-K workspace and counters
  i32 k0, k1;            // stages [k0, k1)
};

NVFP4_DEVICE Unit unit_at(const GemmSm90Params& p, i32 u) {
  Unit r;
  r.split = u % p.split;
  r.tile = u / p.split;
  r.tw = r.tile % p.tiles_w;
  r.tx = (r.tile / p.tiles_w) % p.tiles_x;
  r.l = r.tile / (p.tiles_w * p.tiles_x);
  r.k0 = r.split * p.iters_per_split;
  r.k1 = min(p.k_iters, r.k0 + p.iters_per_split);
  return r;
}

// The sequence of (unit, stage) a CTA processes: units blockIdx.x, +gridDim.x, ...; every role
// walks the same sequence, so stage number g means the same data everywhere.
struct Walk {
  i32 u;
  Unit cur;
  i32 kk;
  NVFP4_DEVICE void start(const GemmSm90Params& p) {
    u = blockIdx.x;
    if (u < p.units) {
      cur = unit_at(p, u);
      kk = cur.k0;
    }
  }
  NVFP4_DEVICE bool valid(const GemmSm90Params& p) const { return u < p.units; }
  NVFP4_DEVICE void next_unit(const GemmSm90Params& p) {
    u += gridDim.x;
    if (u < p.units) {
      cur = unit_at(p, u);
      kk = cur.k0;
    }
  }
  NVFP4_DEVICE void advance(const GemmSm90Params& p) {
    if (++kk >= cur.k1) next_unit(p);
  }
};

// A sub-stage opens a raw stage when it is the first of its unit or of an aligned group of
// SUB; it closes it when it is the last of its unit or of the group. Every role sees the same
// events, so the n-th opened raw stage is slot n % RAW_STAGES everywhere.
NVFP4_DEVICE bool raw_opens(const Unit& u, i32 kk) { return kk == u.k0 || kk % SUB == 0; }
NVFP4_DEVICE bool raw_closes(const Unit& u, i32 kk) { return kk == u.k1 - 1 || kk % SUB == SUB - 1; }

// The issuer's walk over raw stages: (unit, q) for q = k0 / SUB .. (k1 - 1) / SUB.
struct RawWalk {
  i32 u;
  Unit cur;
  i32 q;
  NVFP4_DEVICE void start(const GemmSm90Params& p) {
    u = blockIdx.x;
    if (u < p.units) {
      cur = unit_at(p, u);
      q = cur.k0 / SUB;
    }
  }
  NVFP4_DEVICE bool valid(const GemmSm90Params& p) const { return u < p.units; }
  NVFP4_DEVICE void advance(const GemmSm90Params& p) {
    if (++q > (cur.k1 - 1) / SUB) {
      u += gridDim.x;
      if (u < p.units) {
        cur = unit_at(p, u);
        q = cur.k0 / SUB;
      }
    }
  }
};

// Byte offset of the 8 bytes (4 * kk % SUB + t / 2 .. of chunk, half t % 2) that quad lane t
// reads from a 128-byte-swizzled row r of a raw tile in sub-stage kk: 16-byte chunk c of row r
// sits at chunk c ^ (r % 8).
NVFP4_DEVICE u32 swz(int r, int chunk) { return r * ROW_BYTES + ((chunk ^ (r & 7)) << 4); }

// Where one row's scales are: `soff` is the byte offset of its scales inside its operand's part
// of a stage's scale area (SF_TMA, SF_BULK); SF_DIRECT reads global memory at
// sf + (l * rows + grow) * sf_cols instead. Rows past the operand's end read as scale 0.
struct SfRow {
  i32 grow, l;
  u32 soff;
  bool ok;
};

// Row `grow` (of `rows`, batch l) of an operand tile whose first row is `tile_row0`.
NVFP4_DEVICE SfRow sf_row(i32 mode, i32 rows, i32 grow, i32 tile_row0, i32 l) {
  SfRow r;
  r.grow = grow;
  r.l = l;
  r.ok = grow < rows;
  if (mode == SF_BULK)  // SPEC §2, counted from the tile's first 128-row group
    r.soff = (grow / 128 - tile_row0 / 128) * (SUB * SF_CHUNK) + (grow % 32) * 16 + ((grow % 128) / 32) * 4;
  else
    r.soff = (grow - tile_row0) * 16;  // box row of 16 scale bytes (the raw stage's 4 sub-stages)
  return r;
}

// Offset of sub-stage kk's 4 bytes from a row's scale bytes.
NVFP4_DEVICE u32 sf_stage_off(i32 mode, i32 kk) { return (kk % SUB) * (mode == SF_TMA ? 4 : SF_CHUNK); }

// The 4 scale bytes (block t in byte t) of stage kk of a row: zero for a missing row or blocks
// past K. `area` is the operand's part of the stage's scale area.
NVFP4_DEVICE u32 stage_scales(i32 mode, const u8* sf, u32 area, const SfRow& r, i32 rows, i32 kk, i32 sf_cols) {
  if (!r.ok) return 0;
  if (mode == SF_DIRECT) {
    const u8* q = sf + ((i64)r.l * rows + r.grow) * sf_cols + 4 * kk;
    u32 v = 0;
#pragma unroll
    for (int t = 0; t < 4; ++t)
      if (4 * kk + t < sf_cols) v |= ptx::ld_nc_u8(q + t) << (8 * t);
    return v;
  }
  const u32 v = ptx::lds_u32(area + r.soff + sf_stage_off(mode, kk));
  const i32 left = sf_cols - 4 * kk;  // blocks of this stage inside K
  return left >= 4 ? v : v & ((1u << (8 * left)) - 1);
}

// Scale byte t of stage kk of row `grow` (zero outside), in the low byte; `soff` as in SfRow.
NVFP4_DEVICE u32 stage_scale(i32 mode, const u8* sf, u32 area, u32 soff, i32 grow, i32 rows, i32 l, i32 kk, int t,
                             i32 sf_cols) {
  if (grow >= rows || 4 * kk + t >= sf_cols) return 0;
  if (mode == SF_DIRECT) return ptx::ld_nc_u8(sf + ((i64)l * rows + grow) * sf_cols + 4 * kk + t);
  return ptx::lds_u8(area + soff + sf_stage_off(mode, kk) + t);
}

// ---- decoder warpgroup: TMA issue, X tile FP4 -> f16 --------------------------------------------

// Issues one operand's scales for raw stage q into `dst` (rows row0 .. row0 + BOX_ROWS - 1);
// returns the transaction bytes. `count_only` computes the bytes without copying (the
// arrive.expect_tx must precede the copies that complete on the barrier).
template <int BOX_ROWS>
NVFP4_DEVICE u32 issue_scales(bool count_only, i32 mode, const TmaMap* tmap, const u8* sf, u32 dst, u32 bar, i32 rows,
                              i32 sf_cols, i32 row0, i32 q, i32 l, u64 pol) {
  if (mode == SF_TMA) {
    if (!count_only) ptx::tma_load_3d(dst, tmap, bar, q * 16, row0, l, pol);
    return BOX_ROWS * 16;
  }
  if (mode != SF_BULK) return 0;
  const i32 R = (rows + 127) / 128, Cg = (sf_cols + 3) / 4;  // 128-row groups, 4-block columns
  const i32 g0 = row0 / 128, g1 = min(R, (row0 + BOX_ROWS + 127) / 128);
  const u32 bytes = min(SUB, Cg - SUB * q) * SF_CHUNK;        // the K tail has fewer columns
  if (!count_only)
    for (i32 g = g0; g < g1; ++g)
      ptx::bulk_load(dst + (g - g0) * SUB * SF_CHUNK, sf + (((i64)l * R + g) * Cg + SUB * q) * SF_CHUNK, bytes, bar,
                     pol);
  return (g1 - g0) * bytes;
}

// Issues the TMA loads of raw stage n (walk position `w`) into slot n % RAW_STAGES: values and
// scales of both operands.
template <class C>
NVFP4_DEVICE void issue_stage(const GemmSm90Params& p, const Smem<C>& sm, const RawWalk& w, u32 n, u64 pol_w,
                              u64 pol_x) {
  const u32 s = n % C::RAW_STAGES;
  if (n >= (u32)C::RAW_STAGES) ptx::mbar_wait(sm.empty(s), ((n / C::RAW_STAGES) - 1) & 1);
  const i32 sf_cols = p.k / 16, wrow0 = w.cur.tw * C::BM, xrow0 = w.cur.tx * C::BN, l = w.cur.l;
  for (int pass = 0; pass < 2; ++pass) {  // pass 0 counts the bytes, pass 1 copies
    const bool count = pass == 0;
    const u32 bytes =
        issue_scales<C::BM>(count, p.w_sf_mode, &p.tmap_sw, p.sf_w, sm.sc_w(s), sm.full(s), p.w_rows, sf_cols, wrow0,
                            w.q, l, pol_w) +
        issue_scales<C::BN>(count, p.x_sf_mode, &p.tmap_sx, p.sf_x, sm.sc_x(s), sm.full(s), p.x_rows, sf_cols, xrow0,
                            w.q, l, pol_x);
    if (count) ptx::mbar_arrive_expect_tx(sm.full(s), C::VAL_BYTES + bytes);
  }
  ptx::tma_load_3d(sm.raw_w(s), &p.tmap_w, sm.full(s), w.q * ROW_BYTES, wrow0, l, pol_w);
  ptx::tma_load_3d(sm.raw_x(s), &p.tmap_x, sm.full(s), w.q * ROW_BYTES, xrow0, l, pol_x);
}

// One 16-byte chunk of decoded X: chunk c = 2j + h of a row holds k slots 16j + 8h .. +7, i.e.
// the f16x2 of scale blocks t = 0..3 that the consumer's quad lane t supplies for k16 step j.
NVFP4_DEVICE void store_x_chunk(u32 row_addr, int row, int c, u32 b0, u32 b1, u32 b2, u32 b3) {
  ptx::sts_v4(row_addr + ((c ^ (row & 7)) << 4), b0, b1, b2, b3);
}

template <class C>
NVFP4_DEVICE void decode_x_row(const Smem<C>& sm, u32 rs, i32 kk, u32 xs, int row, u32 sc) {
  // The sub-stage's [32 B] of the row (chunks 2 * (kk % SUB) and +1 of the swizzled raw row):
  // block t = bytes 8t..8t+7, word 2t + J = elements 16t + 8J .. +7.
  const int c0 = 2 * (kk % SUB);
  const uint4 lo = ptx::lds_v4(sm.raw_x(rs) + swz(row, c0));
  const uint4 hi = ptx::lds_v4(sm.raw_x(rs) + swz(row, c0 + 1));
  const u32 words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  u32 s2[4];
#pragma unroll
  for (int t = 0; t < 4; ++t) s2[t] = nvfp4::scale_f16x2_x128((sc >> (8 * t)) & 0xFF);
  const u32 row_addr = sm.xf(xs) + row * 128;
#pragma unroll
  for (int J = 0; J < 2; ++J) {
    u32 r02[4], r46[4], r13[4], r57[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      nvfp4::e2m1x8_to_f16x8_biased(words[2 * t + J], r02[t], r46[t], r13[t], r57[t]);
      r02[t] = ptx::hmul2(r02[t], s2[t]);
      r46[t] = ptx::hmul2(r46[t], s2[t]);
      r13[t] = ptx::hmul2(r13[t], s2[t]);
      r57[t] = ptx::hmul2(r57[t], s2[t]);
    }
    // k16 step j = 2J + i takes (e0,e2 | e1,e3) for i = 0 and (e4,e6 | e5,e7) for i = 1.
    store_x_chunk(row_addr, row, 4 * J + 0, r02[0], r02[1], r02[2], r02[3]);
    store_x_chunk(row_addr, row, 4 * J + 1, r13[0], r13[1], r13[2], r13[3]);
    store_x_chunk(row_addr, row, 4 * J + 2, r46[0], r46[1], r46[2], r46[3]);
    store_x_chunk(row_addr, row, 4 * J + 3, r57[0], r57[1], r57[2], r57[3]);
  }
}

template <class C>
NVFP4_DEVICE void decoder_role(const GemmSm90Params& p, const Smem<C>& sm) {
  constexpr int XR = (C::BN + 127) / 128;  // X rows per decoder thread: threadIdx.x + 128 i
  const bool issuer = threadIdx.x == 0;
  const i32 sf_cols = p.k / 16;
  RawWalk tma;
  Walk dec;
  u32 n_tma = 0;  // raw stages issued
  u64 pol_w = 0, pol_x = 0;
  if (issuer) {
    pol_w = ptx::policy_evict_first();  // W is streamed once
    pol_x = ptx::policy_evict_last();   // X tiles are re-read by every W tile
    tma.start(p);
    for (; n_tma < (u32)C::LEAD && tma.valid(p); ++n_tma, tma.advance(p))
      issue_stage<C>(p, sm, tma, n_tma, pol_w, pol_x);
  }
  dec.start(p);
  i32 unit = -1;
  SfRow sr[XR];
  u32 n = 0, rs = 0;  // raw stages opened, and the current one's slot
  for (u32 g = 0; dec.valid(p); ++g, dec.advance(p)) {
    if (dec.u != unit) {
      unit = dec.u;
#pragma unroll
      for (int i = 0; i < XR; ++i) {
        const int row = threadIdx.x + 128 * i;
        const i32 xrow0 = dec.cur.tx * C::BN;
        sr[i] = sf_row(p.x_sf_mode, p.x_rows, xrow0 + row, xrow0, dec.cur.l);
        sr[i].ok = sr[i].ok && row < C::BN;
      }
    }
    if (raw_opens(dec.cur, dec.kk)) {
      if (issuer && tma.valid(p)) {
        issue_stage<C>(p, sm, tma, n_tma, pol_w, pol_x);
        ++n_tma;
        tma.advance(p);
      }
      rs = n % C::RAW_STAGES;
      ptx::mbar_wait(sm.full(rs), (n / C::RAW_STAGES) & 1);
      ++n;
    }
    const u32 xs = g % C::XF_STAGES;
    if (g >= (u32)C::XF_STAGES) ptx::mbar_wait(sm.xfree(xs), ((g / C::XF_STAGES) - 1) & 1);
    u32 sc[XR];
#pragma unroll
    for (int i = 0; i < XR; ++i) sc[i] = stage_scales(p.x_sf_mode, p.sf_x, sm.sc_x(rs), sr[i], p.x_rows, dec.kk, sf_cols);
#pragma unroll
    for (int i = 0; i < XR; ++i) {
      const int row = threadIdx.x + 128 * i;
      if (row < C::BN) decode_x_row<C>(sm, rs, dec.kk, xs, row, sc[i]);
    }
    // NOTE: the wgmma reads shared memory through the async proxy; generic-proxy stores must be
    // fenced before the arrival that publishes them.
    ptx::fence_proxy_async_smem();
    ptx::mbar_arrive(sm.xready(xs));
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

  // One work unit's K range: acc = sum over its sub-stages. `g` and `n` are the CTA's running
  // sub-stage and raw-stage counts (the same numbering as the other roles' walks).
  NVFP4_DEVICE void mainloop(const GemmSm90Params& p, const Smem<C>& sm, const Unit& un, u32& g, u32& n) {
    const int t = lane_() % 4;
    const i32 sf_cols = p.k / 16;
#pragma unroll
    for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
      for (int i = 0; i < NACC; ++i) acc[mt][i] = 0.f;

    u32 frag[2][C::WM][4];  // A fragments of two k16 steps in flight, [step % 2][mt][reg]
    bool pending = false;   // the previous sub-stage's wgmma groups may still run
    u32 prev_xs = 0, prev2_xs = 0;
    i32 done = 0;           // sub-stages of this unit whose f16 X slot is not yet handed back
    u32 rs = 0;
    for (i32 kk = un.k0; kk < un.k1; ++kk, ++g) {
      if (raw_opens(un, kk)) {
        rs = n % C::RAW_STAGES;
        ptx::mbar_wait(sm.full(rs), (n / C::RAW_STAGES) & 1);
        ++n;
      }
      const u32 xs = g % C::XF_STAGES;
      uint2 raw[C::WM][2];  // row's bytes 8t..8t+7 of the sub-stage: scale block t
      u32 s2[C::WM][2];     // its scale, as f16x2 (scale * 2^7)
#pragma unroll
      for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // 8 bytes 8t..8t+7 of the sub-stage's 32: chunk 2 * (kk % SUB) + t / 2, half t % 2.
          raw[mt][h] = ptx::lds_v2(sm.raw_w(rs) + swz(frag_row(mt, h), 2 * (kk % SUB) + t / 2) + 8 * (t % 2));
          const i32 wrow = un.tw * C::BM + frag_row(mt, h);
          const u32 soff = sf_row(p.w_sf_mode, p.w_rows, wrow, un.tw * C::BM, un.l).soff;  // recomputed: registers
          const u32 sc = stage_scale(p.w_sf_mode, p.sf_w, sm.sc_w(rs), soff, wrow, p.w_rows, un.l, kk, t, sf_cols);
          s2[mt][h] = nvfp4::scale_f16x2_x128(sc);
        }
      ptx::mbar_wait(sm.xready(xs), (g / C::XF_STAGES) & 1);
      // NOTE: every arrival below is made by every thread, before this sub-stage's wgmmas: a
      // divergent branch between wgmmas makes ptxas serialize the whole wgmma pipeline, and a
      // release arrival waits for this thread's outstanding loads.
      // The raw slot is released at its last sub-stage, after xready: that also says every
      // decoder thread has read its X bytes from it (decoder warps drift apart).
      if (raw_closes(un, kk)) ptx::mbar_arrive(sm.empty(rs));
      // The f16 X slot of two sub-stages back: all its wgmma groups retired during the last one
      // (at most 1 group, of the last sub-stage, is in flight after its step-1 wait).
      if (done >= 2) ptx::mbar_arrive(sm.xfree(prev2_xs));
      const u64 desc = ptx::wgmma_desc_k128b(sm.xf(xs));

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
        // NOTE: frag[j % 2] was last read by the group two steps back: at most 1 group may
        // still run before it is overwritten (2 groups per warpgroup, 4 per SM, keep the tensor
        // cores fed; 4 buffers would cost 16 more registers and spill).
        ptx::wgmma_wait<1>();
        u32(&f)[C::WM][4] = frag[j % 2];
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
      prev2_xs = prev_xs;
      prev_xs = xs;
      pending = true;
      ++done;
    }
    ptx::wgmma_wait<0>();
#pragma unroll
    for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
      for (int i = 0; i < NACC; ++i) ptx::reg_fence(acc[mt][i]);
    if (pending) {
      if (done >= 2) ptx::mbar_arrive(sm.xfree(prev2_xs));
      ptx::mbar_arrive(sm.xfree(prev_xs));
    }
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

  NVFP4_DEVICE void epilogue(const GemmSm90Params& p, const Smem<C>& sm, const Unit& un) {
    if (p.split == 1) {
      store_tile(p, un, acc);
      return;
    }
    // Split-K: publish this slice's partial (register image, coalesced float4 per thread).
    constexpr int QUADS = C::WM * NACC / 4;
    constexpr i64 TILE_FLOATS = (i64)C::BM * C::BN;
    float* ws_tile = p.workspace + (i64)un.tile * p.split * TILE_FLOATS;
    float* mine = ws_tile + un.split * TILE_FLOATS;
#pragma unroll
    for (int q = 0; q < QUADS; ++q) {
      const int mt = q / (NACC / 4), i = 4 * (q % (NACC / 4));
      ptx::st_cg_v4(mine + (q * 256 + ctid()) * 4, make_float4(acc[mt][i], acc[mt][i + 1], acc[mt][i + 2], acc[mt][i + 3]));
    }
    __threadfence();
    ptx::named_barrier(1, 256);
    u32* flag = reinterpret_cast<u32*>(__cvta_shared_to_generic(sm.flag()));
    if (ctid() == 0) *flag = atomicAdd(p.counters + un.tile, 1u) == (u32)p.split - 1;
    ptx::named_barrier(1, 256);
    if (!*flag) return;
    // Last slice: sum all slices in slice order, whoever arrived last (deterministic), in place
    // (quad q of acc is read as this slice's partial before it is overwritten by the sum).
    __threadfence();
#pragma unroll
    for (int q = 0; q < QUADS; ++q) {
      const int mt = q / (NACC / 4), i = 4 * (q % (NACC / 4));
      float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 1
      for (int sl = 0; sl < p.split; ++sl) {
        const float4 v = sl == un.split ? make_float4(acc[mt][i], acc[mt][i + 1], acc[mt][i + 2], acc[mt][i + 3])
                                        : ptx::ld_cg_v4(ws_tile + sl * TILE_FLOATS + (q * 256 + ctid()) * 4);
        s.x += v.x;
        s.y += v.y;
        s.z += v.z;
        s.w += v.w;
      }
      acc[mt][i] = s.x;
      acc[mt][i + 1] = s.y;
      acc[mt][i + 2] = s.z;
      acc[mt][i + 3] = s.w;
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
  for (; walk.valid(p); walk.next_unit(p)) {
    cs.mainloop(p, sm, walk.cur, g, n);
    // NOTE: the unit is recomputed rather than kept: its fields would otherwise stay live across
    // the mainloop, where the 2-m-tile consumer has no registers to spare.
    cs.epilogue(p, sm, unit_at(p, walk.u));
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
      ptx::mbar_init(sm.full(s), 1);     // the issuer's arrive.expect_tx
      ptx::mbar_init(sm.empty(s), 256);  // every consumer thread
    }
    for (int s = 0; s < C::XF_STAGES; ++s) {
      ptx::mbar_init(sm.xready(s), 128);  // every decoder thread (each fences its own stores)
      ptx::mbar_init(sm.xfree(s), 256);
    }
    ptx::fence_mbar_init();
    ptx::prefetch_tensormap(&p.tmap_w);
    ptx::prefetch_tensormap(&p.tmap_x);
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    ptx::setmaxnreg_dec<C::DECODER_REGS>();
    decoder_role<C>(p, sm);
  } else {
    ptx::setmaxnreg_inc<C::CONSUMER_REGS>();
    consumer_role<C>(p, sm);
  }
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
