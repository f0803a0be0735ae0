// sm90/mainloop16.cuh: the consumers' mainloop when X is a 16-bit activation (W4A16, SPEC §8):
// X comes by TMA straight from the user's f16 or bf16 tensor (natural k order, no pre-pass), W
// is the NVFP4 weight, decoded in registers to X's type in the same natural order
// (sm90/decode_w16.cuh), and each wgmma multiplies the two exactly into f32 accumulators.
//
// The pipeline is sm90/mainloop.cuh's (rings, barriers, the software pipeline over the 4 k16
// steps of a sub-stage, the row mapping of one or two W parts); what differs is the decode: a
// thread loads its rows' whole 32 bytes of the sub-stage (two 16-byte chunks, shared with the
// other lanes of its quad) and the 4 scale bytes of the sub-stage's blocks, one per k16 step.
#pragma once

#include "sm90/mainloop.cuh"
#include "sm90/decode_w16.cuh"

namespace sm90 {

template <class C>
NVFP4_DEVICE void mainloop16(Consumer<C>& cs, const Sm90MainloopArgs& pr, i32 cluster, const Smem<C>& sm,
                             const Unit& un, u32& g, u32& n) {
  using Cs = Consumer<C>;
  constexpr bool BF16 = C::ACT == ACT_bf16;
  using Pairs = typename w16::PairsOf<BF16>::T;
  // NOTE: a fresh read of the thread index with 128 accumulators, as in Consumer::mainloop.
  const int ct = C::WM * Cs::NACC >= 128 ? (int)ptx::tid_x_here() - 128 : Cs::ctid(), lane = ct % 32;
  const int r0 = Cs::out_row_of(ct, 0, 0);
  const u32 sel = w16::quad_sel(lane % 4);
  // Chunk c of a raw W row sits at chunk c ^ (r % 8) (128-byte swizzle), r % 8 = lane / 4 for
  // every fragment row of this thread.
  const u32 swz = (u32)(lane / 4);
  const u32 w_off = r0 * ROW_BYTES;
  // The row's 4 scale bytes of sub-stage `sub` (blocks 4 sub .. 4 sub + 3 of the raw stage): one
  // aligned word in both layouts (Consumer::mainloop's offsets, without its block t).
  const bool bulk = pr.w_sf_mode == SF_BULK;
  u32 sc_off, sc_mt, sc_h;
  if (C::PARTS == 1) {
    sc_off = bulk ? (r0 / 128) * (SUB * SF_CHUNK) + (r0 % 32) * 16 + ((r0 % 128) / 32) * 4 : r0 * 16;
    sc_mt = bulk ? 8 : 64 * 16;
    sc_h = 128;
  } else {
    const int i = (un.tw * C::PART_ROWS) % 128 + r0;
    sc_off = bulk ? (i % 32) * 16 + (i / 32) * 4 : r0 * 16;
    sc_mt = bulk ? 4 : 32 * 16;
    sc_h = C::SW_PART;
  }
  const u32 sc_sub = bulk ? SF_CHUNK : 4;
  const i32 sf_cols = pr.k / 16;
#pragma unroll
  for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
    for (int i = 0; i < Cs::NACC; ++i) cs.acc[mt][i] = 0.f;

  constexpr int NBUF = C::WM == 1 && C::BN <= 128 ? 4 : 2;
  u32 frag[NBUF][C::WM][4];
  u32 prev_xs = 0;
  bool has_prev = false;
  u32 rs = 0;
  for (i32 kk = un.k0; kk < un.k1; ++kk, ++g) {
    if (raw_opens(un, kk)) {
      rs = n % C::RAW_STAGES;
      ptx::mbar_wait(sm.full_w(rs), (n / C::RAW_STAGES) & 1);
      ++n;
    }
    const u32 sub = kk % SUB;
    const u32 wa = sm.raw_w(rs) + w_off, c0 = ((2 * sub) ^ swz) << 4;
    const u32 sa = sm.sc_w(rs) + sc_off + sub * sc_sub;
    // Blocks past K: scale 0 (the blocked layout's padding may be NaN). K % 32 == 0, so a
    // sub-stage has 4 blocks in K or, the last one, 2.
    const u32 in_k = sf_cols - 4 * kk >= 4 ? 0xFFFFFFFFu : 0x0000FFFFu;
    // The row's bytes of chunk J (byte t of each word: steps 2J, 2J + 1), loaded for chunk 0
    // here and for chunk 1 during step 1 (fewer registers live than both up front), and its 4
    // scale bytes (blocks past K zeroed).
    u32 raw[C::WM][2];
    u32 sc[C::WM][2];
    const auto load_chunk = [&](u32 c) {
#pragma unroll
      for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) raw[mt][h] = w16::quad_bytes(ptx::lds_v4(wa + Cs::row_step(mt, h) * ROW_BYTES + c), sel);
    };
    load_chunk(c0);
#pragma unroll
    for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) sc[mt][h] = ptx::lds_u32(sa + mt * sc_mt + h * sc_h) & in_k;
    const u32 xs = g % C::X_STAGES;
    ptx::mbar_wait(sm.full_x(xs), (g / C::X_STAGES) & 1);
    const u64 desc = ptx::wgmma_desc_k128b(sm.x(xs));

    // Fragment regs [mt][reg] = (row g, pair 0), (row g+8, pair 0), (row g, pair 1), (row g+8,
    // pair 1); chunk J of a row feeds steps 2J and 2J + 1, bytes 2 (j % 2) and 2 (j % 2) + 1,
    // with the scales of blocks 2J, 2J + 1 (converted per chunk, also for fewer live registers).
    Pairs dec[C::WM][2];
    u32 s2[C::WM][2];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j % 2 == 0) {
#pragma unroll
        for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            dec[mt][h] = Pairs::of(raw[mt][h]);
            s2[mt][h] = w16::scale_pair<BF16>(sc[mt][h], j / 2);
          }
      }
      if (j == 1) {
        load_chunk(c0 ^ 16);
        // The raw stage's last reads of this thread: it goes back to the W producer.
        // NOTE: arrivals are predicated, never branched around (see Consumer::mainloop).
        ptx::mbar_arrive_if(sm.empty_w(rs), raw_closes(un, kk));
      }
      ptx::wgmma_wait<NBUF - 1>();
      if (j == NBUF - 1) Cs::release_x(sm, cluster, prev_xs, has_prev);
      u32(&f)[C::WM][4] = frag[j % NBUF];
#pragma unroll
      for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int b = 2 * (j % 2);
          const u32 s = s2[mt][h];
          f[mt][h] = w16::scaled<BF16>(dec[mt][h].pair(b), s, j % 2);
          f[mt][2 + h] = w16::scaled<BF16>(dec[mt][h].pair(b + 1), s, j % 2);
        }
      ptx::wgmma_fence();
#pragma unroll
      for (int mt = 0; mt < C::WM; ++mt) ptx::wgmma_rs<C::BN, BF16>(cs.acc[mt], f[mt], desc + 2 * j);  // +32 B
      ptx::wgmma_commit();
    }
    prev_xs = xs;
    has_prev = true;
  }
  ptx::wgmma_wait<0>();
#pragma unroll
  for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
    for (int i = 0; i < Cs::NACC; ++i) ptx::reg_fence(cs.acc[mt][i]);
  Cs::release_x(sm, cluster, prev_xs, has_prev);
}

}  // namespace sm90
