// sm90/epilogue.cuh: the epilogue policies, what the consumers do with a finished tile:
//   StoreF16         c = f16(acc * alpha), one rounding (GEMM, SPEC §3.2)
//   StoreF16ByBatch  StoreF16 with the alpha of the unit's W batch when the problem has
//                    per-batch alphas on the device (the grouped GEMM: a MoE expert's own)
//   SwiGLU           c = f16(silu(x1) * x2) with x1, x2 the two parts' products in f32 (SPEC
//                    §3.3; silu is output.cuh's, shared with the fallback)
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
      store_rows<C, 2>(pr, un, sm, staged, AlphaPow2{}, val);
    else
      store_rows<C, 2>(pr, un, sm, staged, AlphaF64{}, val);
  }
};

// The factor of W batch l from the per-batch alphas: (alpha_l[l] * global(A)) * global(B) in f32,
// the reference's order (round to nearest, no contraction), with the decode bias.
NVFP4_DEVICE double batch_alpha(const Sm90EpilogueArgs& pr, i32 l) {
  const float f = __fmul_rn(__fmul_rn(__uint_as_float(ptx::ld_nc_u32(pr.alpha_l + l)), pr.global[0]), pr.global[1]);
  return (double)f * DECODE_BIAS;
}

// A grouped launch's store: a MoE problem with per-expert alphas (alpha_l) scales each unit by
// its expert's (unit.l); every other problem is StoreF16's.
// NOTE: a policy of its own, so that the single-problem kernels' StoreF16 keeps its code.
struct StoreF16ByBatch {
  template <class C>
  NVFP4_DEVICE static void store(const Sm90EpilogueArgs& pr, const Unit& un, Consumer<C>& cs, const Smem<C>& sm,
                                 bool staged) {
    if (pr.alpha_l == nullptr) {
      StoreF16::store<C>(pr, un, cs, sm, staged);
      return;
    }
    const auto val = [&](int mt, int i) { return cs.acc[mt][i]; };
    store_rows<C, 2>(pr, un, sm, staged, AlphaOf{batch_alpha(pr, un.l)}, val);
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
    store_rows<C, 1>(pr, un, sm, staged, Plain{}, val);
  }
};

}  // namespace sm90
