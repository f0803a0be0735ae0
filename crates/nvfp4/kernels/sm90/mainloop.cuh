// sm90/mainloop.cuh: the consumer warpgroups' mainloop: W fragments decoded in registers, wgmma
// against the decoded X in shared memory, f32 accumulators.
//
// Exactness: W is decoded to f16 with its e4m3 block scale multiplied in (e2m1 * e4m3 * 2^-7 is
// exact in f16), X likewise by the pre-pass; wgmma multiplies them exactly and sums in f32. The
// epilogue multiplies the 2^14 decode bias back.
//
// K order. A dot product does not care about the order of k as long as both operands use the
// same one, and every element carries its own scale, so inside each 64-element stage the k
// order is permuted to what is cheapest to decode: the thread holding quad lane t of an A
// fragment owns scale block t of the stage (bytes 8t..8t+7 of a row, one scale), and the
// pre-pass places X elements at the matching positions (decode_x_sm90.cu).
//
// Rows. Each consumer warpgroup owns WM m64 tiles of the W tile; a thread holds A-fragment rows
// g = lane / 4 and g + 8 of its warp's 16 rows (h = 0, 1). With one W operand these are tile rows
// 16 * warp + g (+ 8) of each m64 tile. With two (a dual GEMM) the fragment's two rows are taken
// from the two parts instead: row g of the warp's 8-row slice of part 0 (h = 0) and the same row
// of part 1 (h = 1), so the accumulators of x1 and x2 for one output element sit in one thread.
#pragma once

#include "nvfp4.cuh"
#include "sm90/schedule.cuh"

namespace sm90 {

template <class C>
struct Consumer {
  static constexpr int NACC = C::BN / 2;  // f32 accumulators per m64 tile per thread
  float acc[C::WM][NACC];

  // Thread coordinates, recomputed on use (registers are the scarce resource here).
  NVFP4_DEVICE static int ctid() { return threadIdx.x - 128; }  // 0..255 over both warpgroups
  NVFP4_DEVICE static int wg() { return ctid() / 128; }
  NVFP4_DEVICE static int warp() { return (ctid() / 32) % 4; }
  NVFP4_DEVICE static int lane_() { return ctid() % 32; }

  // The output row (within the tile's PART_ROWS rows of each part) of fragment row h of m-tile mt,
  // for consumer thread `ct` (0..255).
  NVFP4_DEVICE static int out_row_of(int ct, int mt, int h) {
    const int wg = ct / 128, warp = (ct / 32) % 4, g = (ct % 32) / 4;
    return C::PARTS == 1 ? wg * C::WM * 64 + mt * 64 + warp * 16 + g + 8 * h : ((wg * C::WM + mt) * 4 + warp) * 8 + g;
  }
  NVFP4_DEVICE static int out_row(int mt, int h) { return out_row_of(ctid(), mt, h); }
  // The W tile row (shared memory) of fragment row h of m-tile mt: out_row(0, 0) + row_step(mt, h).
  NVFP4_DEVICE static constexpr int row_step(int mt, int h) {
    return C::PARTS == 1 ? mt * 64 + 8 * h : mt * 32 + h * C::PART_ROWS;
  }

  // Hands X slot s back when `pred`: one arrival per warp (its wgmmas reading the slot have
  // retired) on this CTA's empty barrier and, in a cluster, on the peer CTA's, whose producer
  // multicasts into this CTA's slot too.
  NVFP4_DEVICE static void release_x(const Smem<C>& sm, i32 cluster, u32 s, bool pred) {
    const bool lead = pred && lane_() == 0;
    ptx::mbar_arrive_if(sm.empty_x(s), lead);
    const u32 peer = (u32)(cluster_rank(cluster) ^ (cluster - 1));  // itself without a cluster
    ptx::mbar_arrive_cluster_if(ptx::map_shared_rank(sm.empty_x(s), peer), lead && cluster > 1);
  }

  // One work unit's K range: acc = sum over its sub-stages. `g` and `n` are the CTA's running
  // sub-stage and raw-stage counts (the same numbering as the producers' walk).
  NVFP4_DEVICE void mainloop(const Sm90MainloopArgs& pr, i32 cluster, const Smem<C>& sm, const Unit& un, u32& g,
                             u32& n) {
    // NOTE: with 128 accumulators the thread's offsets are derived per unit from a fresh read of
    // its index (ptxas otherwise hoists them to the kernel's start and spills them); with fewer,
    // that read cost ~3% of the GEMM's speed, so it uses the plain one.
    const int ct = C::WM * NACC >= 128 ? (int)ptx::tid_x_here() - 128 : ctid(), lane = ct % 32, t = lane % 4;
    const int r0 = out_row_of(ct, 0, 0);
    // This thread's 8 bytes (block t) of fragment row r in sub-stage `sub` of a raw W row: 16-byte
    // chunk 2 * sub + t / 2 sits at chunk (2 * sub + t / 2) ^ (r % 8) (128-byte swizzle), and
    // r % 8 = lane / 4 for every fragment row of this thread.
    const u32 swz = (u32)((t / 2) ^ (lane / 4));
    const u32 w_off = r0 * ROW_BYTES + 8 * (t % 2);
    // Its scale byte (block t of sub-stage sub) of fragment row (mt, h) in the raw stage's scale
    // area: sc_off + mt * sc_mt + h * sc_h. Plain: [BM, 16 B] by tile row. Blocked: the 128x4
    // tile rule (SPEC §2) within the part's chunks, for the row's index i in its 128-row groups
    // (a part's rows start at row0 % 128 of its first group).
    const bool bulk = pr.w_sf_mode == SF_BULK;
    u32 sc_off, sc_mt, sc_h;
    if (C::PARTS == 1) {
      sc_off = bulk ? (r0 / 128) * (SUB * SF_CHUNK) + (r0 % 32) * 16 + ((r0 % 128) / 32) * 4 + t : r0 * 16 + t;
      sc_mt = bulk ? 8 : 64 * 16;
      sc_h = 128;
    } else {
      const int i = (un.tw * C::PART_ROWS) % 128 + r0;  // < 128: a part's rows lie in one group
      sc_off = bulk ? (i % 32) * 16 + (i / 32) * 4 + t : r0 * 16 + t;
      sc_mt = bulk ? 4 : 32 * 16;
      sc_h = C::SW_PART;  // each part's scales start SW_PART bytes after the previous part's
    }
    const u32 sc_sub = bulk ? SF_CHUNK : 4;
    const i32 sf_cols = pr.k / 16;
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
          raw[mt][h] = ptx::lds_v2(wa + row_step(mt, h) * ROW_BYTES);
          const u32 sc = ptx::lds_u8(sa + mt * sc_mt + h * sc_h);
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
        if (j == NBUF - 1) release_x(sm, cluster, prev_xs, has_prev);
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
    release_x(sm, cluster, prev_xs, has_prev);
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
};

}  // namespace sm90
