// sm90/store.cuh: storing a finished tile to the f16 or bf16 output (out_bf16 of the epilogue part
// of the problem, Sm90EpilogueArgs): the conversions of a finished value, and the stores (through
// shared memory and the TMA when it is idle, else direct).
#pragma once

#include "output.cuh"
#include "sm90/mainloop.cuh"

namespace sm90 {

// ---- conversions of a finished value to the output type ------------------------------------------
// A conversion is passed to the stores as an object: the problem's scaling ones are empty (they
// read the problem), a unit's own factor (AlphaOf) travels in it.

// v * alpha with a power-of-two alpha: exact in f32, so one f32 rounding is the reference's.
struct AlphaPow2 {
  static constexpr bool PAIRS = true;
  NVFP4_DEVICE u32 one(const Sm90EpilogueArgs& pr, i32 bf16, float v) const {
    return out::of_f32(v * pr.alpha_f32[0], bf16);
  }
  NVFP4_DEVICE u32 two(const Sm90EpilogueArgs& pr, i32 bf16, float lo, float hi) const {
    return out::pair_of_f32(lo * pr.alpha_f32[0], hi * pr.alpha_f32[0], bf16);
  }
};
// v * alpha for any alpha: in f64 (a product of two f32 is exact there), rounded once.
// NOTE: no paired stores: batched f64 conversions spill registers.
struct AlphaF64 {
  static constexpr bool PAIRS = false;
  NVFP4_DEVICE u32 one(const Sm90EpilogueArgs& pr, i32 bf16, float v) const {
    return out::of_f64((double)v * pr.alpha[0], bf16);
  }
  NVFP4_DEVICE u32 two(const Sm90EpilogueArgs& pr, i32 bf16, float lo, float hi) const {
    return one(pr, bf16, lo) | one(pr, bf16, hi) << 16;
  }
};
// v * a for a factor of the unit's own (its batch's alpha, read from the device): as AlphaF64.
struct AlphaOf {
  static constexpr bool PAIRS = false;
  double a;
  NVFP4_DEVICE u32 one(const Sm90EpilogueArgs&, i32 bf16, float v) const { return out::of_f64((double)v * a, bf16); }
  NVFP4_DEVICE u32 two(const Sm90EpilogueArgs& pr, i32 bf16, float lo, float hi) const {
    return one(pr, bf16, lo) | one(pr, bf16, hi) << 16;
  }
};
// A value already final.
struct Plain {
  static constexpr bool PAIRS = true;
  NVFP4_DEVICE u32 one(const Sm90EpilogueArgs&, i32 bf16, float v) const { return out::of_f32(v, bf16); }
  NVFP4_DEVICE u32 two(const Sm90EpilogueArgs&, i32 bf16, float lo, float hi) const {
    return out::pair_of_f32(lo, hi, bf16);
  }
};

// Lane pairs (g, g+1), g even, hold output rows w, w+1 of the columns (x, x+1) in `ab`: one
// exchange gives the even lane the pair (w, w+1) of column x and the odd lane that of x+1.
NVFP4_DEVICE u32 row_pair(u32 ab, bool even) {
  const u32 other = __shfl_xor_sync(0xFFFFFFFFu, even ? ab >> 16 : ab & 0xFFFF, 4);
  return even ? (ab & 0xFFFF) | (other << 16) : other | (ab & 0xFFFF0000u);
}

// The tile's store through shared memory and the TMA, for c rows along x (W rows contiguous in c,
// as when W is B) and an idle shared memory (the CTA's last unit): the tile goes to boxes of 64 W
// rows (128 bytes) by BN X rows, 128-byte swizzled (conflict-free for the pairs the lanes hold),
// and one thread stores each box with the output's tensor map, which clips rows and columns
// outside c. Elements, values and pairs as in `store_rows`.
// NOTE: the direct stores of this orientation write 16 bytes to each of 8 rows per warp
// instruction: 3-5 µs for the 4 MB output of a dual GEMM with M = 512, N = 4096.
template <class C, int H, class Cvt, class Val>
NVFP4_DEVICE void store_tma(const Sm90EpilogueArgs& pr, const Unit& un, const Smem<C>& sm, const Cvt& cvt,
                            const Val& val) {
  using Cs = Consumer<C>;
  constexpr int BOXES = C::PART_ROWS / 64;
  constexpr u32 BOX_BYTES = C::BN * 128;
  static_assert(BOXES * BOX_BYTES <= C::RAW_OFF, "the tile fits the X ring");
  const int ct = (int)ptx::tid_x_here() - 128, lane = ct % 32, t = lane % 4;
  const bool even = (lane / 4) % 2 == 0;
  const i32 bf16 = pr.out_bf16;
  ptx::named_barrier(1, 256);  // earlier readers of shared memory (the staged sum) are done
#pragma unroll
  for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
    for (int h = 0; h < H; ++h) {
      // Lane pairs (g, g+1), g even, hold rows w, w+1: the even lane writes x's pair (w, w+1),
      // the odd lane x+1's.
      const int wl = Cs::out_row_of(ct, mt, h) - (even ? 0 : 1);
      const u32 box = sm.base + (wl / 64) * BOX_BYTES, byte = (wl % 64) * 2;
#pragma unroll
      for (int q = 0; q < C::BN / 8; ++q) {
        const u32 ab = cvt.two(pr, bf16, val(mt, 4 * q + 2 * h), val(mt, 4 * q + 2 * h + 1));  // (x, x+1)
        const u32 word = row_pair(ab, even);
        const u32 xl = 8 * q + 2 * t + (even ? 0 : 1);
        ptx::sts_u32(box + xl * 128 + (((byte / 16) ^ (xl % 8)) * 16) + byte % 16, word);
      }
    }
  ptx::fence_proxy_async_smem();  // these writes before the TMA's reads
  ptx::named_barrier(1, 256);
  if (ct == 0) {
#pragma unroll
    for (int b = 0; b < BOXES; ++b)
      ptx::tma_store_3d(&pr.tmap_c, sm.base + b * BOX_BYTES, (un.tw * C::PART_ROWS + 64 * b) * 2,
                        un.x_base + un.tx * C::BN, pr.c_flat ? 0 : un.l);
    ptx::bulk_commit_group();
    ptx::bulk_wait_group_0();
  }
}

// The tile's store for W rows along c's rows (c_stride_w 1, as when W is B), every W row of the
// tile inside c: each warp's 16 x 8 blocks are transposed in registers (two movmatrix), and each
// quad of lanes writes 32 contiguous bytes of one c row (a whole sector) per instruction. `out`:
// this lane's first element (rows 4 (lane % 4) .. + 3 of the warp's 16 in m-tile 0, column lane / 4
// of the tile), `sx` the stride of c rows (a multiple of 4, `out` 8-byte aligned); column
// 8q + lane / 4 is stored while 8q < `cols`, so the columns past the group's end (the next
// group's rows) are skipped lane by lane and a group's last tile takes this path too. BF16: the
// output type, a template argument so that each instance converts to one type only.
// NOTE: element by element, the stores of a 256 x 128 tile took ~10 µs (16-byte halves of sectors,
// 4 rows per instruction): without them a prefill-sized MoE launch of Qwen3-30B-A3B's down
// projection took 165 instead of 284 µs (H100).
template <class C, int BF16, class Cvt, class Val>
NVFP4_DEVICE void store_w_rows(const Sm90EpilogueArgs& pr, u16* out, i32 sx, i32 cols, const Cvt& cvt, const Val& val) {
  const int lane = (int)ptx::tid_x_here() % 32, t = lane % 4, src = (lane & ~3) | 2 * (t & 1);
  const bool upper = t >= 2;  // rows 8..15 of the warp's 16 (fragment row h = 1)
#pragma unroll
  for (int mt = 0; mt < C::WM; ++mt) {
    u16* o = out + mt * 64;
#pragma unroll
    for (int q = 0; q < C::BN / 8; ++q, o += 8 * sx) {
      // Lane (g, t) gets rows 2t, 2t + 1 (+ 8 for p1) of column 8q + g ...
      const u32 p0 = ptx::movmatrix_trans(cvt.two(pr, BF16, val(mt, 4 * q), val(mt, 4 * q + 1)));
      const u32 p1 = ptx::movmatrix_trans(cvt.two(pr, BF16, val(mt, 4 * q + 2), val(mt, 4 * q + 3)));
      // ... and then rows 4t .. 4t + 3 of it from the quad's lanes 2 (t % 2) and 2 (t % 2) + 1.
      const u32 a0 = __shfl_sync(0xFFFFFFFFu, p0, src), a1 = __shfl_sync(0xFFFFFFFFu, p0, src + 1);
      const u32 b0 = __shfl_sync(0xFFFFFFFFu, p1, src), b1 = __shfl_sync(0xFFFFFFFFu, p1, src + 1);
      if (8 * q < cols) *reinterpret_cast<uint2*>(o) = make_uint2(upper ? b0 : a0, upper ? b1 : a1);
    }
  }
}

// Stores this thread's output elements of the unit's tile: element (mt, i) of the accumulator
// layout (output row out_row(mt, h) of the tile, h = (i >> 1) & 1, column 8 * (i >> 2) +
// 2 * (lane % 4) + (i & 1)) for the fragment rows h < H, its value `val(mt, i)` converted by cvt.
// Output row w of the problem and column x (below the unit's x_end) go to c[l * c_stride_l + w *
// c_stride_w + x * c_stride_x]. Offsets are 32-bit: the host checks that L * M * N fits. A tile wholly inside c
// with even strides takes a fast path of 4-byte stores of element pairs: adjacent x when c rows run
// along x; when they run along w, the pairs of adjacent w, held by lanes 4 apart, are formed by
// one exchange.
template <class C, int H, class Cvt, class Val>
NVFP4_DEVICE void store_rows(const Sm90EpilogueArgs& pr, const Unit& un, const Smem<C>& sm, bool staged,
                             const Cvt& cvt, const Val& val) {
  using Cs = Consumer<C>;
  u16* cl = pr.c + (i64)un.l * pr.c_stride_l;
  const int ct = (int)ptx::tid_x_here() - 128, lane = ct % 32, t = lane % 4;
  const auto out_row = [&](int mt, int h) { return Cs::out_row_of(ct, mt, h); };
  const i32 sw = (i32)pr.c_stride_w, sx = (i32)pr.c_stride_x, w0 = un.tw * C::PART_ROWS;
  const i32 x0 = un.x_base + un.tx * C::BN, x_end = min(un.x_end, pr.x_rows);
  // NOTE: read once: a grouped problem lies in global memory, reloaded after every store.
  const i32 bf16 = pr.out_bf16;
  // NOTE: not with 2 m-tiles, 2 rows per thread and 128 accumulators (GEMM m256n128): it spills.
  constexpr bool TMA_FITS = C::WM == 1 || H == 1 || C::WM * C::BN / 2 < 128;
  // The TMA clips at the output's edges only: a tile that reaches into the next group's rows
  // stores element by element.
  if (TMA_FITS && staged && pr.c_tma && sw == 1 && (un.x_end >= pr.x_rows || x0 + C::BN <= un.x_end)) {
    store_tma<C, H>(pr, un, sm, cvt, val);
    return;
  }
  const bool full = Cvt::PAIRS && w0 + C::PART_ROWS <= pr.w_rows && x0 + C::BN <= x_end && pr.c_stride_l % 2 == 0;
  if (full && sx == 1 && sw % 2 == 0) {
#pragma unroll
    for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
      for (int h = 0; h < H; ++h) {
        u16* row = cl + (w0 + out_row(mt, h)) * sw + x0 + 2 * t;
#pragma unroll
        for (int q = 0; q < C::BN / 8; ++q)
          *reinterpret_cast<u32*>(row + 8 * q) = cvt.two(pr, bf16, val(mt, 4 * q + 2 * h), val(mt, 4 * q + 2 * h + 1));
      }
    return;
  }
  // W rows along c's rows (W = B), every W row of the tile inside c: see store_w_rows.
  // NOTE: not for 256-wide tiles with f64 conversions: there it spills.
  if constexpr (C::PARTS == 1 && H == 2 && (Cvt::PAIRS || C::BN <= 128)) {
    if (sw == 1 && sx % 4 == 0 && w0 + C::PART_ROWS <= pr.w_rows && (reinterpret_cast<u64>(cl) & 7) == 0) {
      const i32 cols = x_end - x0 - lane / 4;
      u16* out = cl + (x0 + lane / 4) * sx + w0 + out_row(0, 0) - lane / 4 + 4 * t;
      if (bf16)
        store_w_rows<C, 1>(pr, out, sx, cols, cvt, val);
      else
        store_w_rows<C, 0>(pr, out, sx, cols, cvt, val);
      return;
    }
  }
  // NOTE: not for 2 m-tiles per warpgroup: the exchange code spills there, and the plans give
  // small M to the 1-m-tile variants.
  if (C::WM == 1 && full && sw == 1 && sx % 2 == 0) {
    // Lane pairs (g, g+1), g even, hold rows w, w+1: the even lane keeps column x and stores
    // c[x][w, w+1]; the odd lane keeps column x+1 and stores c[x+1][w-1, w].
    const bool even = (lane / 4) % 2 == 0;
#pragma unroll
    for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
      for (int h = 0; h < H; ++h) {
        const i32 w = w0 + out_row(mt, h) - (even ? 0 : 1);
        u16* col = cl + (x0 + 2 * t + (even ? 0 : 1)) * sx + w;
#pragma unroll
        for (int q = 0; q < C::BN / 8; ++q) {
          const u32 ab = cvt.two(pr, bf16, val(mt, 4 * q + 2 * h), val(mt, 4 * q + 2 * h + 1));  // (x, x+1)
          *reinterpret_cast<u32*>(col + 8 * q * sx) = row_pair(ab, even);
        }
      }
    return;
  }
  // Edge tiles and odd strides: element by element.
#pragma unroll
  for (int mt = 0; mt < C::WM; ++mt)
#pragma unroll
    for (int i = 0; i < Cs::NACC; ++i) {
      const int h = (i >> 1) & 1;
      if (h >= H) continue;
      const i32 w = w0 + out_row(mt, h), x = x0 + 8 * (i >> 2) + 2 * t + (i & 1);
      if (w < pr.w_rows && x < x_end) cl[w * sw + x * sx] = (u16)cvt.one(pr, bf16, val(mt, i));
    }
}

}  // namespace sm90
