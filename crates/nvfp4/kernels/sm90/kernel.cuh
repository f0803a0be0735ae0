// sm90/kernel.cuh: the Hopper GEMM skeleton, a warp-specialized persistent kernel that every
// tensor-core operation instantiates with its tile shape (Cfg), its scheduler and its epilogue:
//   run<Cfg<PARTS, WM, BN>, Scheduler, Epilogue>(params)
//
// The skeleton computes D[w, x] = sum_k W[w, k] X[x, k] over the scheduler's work units, where
// the host picks which operand plays W: W is decoded in registers by the consumers and fed to
// wgmma as the A fragment (RS form); X was decoded once per launch by the pre-pass
// (decode_x_sm90.cu) into f16, which the TMA loads as the wgmma's shared-memory B operand.
// NOTE: decoding X inside the GEMM (a decoder warpgroup per CTA) re-decodes it once per W tile
// and was the bottleneck of the first five GEMM versions (ncu: the consumers waited on the
// decoder, a single latency-bound warp per scheduler); the pre-pass decodes it once.
//
// Roles (384 threads, one CTA per SM, persistent over work units):
// - warp 0, "W producer": W's raw stages and their scales; lane 0 of warp 1, "X producer": the
//   decoded X sub-stages (the rest of the warpgroup only gives its registers away);
// - warpgroups 1, 2, "consumers": each owns WM m64 tiles of W; per sub-stage it decodes its W
//   fragments one k16 step at a time and issues WM wgmma m64nBNk16 per step, then hands each
//   unit's accumulators to the epilogue.
#pragma once

#include "sm90/producer.cuh"
#include "sm90/mainloop16.cuh"
#include "sm90/mainloop_packed.cuh"
#include "sm90/epilogue.cuh"
#include "sm90/kreduce.cuh"

namespace sm90 {

template <class C, class S, class Epi>
NVFP4_DEVICE void consumer_role(const typename S::Params& p, const Smem<C>& sm) {
  Consumer<C> cs;
  Walk<S> walk;
  walk.start(p);
  const i32 cluster = S::cluster(p);
  u32 g = 0, n = 0;
  for (; walk.valid(); walk.next_unit(p)) {
    if constexpr (C::ACT == ACT_NVFP4) {
      cs.mainloop(S::problem(p, walk.cur).main, cluster, sm, walk.cur, g, n);
    } else if constexpr (C::PACKED) {
      mainloop_packed<C>(cs, cluster, sm, walk.cur, g, n);
    } else {
      mainloop16<C>(cs, S::problem(p, walk.cur).main, cluster, sm, walk.cur, g, n);
    }
    // NOTE: the unit is recomputed rather than kept: its fields would otherwise stay live across
    // the mainloop.
    const Unit un = S::unit_at(p, walk.u, walk.end);
    // The CTA's last unit, without a cluster peer: the rings are idle after its mainloop, and the
    // epilogue may use the shared memory.
    const bool idle = S::next(p, walk.u) >= walk.end && cluster == 1;
    if (un.pieces == 1)
      Epi::store(S::problem(p, un).epi, un, cs, sm, idle);
    else if (KCLUSTER_FITS<C> && S::kcluster(p) > 1) {
      if (reduce_in_cluster<C>(cs, sm, un)) Epi::store(S::problem(p, un).epi, un, cs, sm, idle);
    } else if (reduce_pieces<C, S>(p, cs, sm, un, idle))
      Epi::store(S::problem(p, un).epi, un, cs, sm, idle);
  }
}

template <class C, class S, class Epi>
NVFP4_DEVICE void run(const typename S::Params& p) {
  // Shared memory, checked against what the host launched with.
  extern __shared__ __align__(1024) u8 smem_raw[];
  Smem<C> sm;
  sm.base = (ptx::smem_u32(smem_raw) + 1023u) & ~1023u;
  if (ptx::dynamic_smem_size() < (u32)C::SMEM_BYTES) __trap();  // host/kernel shape mismatch
  // Launch dependents early (a graph of launches chained by PDL): they wait for this grid's
  // completion before touching what it writes or reads.
  ptx::launch_dependents();
  const i32 cluster = S::cluster(p), cluster_ctas = cluster * S::kcluster(p);

  // Barriers.
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::RAW_STAGES; ++s) {
      ptx::mbar_init(sm.full_w(s), 32);    // every W producer lane, the leader with expect_tx
      ptx::mbar_init(sm.empty_w(s), 256);  // every consumer thread
    }
    for (int s = 0; s < C::X_STAGES; ++s) {
      ptx::mbar_init(sm.full_x(s), 1);
      ptx::mbar_init(sm.empty_x(s), 8 * cluster);  // every consumer warp of the cluster
    }
    ptx::mbar_init(sm.fixup(), 1);  // the consumer leader, with expect_tx
    ptx::mbar_init(sm.kred(), 1);   // piece 0's consumer leader, with expect_tx
    ptx::mbar_init(sm.kgo(), 1);    // piece 0's consumer leader
    ptx::fence_mbar_init();
    S::prefetch_tensormaps(p, C::PARTS);
  }
  // In a cluster, no CTA may multicast into (or arrive on) the other's barriers before they are
  // initialised, nor exit while the other may still do so.
  if (cluster_ctas > 1)
    ptx::cluster_sync();
  else
    __syncthreads();

  // The walk's table comes from the pre-pass.
  if constexpr (S::TABLE_ON_DEVICE) ptx::wait_prerequisites();

  // Registers, then the roles.
  if (threadIdx.x < 128) {
    ptx::setmaxnreg_dec<PRODUCER_REGS>();
    if (threadIdx.x < 32)
      producer_w<C, S>(p, sm);
    else if (threadIdx.x == 32)
      producer_x<C, S>(p, sm);
  } else {
    ptx::setmaxnreg_inc<CONSUMER_REGS>();
    consumer_role<C, S, Epi>(p, sm);
  }
  if (cluster_ctas > 1) ptx::cluster_sync();
}

}  // namespace sm90

// One kernel symbol per variant: OP_nvfp4_sm90_ws_m{BM}n{BN}, instantiating run<> with the
// operation's PARTS, scheduler and epilogue. An operation's file wraps it in a macro of (BM, BN)
// and expands that over the variant list, NVFP4_SM90_VARIANTS (generated.cuh), whose order is
// the registry's symbol order.
#define NVFP4_SM90_KERNEL(OP, PARTS, SCHED, EPI, BM, BN)                                           \
  extern "C" __global__ void __launch_bounds__(sm90::THREADS, 1)                                   \
      OP##_nvfp4_sm90_ws_m##BM##n##BN(const __grid_constant__ SCHED::Params p) {                   \
    static_assert(BM % 128 == 0, "two consumer warpgroups of 64-row tiles");                      \
    sm90::run<sm90::Cfg<PARTS, BM / 128, BN>, SCHED, EPI>(p);                                      \
  }

// The W4A16 kernels (SPEC §8): OP_w4a16{bf16,f16}_sm90_ws_m{BM}n{BN}, X the activation tensor of
// type ACT (bf16 or f16) as the user gave it, W the NVFP4 weight. A variant listed in
// W16_SKIP_OP (generated.cuh) is not instantiated: its symbol traps, and no plan launches it.
#define NVFP4_SM90_KERNEL16(OP, ACT, PARTS, SCHED, EPI, BM, BN)                                     \
  extern "C" __global__ void __launch_bounds__(sm90::THREADS, 1)                                   \
      OP##_w4a16##ACT##_sm90_ws_m##BM##n##BN(const __grid_constant__ SCHED::Params p) {             \
    static_assert(BM % 128 == 0, "two consumer warpgroups of 64-row tiles");                      \
    if constexpr (sm90::W16_SKIP_##OP<BM, BN>)                                                     \
      __trap();                                                                                    \
    else                                                                                           \
      sm90::run<sm90::Cfg<PARTS, BM / 128, BN, sm90::ACT_##ACT>, SCHED, EPI>(p);                   \
  }

// The W4A16 kernels of a packed W (format/w16_pack.rs): OP_w4a16{bf16,f16}p_sm90_ws_m{BM}n{BN};
// a dual GEMM's two operands come packed as one, rows interleaved by 8. The host's packed-form
// check picks them (backend/cuda/sm90/family.rs).
#define NVFP4_SM90_KERNEL16P(OP, ACT, PARTS, SCHED, EPI, BM, BN)                                    \
  extern "C" __global__ void __launch_bounds__(sm90::THREADS, 1)                                   \
      OP##_w4a16##ACT##p_sm90_ws_m##BM##n##BN(const __grid_constant__ SCHED::Params p) {            \
    static_assert(BM % 128 == 0, "two consumer warpgroups of 64-row tiles");                      \
    sm90::run<sm90::Cfg<PARTS, BM / 128, BN, sm90::ACT_##ACT, true>, SCHED, EPI>(p);               \
  }
