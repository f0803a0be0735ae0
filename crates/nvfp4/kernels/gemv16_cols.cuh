// gemv16_cols.cuh: the W4A16 GEMV's family part for 2 to 8 activation rows (the `_cols` kernels),
// and the W4A4 GEMM of 2 to 8 rows on it. Included by gemv16.cu inside its anonymous namespace,
// after the one-row family (`W4A16`), whose decode, loads and MMA word it reuses.
#pragma once

// ---- Several activation rows (2 <= cols <= 8): column g of the MMA's B is activation row g.
// Thread (warp w, lane 4g + t) multiplies its chunk of its 4 weight rows by the same chunk of
// activation row min(g, cols - 1). The window holds the cols rows' chunks, each row laid out as
// the one-row window, rows ROW_PAD bytes apart beyond their size: a quarter warp's 16-byte reads
// (two rows, four chunks each) fall in distinct banks. (Measured and dropped: each thread
// copying its own x chunk of the next K-step with cp.async, no window: 2.1 to 3.8x slower at
// 8192^2, its 16-byte pieces of 32-byte sectors and the repeated rows of M < 8 costing L2 trips.)

// The staging both `_cols` families share: the window's pieces (row r, word e: 8 elements of
// chunk c0 + e / WORDS) laid out per row as `stage_x` lays out one row, rows row_stride apart.
// Every thread loads up to ROWS_STAGE_LOADS pieces (`load(r, e, in)`, zeros when !in: past the
// rows or past K), then stores them as `pairs(loaded)`, per pass (half the one-row staging's
// slots: the plain-scale kernels spilled with 8).
constexpr int ROWS_STAGE_LOADS = STAGE_LOADS_PER_THREAD / 2;
template <int CB, class Load, class Pairs>
__device__ __forceinline__ void stage_rows(int cols, u8* smem, int wc, int c0, int c1, int chunks, Load load,
                                           Pairs pairs) {
  using C = Chunk<CB>;
  const int pieces = (c1 - c0) * C::WORDS, valid = (min(c1, chunks) - c0) * C::WORDS;
  const int row_stride = C::WORDS * wc * 16 + gemv16::COLS_ROW_PAD;
  const int total = cols * pieces;
  for (int base = 0; base < total; base += ROWS_STAGE_LOADS * THREADS) {
    decltype(load(0, 0, false)) v[ROWS_STAGE_LOADS];
#pragma unroll
    for (int n = 0; n < ROWS_STAGE_LOADS; ++n) {
      const int i = base + threadIdx.x + n * THREADS, r = i / pieces, e = i % pieces;
      v[n] = load(r, e, i < total && e < valid);
    }
#pragma unroll
    for (int n = 0; n < ROWS_STAGE_LOADS; ++n) {
      const int i = base + threadIdx.x + n * THREADS, r = i / pieces, e = i % pieces;
      if (i >= total) break;
      *reinterpret_cast<uint4*>(smem + r * row_stride + ((e % C::WORDS) * wc + e / C::WORDS) * 16) = pairs(v[n]);
    }
  }
}

// Stages x chunks [c0, c1) of tile t's 16-bit rows (p.b: [batches, p.cols, K]).
template <int CB>
__device__ void stage_x_rows(const GemvParams& p, u8* smem, int wc, const gemv_tiles::Tile& t, int c0, int c1,
                             int chunks) {
  const auto load = [&](int r, int e, bool in) {
    const u8* xr = p.b + ((i64)t.x_l * p.cols + t.x_r0 + r) * p.k * 2;
    return in ? ptx::ld_nc_v4(xr + ((i64)c0 * Chunk<CB>::WORDS + e) * 16) : make_uint4(0, 0, 0, 0);
  };
  stage_rows<CB>(t.cols, smem, wc, c0, c1, chunks, load, pair_order);
}

template <int CB, bool BLOCKED, bool ABF16, bool OBF16>
struct W4A16Cols : W4A16<CB, BLOCKED, ABF16, OBF16> {
  static constexpr bool COLS = true;
  static __device__ __forceinline__ void stage(const GemvParams& p, u8* smem, int wc, const gemv_tiles::Tile& t,
                                               int c0, int c1, int chunks) {
    stage_x_rows<CB>(p, smem, wc, t, c0, c1, chunks);
  }
  // d[u] += MMA tile u's products for one K-step, column g from activation row min(g, cols - 1)
  // of the window (chunk cl): the one-row compute on that row.
  static __device__ __forceinline__ void compute(const gemv_tiles::Tile& t, const WChunk& x, const u8* xs, int wc,
                                                 int cl, float (&d)[2][4]) {
    const int row = min((int)(threadIdx.x % 32) / 4, t.cols - 1);
    ::compute<CB, ABF16>(x, xs + row * (Chunk<CB>::WORDS * wc * 16 + gemv16::COLS_ROW_PAD), wc, cl, d);
  }
  // D's columns are activation rows: lane (g, t) holds tile u's rows g (d[u][0], d[u][1]) and
  // g + 8 (d[u][2], d[u][3]) of columns 2t, 2t + 1. Thread i adds column i / 32, tile row i % 32
  // over the warps, in warp order; the skeleton drops columns >= cols.
  static __device__ __forceinline__ gemv_tiles::Out reduce(const float (&d)[2][4], int warp, int lane) {
    __shared__ float s_part[WARPS][8][gemv16::ROWS_PER_CTA + 1];  // [warp][column][tile row], f32
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s_part[warp][2 * t + e % 2][8 * (2 * u + e / 2) + g] = d[u][e];
    }
    __syncthreads();
    const int col = threadIdx.x / 32, tr = threadIdx.x % 32;
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) total += s_part[w][col][tr];
    __syncthreads();  // s_part is free for the next tile
    return {total, tr / 8, tr % 8, col, true};
  }
};
static_assert(gemv16::THREADS == 8 * 32, "the cols reduce gives each thread one (column, tile row)");

// ---- The W4A4 GEMM of 2 to 8 activation rows: the activation is NVFP4 too. Its window is
// decoded while staged, by the weights' own f16 decoder (e2m1 * e4m3 * 2^-7, exact in f16), into
// the `_cols` window's layout; the MMA products of two such values are exact in f32, and the
// epilogue takes both 2^-7 back.

// Stages x chunks [c0, c1) of tile t's NVFP4 rows (values p.b [batches, p.cols, K / 2], scales
// p.sfb in the weight's scale layout), decoded to f16 pairs.
template <int CB, bool BLOCKED>
__device__ void stage_x_rows_nvfp4(const GemvParams& p, u8* smem, int wc, const gemv_tiles::Tile& t, int c0, int c1,
                                   int chunks) {
  const int sf_cols = p.k / 16;
  const auto load = [&](int r, int e, bool in) {
    // Word e: elements 8 e .. 8 e + 7 of the window, of scale block (8 e) / 16.
    const i32 k0 = (c0 * Chunk<CB>::WORDS + e) * 8, r_in = t.x_r0 + r;
    const i64 row = (i64)t.x_l * p.cols + r_in;
    const u32 w = in ? ptx::ld_nc_u32(p.b + row * (p.k / 2) + k0 / 2) : 0u;
    const u32 s =
        in ? ptx::ld_nc_u8(p.sfb + nvfp4::scale_offset(BLOCKED, p.cols, sf_cols, r_in, k0 / 16, t.x_l)) : 0u;
    return make_uint2(w, s);
  };
  const auto decode = [](uint2 ws) {
    u32 o[4];  // (x0 x4, x1 x5, x2 x6, x3 x7), as `stage_x` lays out a 16-bit row
    nvfp4::w4a16_f16x8(ws.x, nvfp4::scale_f16x2_x128(ws.y), o);
    return make_uint4(o[0], o[1], o[2], o[3]);
  };
  stage_rows<CB>(t.cols, smem, wc, c0, c1, chunks, load, decode);
}

template <int CB, bool BLOCKED, bool OBF16>
struct W4A4Cols : W4A16Cols<CB, BLOCKED, false, OBF16> {
  static __device__ __forceinline__ void stage(const GemvParams& p, u8* smem, int wc, const gemv_tiles::Tile& t,
                                               int c0, int c1, int chunks) {
    stage_x_rows_nvfp4<CB, BLOCKED>(p, smem, wc, t, c0, c1, chunks);
  }
  static __device__ __forceinline__ double scale(const GemvParams& p, const gemv_tiles::Tile&) {
    return p.alpha * nvfp4::W4A16_F16_UNBIAS * nvfp4::W4A16_F16_UNBIAS;
  }
};
