// sm90/prefetch_w.cuh: the X pre-pass's prefetch of the main kernel's first W loads into L2.
//
// NOTE: measured on the H200 (globaltimer, cold L2): the first W raw stage of a GEMM CTA landed
// 3-7 µs after the CTA started, the largest fixed cost of 128x7168x64 (12.6 µs in all). The
// pre-pass starts ~1 µs earlier than the GEMM's CTAs and does not wait for anything before
// touching W (weights, which no launch writes), so it issues those reads first.
#pragma once

#include "ptx.cuh"
#include "generated.cuh"

namespace sm90 {

// Thread `i` of `n`: the lines of (CTA, tile row) pairs i, i + n, ... of the main kernel's
// first units: split-K unit `cta` (piece cta % split from its k-step), or stream-K's share start
// (SingleProblem::stream_first, without CTA pairs).
NVFP4_DEVICE void prefetch_first_w(const WPrefetch& w, i32 i, i32 n) {
  if (w.values == nullptr) return;
  const Sm90Schedule& s = w.sched;
  for (; i < w.grid * w.bm; i += n) {
    const i32 cta = i / w.bm, r = i % w.bm;
    i32 group, k0;
    if (s.k_mode == K_STREAM) {
      const i64 u = cta * ((i64)s.units * s.k_iters) / w.grid;
      group = (i32)(u / s.k_iters);
      k0 = (i32)(u % s.k_iters);
    } else {
      group = cta / s.split;
      k0 = (cta % s.split) * s.iters_per_split;
    }
    const i32 row = (group % s.tiles_w) * w.bm + r, l = group / (s.tiles_w * s.tiles_x);
    if (row >= w.rows) continue;
    const i64 lr = (i64)l * w.rows + row;
    const i32 q = k0 / SUB;  // the raw stage: 128 bytes of the row, 16 of its scales
    ptx::prefetch_l2(w.values + lr * w.row_bytes + q * ROW_BYTES);
    if (w.scales != nullptr) ptx::prefetch_l2(w.scales + lr * w.sf_cols + q * 16);
  }
}

}  // namespace sm90
