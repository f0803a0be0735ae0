// sm90/mainloop_packed.cuh: the consumers' mainloop of W4A16 when W comes in the packed form
// (format/w16_pack.rs, sm90/decode_packed.cuh): a raw stage holds, per 64-row group of the tile,
// one chunk of PACK_VALUES bytes of fragment words and PACK_SCALES bytes of scale words, so a
// thread reads per sub-stage and m-tile one 16-byte word group (its 4 k16 steps) and one 8-byte
// scale pair group, and decodes each step with 15 instructions per 8 weights (bf16; f16 17).
//
// The pipeline is mainloop16's (the X ring, the W ring, NBUF fragment buffers); the stage slots
// and their phases are carried from sub-stage to sub-stage instead of divided out of the running
// counts. A dual GEMM's pair is packed as one operand whose 16-row blocks hold 8 rows of B1
// (fragment row g) and the same 8 of B2 (g + 8): the skeleton's dual row mapping, so the
// addressing is the same for one operand or two.
#pragma once

#include "sm90/mainloop.cuh"
#include "sm90/decode_packed.cuh"

namespace sm90 {

template <class C>
NVFP4_DEVICE void mainloop_packed(Consumer<C>& cs, i32 cluster, const Smem<C>& sm, const Unit& un, u32& g, u32& n) {
  using Cs = Consumer<C>;
  constexpr bool BF16 = C::ACT == ACT_bf16;
  static_assert(C::RAW_BYTES >= C::BM / PACK_ROWS * PACK_CHUNK, "a raw stage holds the tile's packed chunks");
  // NOTE: a fresh read of the thread index with 128 accumulators, as in Consumer::mainloop.
  const int ct = C::WM * Cs::NACC >= 128 ? (int)ptx::tid_x_here() - 128 : Cs::ctid();
  const int lane = ct % 32, warp = (ct / 32) % 4, wgi = ct / 128;
  // m-tile mt of this warpgroup is the tile's 64-row group wgi * WM + mt; this warp's 16 rows
  // are its block `warp`.
  const u32 w_off = (u32)(wgi * C::WM) * PACK_CHUNK + warp * (PACK_VALUES / 4) + lane * 16;
  const u32 s_off = (u32)(wgi * C::WM) * PACK_CHUNK + PACK_VALUES + warp * (PACK_SCALES / 4) + (lane / 4) * 8;
#pragma unroll
  for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
    for (int i = 0; i < Cs::NACC; ++i) cs.acc[mt][i] = 0.f;

  constexpr int NBUF = C::WM == 1 && C::BN <= 128 ? 4 : 2;
  const u32 exp_bits = wp::scale_exponent_bits();
  u32 frag[NBUF][C::WM][4];
  u32 prev_xs = 0;
  bool has_prev = false;
  u32 xs = g % C::X_STAGES, xph = (g / C::X_STAGES) & 1;
  u32 rn = n % C::RAW_STAGES, rph = (n / C::RAW_STAGES) & 1;  // the next raw stage to open
  u32 rs = 0;
  for (i32 kk = un.k0; kk < un.k1; ++kk, ++g) {
    if (raw_opens(un, kk)) {
      rs = rn;
      ptx::mbar_wait(sm.full_w(rs), rph);
      ++n;
      if (++rn == (u32)C::RAW_STAGES) {
        rn = 0;
        rph ^= 1;
      }
    }
    const u32 sub = kk % SUB;
    const u32 base = sm.raw_w(rs);
    uint4 q[C::WM];
    uint2 sw[C::WM];
#pragma unroll
    for (int mt = 0; mt < C::WM; ++mt) {
      q[mt] = ptx::lds_v4(base + w_off + mt * PACK_CHUNK + sub * (PACK_VALUES / 16));
      sw[mt] = ptx::lds_v2(base + s_off + mt * PACK_CHUNK + sub * (PACK_SCALES / 16));
    }
    // The raw stage's last reads of this thread: it goes back to the W producer (predicated, as
    // in Consumer::mainloop; the release orders the loads above before it).
    ptx::mbar_arrive_if(sm.empty_w(rs), raw_closes(un, kk));
    ptx::mbar_wait(sm.full_x(xs), xph);
    const u64 desc = ptx::wgmma_desc_k128b(sm.x(xs));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      ptx::wgmma_wait<NBUF - 1>();
      if (j == NBUF - 1) Cs::release_x(sm, cluster, prev_xs, has_prev);
      u32(&f)[C::WM][4] = frag[j % NBUF];
#pragma unroll
      for (int mt = 0; mt < C::WM; ++mt) {
        const u32 w = j == 0 ? q[mt].x : j == 1 ? q[mt].y : j == 2 ? q[mt].z : q[mt].w;
        u32 s;
        if (j == 0)
          s = wp::scale_pair<BF16, 0>(sw[mt], exp_bits);
        else if (j == 1)
          s = wp::scale_pair<BF16, 1>(sw[mt], exp_bits);
        else if (j == 2)
          s = wp::scale_pair<BF16, 2>(sw[mt], exp_bits);
        else
          s = wp::scale_pair<BF16, 3>(sw[mt], exp_bits);
        wp::frags<BF16>(w, s, f[mt]);
      }
      ptx::wgmma_fence();
#pragma unroll
      for (int mt = 0; mt < C::WM; ++mt) ptx::wgmma_rs<C::BN, BF16>(cs.acc[mt], f[mt], desc + 2 * j);  // +32 B
      ptx::wgmma_commit();
    }
    prev_xs = xs;
    has_prev = true;
    if (++xs == (u32)C::X_STAGES) {
      xs = 0;
      xph ^= 1;
    }
  }
  ptx::wgmma_wait<0>();
#pragma unroll
  for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
    for (int i = 0; i < Cs::NACC; ++i) ptx::reg_fence(cs.acc[mt][i]);
  Cs::release_x(sm, cluster, prev_xs, has_prev);
}

}  // namespace sm90
