// sm90/config.cuh: the compile-time shape of one variant of the Hopper GEMM skeleton and the
// shared-memory addresses of one CTA.
//
// Every size the host also knows (thread roles, register budgets, stage counts, the carve-up)
// comes from generated.cuh, which backend/cuda/sm90/tiles.rs writes at compile time: this file
// names the regions and checks that the host's numbers are consistent, it does not recompute them.
#pragma once

#include "ptx.cuh"
#include "generated.cuh"

namespace sm90 {

// What X is (ACT): NVFP4 decoded to f16 by the pre-pass, in the permuted k order of
// sm90/mainloop.cuh (W4A4), or a 16-bit activation tensor as the user gave it, natural k order
// (W4A16, sm90/mainloop16.cuh).
constexpr int ACT_NVFP4 = 0;
constexpr int ACT_f16 = 1;
constexpr int ACT_bf16 = 2;

// PARTS: operand tensors that share the rows of a W tile (1: a GEMM's W; 2: a dual GEMM, whose
// tile holds matching rows of B1 and B2, PART_ROWS each). WM: m64 tiles per consumer warpgroup.
// BN: X rows per tile (the wgmma N). Shared memory, from a 1024-aligned base:
//   x[X_STAGES]      [BN, 64] f16 (or bf16), K-major, 128-byte swizzle (the wgmma B operand of a sub-stage)
//   raw[RAW_STAGES]  W: [BM, 128 B] u8, 128-byte swizzle (PARTS TMA boxes of PART_ROWS rows), then
//                    its scales, SW_BYTES: per part, SW_PART bytes apart, [PART_ROWS, 16 B]
//                    (SF_TMA, SF_DIRECT) or the [4, 512 B] chunks of its 128-row groups (SF_BULK)
//   bars             full_w, empty_w [RAW_STAGES]; full_x, empty_x [X_STAGES]; flag (8 B);
//                    fixup (the mbarrier of the staged split-K sum); kred, kgo (the cluster
//                    sum of K pieces: partials landed, may send)
// PACKED: W comes in the packed form of W4A16 (format/w16_pack.rs, sm90/mainloop_packed.cuh).
template <int PARTS_, int WM_, int BN_, int ACT_ = ACT_NVFP4, bool PACKED_ = false>
struct Cfg {
  static constexpr int ACT = ACT_;
  static constexpr bool PACKED = PACKED_;
  static constexpr int PARTS = PARTS_;
  static constexpr int WM = WM_;
  static constexpr int BN = BN_;
  static constexpr int BM = 2 * 64 * WM;  // two consumer warpgroups
  static constexpr int PART_ROWS = BM / PARTS;
  using L = Layout<PARTS, BM, BN, ACT != ACT_NVFP4>;
  static constexpr int W_BYTES = BM * ROW_BYTES;
  static constexpr int SW_BYTES = L::SW_BYTES;
  static constexpr int SW_PART = SW_BYTES / PARTS;  // one part's scale chunks (SF_BULK)
  static constexpr int RAW_BYTES = W_BYTES + SW_BYTES;
  static constexpr int X_BYTES = BN * ROW_BYTES;
  static constexpr int RAW_STAGES = L::RAW_STAGES;
  static constexpr int X_STAGES = L::X_STAGES;
  static constexpr int X_OFF = 0;
  static constexpr int RAW_OFF = L::RAW_OFF;
  static constexpr int BAR_OFF = L::BAR_OFF;
  static constexpr int SMEM_BYTES = L::SMEM_BYTES;  // dynamic shared memory, with alignment slack
  static constexpr int BAR_BYTES = (2 * RAW_STAGES + 2 * X_STAGES) * 8 + 32;

  static_assert(ACT == ACT_NVFP4 || ACT == ACT_f16 || ACT == ACT_bf16, "X's type");
  static_assert(!PACKED || ACT != ACT_NVFP4, "packed W: a 16-bit X");
  static_assert(PARTS == 1 || PARTS == 2, "one W operand, or the two of a dual GEMM");
  static_assert(PART_ROWS % 64 == 0, "a part is whole m64 tiles");
  static_assert(BN % 16 == 0 && BN <= 256, "wgmma N");
  static_assert(X_STAGES >= 3 && RAW_STAGES >= 2, "ring depths");
  static_assert(RAW_OFF >= X_OFF + X_STAGES * X_BYTES, "X ring overlaps the W ring");
  static_assert(BAR_OFF >= RAW_OFF + RAW_STAGES * RAW_BYTES, "W ring overlaps the barriers");
  static_assert(SMEM_BYTES >= 1024 + BAR_OFF + BAR_BYTES && SMEM_BYTES <= SMEM_CAP, "shared memory per block");
  static_assert(X_BYTES % 1024 == 0 && RAW_BYTES % 1024 == 0 && RAW_OFF % 1024 == 0, "128-byte swizzle atoms");
  static_assert(SW_BYTES >= BM * 16, "plain scales: 16 B per row and raw stage");
  static_assert(SW_PART >= (PART_ROWS + 127) / 128 * SUB * SF_CHUNK, "blocked scales: whole 128-row groups");
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
  NVFP4_DEVICE u32 fixup() const { return flag() + 8; }
  NVFP4_DEVICE u32 kred() const { return flag() + 16; }
  NVFP4_DEVICE u32 kgo() const { return flag() + 24; }
};

// This CTA's rank in its cluster of `cluster` (1 or 2) CTAs. NOTE: `&`, not `%`: a `%` by a
// runtime value is a division, which in the consumers' loop cost ~12% of their stall samples.
NVFP4_DEVICE i32 cluster_rank(i32 cluster) { return (i32)(blockIdx.x & (cluster - 1)); }

}  // namespace sm90
