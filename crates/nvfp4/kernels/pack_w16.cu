// pack_w16.cu: the packed W4A16 weight form (format/w16_pack.rs, the host's reference of the same
// bytes) built on the device from an NVFP4 weight in either scale layout, or from a dual GEMM's
// two operands with their rows interleaved by 8. One thread per (chunk, 16-row block, sub-stage,
// lane): the lane's 4 fragment words, and for the first lane of each quad the row pair's 2 scale
// words. Done once per weight, at load; not on any hot path.
#include "generated.cuh"

namespace pack {

// The f16 of an E4M3 magnitude shifted right by 7; NaN codes 0xFC.
NVFP4_DEVICE u32 scale_code(u32 s) {
  const u32 m = s & 0x7Fu, e = m >> 3, f = m & 7u;
  if (m == 0x7Fu) return 0xFCu;
  if (e != 0) return (e + 8u) << 3 | f;
  if (f == 0) return 0;
  const u32 p = 31u - __clz(f);  // the subnormal's leading bit: value f * 2^-9
  return (6u + p) << 3 | ((f << (3u - p)) & 7u);
}

// The word bit that register `reg`, half `half` reads for code bit `b` (3: sign).
NVFP4_DEVICE u32 fragment_bit(bool bf16, int reg, int half, int b) {
  const int p = b == 3 ? 15 : (bf16 ? 6 : 9) + b, r = sm90::PACK_ROT[bf16 ? 0 : 1][reg][b];
  return (u32)((p + 16 * half + 32 - r) % 32);
}

struct Src {
  const PackW16Params& p;
  // The operand and row of packed row r (the pair's rows interleaved by 8).
  NVFP4_DEVICE int which(i32 r) const { return p.parts == 1 ? 0 : (r % 16) / 8; }
  NVFP4_DEVICE i32 row(i32 r) const { return p.parts == 1 ? r : (r / 16) * 8 + r % 8; }
  NVFP4_DEVICE u32 raw_scale(int w, i32 b, i32 i, i32 j) const {
    const i32 sf_cols = p.k / 16;
    i64 off;
    if (p.blocked) {
      const i64 R = (p.rows + 127) / 128, C = (sf_cols + 3) / 4;
      off = b * (R * C * 512) + (i / 128) * (C * 512) + (j / 4) * 512 + (i % 32) * 16 + ((i % 128) / 32) * 4 + (j % 4);
    } else {
      off = ((i64)b * p.rows + i) * sf_cols + j;
    }
    return p.scales[w][off];
  }
  // Element (packed row r, k) of batch b, its scale folded in (zero: 0; negative: sign flipped).
  NVFP4_DEVICE u32 code(i32 b, i32 r, i32 k) const {
    const int w = which(r);
    const i32 i = row(r);
    if (r >= p.packed_rows || i >= p.rows || k >= p.k) return 0;
    const u32 s = raw_scale(w, b, i, k / 16);
    const u32 byte = p.values[w][((i64)b * p.rows + i) * (p.k / 2) + k / 2];
    const u32 c = k % 2 ? byte >> 4 : byte & 0xFu;
    const bool nan = (s & 0x7Fu) == 0x7Fu;
    if (!nan && (s & 0x7Fu) == 0) return 0;
    return !nan && (s & 0x80u) ? c ^ 8u : c;
  }
  NVFP4_DEVICE u32 scale(i32 b, i32 r, i32 j) const {
    const i32 i = row(r);
    if (r >= p.packed_rows || i >= p.rows || j >= p.k / 16) return 0;
    return scale_code(raw_scale(which(r), b, i, j));
  }
};

}  // namespace pack

extern "C" __global__ void pack_w16(const __grid_constant__ PackW16Params p) {
  const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  const i64 chunk = t / 512;
  if (chunk >= p.chunks) return;
  const int within = (int)(t % 512), blk = within / 128, sub = (within / 32) % 4, lane = within % 32;
  const i32 groups = (p.packed_rows + sm90::PACK_ROWS - 1) / sm90::PACK_ROWS, stages = (p.k + sm90::PACK_K - 1) / sm90::PACK_K;
  const i32 b = (i32)(chunk / ((i64)groups * stages)), grp = (i32)((chunk / stages) % groups), st = (i32)(chunk % stages);
  const i32 row0 = grp * sm90::PACK_ROWS + 16 * blk, g = lane / 4, tq = lane % 4;
  const pack::Src src{p};
  const bool bf16 = p.bf16 != 0;
  u8* out = p.out + chunk * sm90::PACK_CHUNK;
  u32 words[4];
  for (int step = 0; step < 4; ++step) {
    const i32 k0 = st * sm90::PACK_K + sub * 64 + step * 16 + 2 * tq;
    const i32 rows[4] = {row0 + g, row0 + g + 8, row0 + g, row0 + g + 8};
    const i32 ks[4] = {k0, k0, k0 + 8, k0 + 8};
    u32 q = 0;
    for (int reg = 0; reg < 4; ++reg)
      for (int half = 0; half < 2; ++half) {
        const u32 c = src.code(b, rows[reg], ks[reg] + half);
        for (int bit = 0; bit < 4; ++bit) q |= ((c >> bit) & 1u) << pack::fragment_bit(bf16, reg, half, bit);
      }
    words[step] = q;
  }
  *reinterpret_cast<uint4*>(out + ((blk * 4 + sub) * 32 + lane) * 16) = make_uint4(words[0], words[1], words[2], words[3]);
  if (tq == 0) {
    u32 sw[2];
    for (int i = 0; i < 2; ++i) {
      const i32 j0 = (st * sm90::PACK_K + sub * 64) / 16 + 2 * i;
      sw[i] = src.scale(b, row0 + g, j0) | src.scale(b, row0 + g, j0 + 1) << 8 | src.scale(b, row0 + g + 8, j0) << 16 |
              src.scale(b, row0 + g + 8, j0 + 1) << 24;
    }
    *reinterpret_cast<uint2*>(out + sm90::PACK_VALUES + ((blk * 4 + sub) * 8 + g) * 8) = make_uint2(sw[0], sw[1]);
  }
}
