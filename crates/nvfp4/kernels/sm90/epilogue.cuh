// sm90/epilogue.cuh: the epilogue policies, what the consumers do with a finished tile:
//   StoreF16   c = f16(acc * alpha), one rounding (GEMM, SPEC §3.2)
//   SwiGLU     c = f16(silu(x1) * x2) with x1, x2 the two parts' products in f32 (SPEC §3.3;
//              silu is output.cuh's, shared with the fallback)
// (bf16 instead of f16 when the problem's out_bf16 says so: sm90/store.cuh's conversions.)
// A policy provides `store(epi, unit, consumer, smem, staged)`, `epi` the problem's epilogue part
// (its output and scaling); `staged`: the CTA's shared memory is idle (its last unit, no cluster
// peer) and may stage the tile.
#pragma once

#include "sm90/fixup.cuh"
#include "sm90/store.cuh"

namespace sm90 {

struct StoreF16 {
  template <class C>
  NVFP4_DEVICE static void store(const Sm90EpilogueArgs& pr, const Unit& un, Consumer<C>& cs, const Smem<C>& sm,
                                 bool staged) {
    static_assert(C::PARTS == 1, "one product per output element");
    const auto val = [&](int mt, int i) { return cs.acc[mt][i]; };
    if (pr.alpha_pow2)
      store_rows<C, 2, AlphaPow2>(pr, un, sm, staged, val);
    else
      store_rows<C, 2, AlphaF64>(pr, un, sm, staged, val);
  }
};

struct SwiGLU {
  template <class C>
  NVFP4_DEVICE static void store(const Sm90EpilogueArgs& pr, const Unit& un, Consumer<C>& cs, const Smem<C>& sm,
                                 bool staged) {
    static_assert(C::PARTS == 2, "x1 and x2 of one element in one thread");
    const float a1 = pr.alpha_f32[0], a2 = pr.alpha_f32[1];
    // Fragment row h = 0 holds x1 (part 0), h = 1 the x2 of the same element (i + 2): the store
    // walks the h = 0 rows and gates each element as it goes.
    // NOTE: gating all accumulators first, then storing, spilled with 128 accumulators: ptxas
    // issued every exp and reciprocal of the tile at once.
    const auto val = [&](int mt, int i) { return out::silu(cs.acc[mt][i] * a1) * (cs.acc[mt][i + 2] * a2); };
    store_rows<C, 1, Plain>(pr, un, sm, staged, val);
  }
};

}  // namespace sm90
