// ptx.cuh: every inline-PTX string of the nvfp4 kernels, behind small typed wrappers.
//
// NVRTC has no include path, so this header defines its own integer types and uses no CUDA
// header. Everything here is a thin, forced-inline wrapper around one or two PTX instructions.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef int i32;
typedef long long i64;

#define NVFP4_DEVICE __device__ __forceinline__

namespace ptx {

// ---- arithmetic ---------------------------------------------------------------------------------

// max that propagates NaN (fmaxf skips it): a NaN anywhere in a reduction shows in the result.
NVFP4_DEVICE float fmax_nan(float a, float b) {
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

// Lane-wise max(|a|, |b|) of two bf16x2 (f16x2) words, NaN propagating (the sign of each result
// lane is the xor of the inputs' signs: callers use the magnitude).
NVFP4_DEVICE u32 max_abs_nan_bf16x2(u32 a, u32 b) {
  u32 d;
  asm("max.NaN.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
NVFP4_DEVICE u32 max_abs_nan_f16x2(u32 a, u32 b) {
  u32 d;
  asm("max.NaN.xorsign.abs.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// ---- cache policies and loads ------------------------------------------------------------------

// An L2 policy that evicts the lines it touches first: for data read exactly once (the GEMV's A).
NVFP4_DEVICE u64 policy_evict_first() {
  u64 pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}

// 16 B streamed load: read-only path, no L1 allocation, L2 evict-first, 256 B L2 prefetch.
NVFP4_DEVICE uint4 ld_stream_v4(const void* p, u64 pol) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(pol));
  return v;
}

// 8 B streamed load (the K % 32 == 16 path), same hints.
NVFP4_DEVICE uint2 ld_stream_v2(const void* p, u64 pol) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v2.u32 {%0, %1}, [%2], %3;"
               : "=r"(v.x), "=r"(v.y)
               : "l"(p), "l"(pol));
  return v;
}

// An L2 policy that keeps the usual (LRU) order: for data read twice, the second time soon.
NVFP4_DEVICE u64 policy_evict_normal() {
  u64 pol;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}

// 16 B streamed load through L1 (evict-first there, L2 evict-first by `pol`): for a thread that
// reads 32-64 contiguous bytes in 16 B pieces, so that its later pieces hit the sector the first
// one brought into L1 (the quantizer's 16-element blocks).
NVFP4_DEVICE uint4 ld_stream_l1_v4(const void* p, u64 pol) {
  uint4 v;
  asm volatile("ld.global.nc.L1::evict_first.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(pol));
  return v;
}

// Read-only loads through L1 (scales: neighbouring lanes and warps share their sectors).
NVFP4_DEVICE uint4 ld_nc_v4(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
NVFP4_DEVICE uint2 ld_nc_v2(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
NVFP4_DEVICE u32 ld_nc_u32(const void* p) {
  u32 v;
  asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
NVFP4_DEVICE u32 ld_nc_u16(const void* p) {
  u16 v;
  asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}
NVFP4_DEVICE u32 ld_nc_u8(const void* p) {
  u16 v;
  asm volatile("ld.global.nc.u8 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}

// Brings the line holding p into L2 (no register, no wait).
NVFP4_DEVICE void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// Brings `bytes` (a multiple of 16, 16-byte aligned) from `src` into L2 (no shared memory, no wait).
NVFP4_DEVICE void bulk_prefetch_l2(const void* src, u32 bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

// Load from L2, bypassing L1: data another CTA wrote during this launch (split-K partials).
NVFP4_DEVICE float ld_cg_f32(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

// ---- cp.async (per-thread copies into shared memory, completed by group) -----------------------

// 16 B of global memory to shared memory `dst` (a shared-window address), bypassing L1, L2
// evict-first with a 256 B L2 prefetch, as `ld_stream_v4`.
// NOTE: no zero-fill (src-size) forms: on the H200, the 16 B copy of the blocked scales with
// src-size 0 raised CUDA_ERROR_ILLEGAL_INSTRUCTION (compute-sanitizer located it); callers store
// zeros themselves.
NVFP4_DEVICE void cp_async_16(u32 dst, const void* src, u64 pol) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "l"(pol)
               : "memory");
}
// 16 B, L2's default policy (scales: neighbouring threads share their sectors).
NVFP4_DEVICE void cp_async_16_plain(u32 dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
// 8 B (src 8-byte aligned) through L1 (a warp's rows of plain scales).
NVFP4_DEVICE void cp_async_8(u32 dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src) : "memory");
}
// 4 B (src 4-byte aligned) through L1 (neighbouring threads share the sectors: scales).
NVFP4_DEVICE void cp_async_4(u32 dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
NVFP4_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's committed groups are pending; the completed groups'
// shared-memory writes are then visible to this thread.
template <int N>
NVFP4_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// ---- integer and byte tricks -------------------------------------------------------------------

// Byte permute: byte i of the result is byte (sel >> 4i) & 7 of {b, a} (a = bytes 0..3).
NVFP4_DEVICE u32 prmt(u32 a, u32 b, u32 sel) {
  u32 d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// (a & b) | c in one instruction.
NVFP4_DEVICE u32 lop3_and_or(u32 a, u32 b, u32 c) {
  u32 d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Any three-input bitwise function, by its truth table LUT over a = 0xF0, b = 0xCC, c = 0xAA
// (e.g. 0xA8: (a | b) & c).
template <u32 LUT>
NVFP4_DEVICE u32 lop3(u32 a, u32 b, u32 c) {
  u32 d;
  asm("lop3.b32 %0, %1, %2, %3, %4;" : "=r"(d) : "r"(a), "r"(b), "r"(c), "n"(LUT));
  return d;
}

// c + sum of the four signed byte products of a and b.
NVFP4_DEVICE i32 dp4a(u32 a, u32 b, i32 c) {
  i32 d;
  asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// ---- conversions -------------------------------------------------------------------------------

// f32 -> e4m3 byte, round to nearest even, finite values and infinities saturating to +-448,
// NaN -> 0x7F (sm_89+).
NVFP4_DEVICE u32 cvt_f32_e4m3(float x) {
  u16 d;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(0.0f), "f"(x));
  return d & 0xFFu;
}

// Funnel shift left: the high word of ({hi, lo} << n), i.e. (hi << n) | (lo >> (32 - n)).
NVFP4_DEVICE u32 shf_l(u32 lo, u32 hi, u32 n) {
  u32 d;
  asm("shf.l.wrap.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(lo), "r"(hi), "r"(n));
  return d;
}

// Two e4m3 bytes (byte 0 -> low half) to an f16x2, exactly (sm_89+).
NVFP4_DEVICE u32 cvt_e4m3x2_f16x2(u32 two_bytes) {
  u32 d;
  u16 s = (u16)two_bytes;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(d) : "h"(s));
  return d;
}

// The two halves of an f16x2 as f32 (exact).
NVFP4_DEVICE void f16x2_to_f32(u32 h2, float& lo, float& hi) {
  u16 l, h;
  asm("mov.b32 {%0, %1}, %2;" : "=h"(l), "=h"(h) : "r"(h2));
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(l));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(h));
}

// f64 to f16 bits, round to nearest even, overflow to inf: one rounding for sum * alpha.
NVFP4_DEVICE u16 f64_to_f16_rn(double x) {
  u16 h;
  asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(x));
  return h;
}

// f32 to f16 bits, round to nearest even.
NVFP4_DEVICE u16 f32_to_f16_rn(float x) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}

// f64 to bf16 bits, round to nearest even, overflow to inf: one rounding (sm_90).
NVFP4_DEVICE u16 f64_to_bf16_rn(double x) {
  u16 h;
  asm("cvt.rn.bf16.f64 %0, %1;" : "=h"(h) : "d"(x));
  return h;
}

// f32 to bf16 bits, round to nearest even.
NVFP4_DEVICE u16 f32_to_bf16_rn(float x) {
  u16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}

// 2^x and 1/x, approximate (a few ulp; subnormal inputs and results flush to zero).
NVFP4_DEVICE float ex2_approx(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
NVFP4_DEVICE float rcp_approx(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// f16x2 multiply (exact when the products fit f16, as e2m1 * e4m3 products do).
NVFP4_DEVICE u32 hmul2(u32 a, u32 b) {
  u32 d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// bf16x2 multiply, round to nearest even (sm_90; exact when the products fit bf16). Subnormal
// inputs and results are kept (PTX has no .ftz for bf16).
NVFP4_DEVICE u32 hmul2_bf16(u32 a, u32 b) {
  u32 d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// a times half H (0: low, 1: high) of b in both lanes, f16x2 or (BF16) bf16x2, round to nearest
// even, subnormals kept. NOTE: written as a register pair duplicated by `mov`, ptxas folds the
// duplication into the multiply's operand (HMUL2 R, R, R.H0_H0); a prmt stays an instruction.
#define NVFP4_HMUL2_BY_HALF(TYPE, HALF)                                                               \
  asm("{\n.reg .b16 lo, hi;\n.reg .b32 x;\nmov.b32 {lo, hi}, %2;\nmov.b32 x, {" HALF ", " HALF "};\n" \
      "mul.rn." TYPE " %0, %1, x;\n}"                                                                  \
      : "=r"(d)                                                                                      \
      : "r"(a), "r"(b))
template <int H, bool BF16 = false>
NVFP4_DEVICE u32 hmul2_by_half(u32 a, u32 b) {
  u32 d;
  if constexpr (BF16 && H)
    NVFP4_HMUL2_BY_HALF("bf16x2", "hi");
  else if constexpr (BF16)
    NVFP4_HMUL2_BY_HALF("bf16x2", "lo");
  else if constexpr (H)
    NVFP4_HMUL2_BY_HALF("f16x2", "hi");
  else
    NVFP4_HMUL2_BY_HALF("f16x2", "lo");
  return d;
}

// The two f16 of an f16x2 as a bf16x2 times 2^112 (exact for values with at most 8 significant
// bits and |x| <= 2^15; NaN stays NaN, zero stays zero).
NVFP4_DEVICE u32 f16x2_to_bf16x2_x2p112(u32 h2) {
  u32 d;
  asm("{\n.reg .b16 lo, hi;\n.reg .b32 x;\nmov.b32 {lo, hi}, %1;\ncvt.rn.bf16.f16 lo, lo;\ncvt.rn.bf16.f16 hi, hi;\n"
      "mov.b32 x, {lo, hi};\nmul.rn.bf16x2 %0, x, %2;\n}"
      : "=r"(d)
      : "r"(h2), "r"(0x77807780u));  // 2^112 in both bf16 lanes
  return d;
}

// ---- tensor cores (mma.sync, sm_80+) -----------------------------------------------------------

// D = A * B + C, m16n8k16, f32 accumulators, inputs f16 (or, BF16, bf16) both. a: 4 regs, b: 2
// regs, c/d: 4 floats.
#define NVFP4_MMA_M16N8K16(AB)                                                                     \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32" AB ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, " \
               "{%0, %1, %2, %3};"                                                                 \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                    \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
template <bool BF16 = false>
NVFP4_DEVICE void mma_m16n8k16_f32(float* d, const u32* a, const u32* b) {
  if constexpr (BF16)
    NVFP4_MMA_M16N8K16(".bf16.bf16");
  else
    NVFP4_MMA_M16N8K16(".f16.f16");
}

}  // namespace ptx

// ================================================================================================
// sm_90 (Hopper) machinery for the tensor-core GEMM (gemm_sm90.cu): shared-memory addresses,
// mbarriers, TMA, proxy fences, named barriers, register reconfiguration and wgmma.
// ================================================================================================

namespace ptx {

// ---- shared memory -----------------------------------------------------------------------------

// 32-bit shared-window address of a generic pointer into shared memory.
NVFP4_DEVICE u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// threadIdx.x, read where it is used: ptxas does not hoist values derived from it (it computed the
// epilogue's and the mainloop's per-thread offsets at the kernel's start and spilled them across
// the mainloop when 128 accumulators left no room).
NVFP4_DEVICE u32 tid_x_here() {
  u32 r;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(r));
  return r;
}

// Bytes of dynamic shared memory this launch got.
NVFP4_DEVICE u32 dynamic_smem_size() {
  u32 r;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
  return r;
}

NVFP4_DEVICE uint2 lds_v2(u32 addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
NVFP4_DEVICE uint4 lds_v4(u32 addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
NVFP4_DEVICE void sts_v4(u32 addr, u32 a, u32 b, u32 c, u32 d) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
NVFP4_DEVICE void sts_u32(u32 addr, u32 v) { asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory"); }
NVFP4_DEVICE float4 lds_f4(u32 addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
  return v;
}
NVFP4_DEVICE void sts_f4(u32 addr, float4 v) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}

// ---- mbarriers ---------------------------------------------------------------------------------

NVFP4_DEVICE void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Makes mbarrier initialisation visible to the async proxy (TMA) and the other threads.
NVFP4_DEVICE void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
NVFP4_DEVICE void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// An arrival when `pred` holds, as a predicated instruction rather than a branch (a branch
// between wgmmas makes ptxas serialize the wgmma pipeline).
NVFP4_DEVICE void mbar_arrive_if(u32 bar, bool pred) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %1, 0;\n@p mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar),
      "r"((u32)pred)
      : "memory");
}
// One arrival that also announces `bytes` of transactions (TMA) the phase must wait for.
NVFP4_DEVICE void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Blocks until the phase with the given parity has completed.
NVFP4_DEVICE void mbar_wait(u32 bar, u32 parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_LOOP:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_LOOP;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// ---- programmatic dependent launch -------------------------------------------------------------

// Lets the next kernel on the stream (launched with programmatic stream serialization) start.
// Both are no-ops below sm_90, which has no programmatic dependent launch (so that a module using
// them, the quantizer's, still compiles there).
NVFP4_DEVICE void launch_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Waits until the previous kernel on the stream has completed and its writes are visible (a no-op
// when this kernel was launched without programmatic stream serialization).
NVFP4_DEVICE void wait_prerequisites() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// ---- TMA (cp.async.bulk.tensor) ----------------------------------------------------------------

// An L2 policy that keeps the lines it touches: for data every CTA reads again (small operands).
NVFP4_DEVICE u64 policy_evict_last() {
  u64 pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}

NVFP4_DEVICE void prefetch_tensormap(const void* tmap) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(tmap) : "memory");
}

// Loads the box at coordinates (c0, c1, c2) of a 3-D tensor map into shared memory `dst`;
// completion is signalled as transaction bytes on mbarrier `bar`. Out-of-range elements are zero.
NVFP4_DEVICE void tma_load_3d(u32 dst, const void* tmap, u32 bar, i32 c0, i32 c1, i32 c2, u64 policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;" ::"r"(dst),
      "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "l"(policy)
      : "memory");
}

// tma_load_3d into the same shared-memory offset `dst` of every CTA of the cluster in `cta_mask`,
// signalling the mbarrier at offset `bar` of each of them.
NVFP4_DEVICE void tma_load_3d_multicast(u32 dst, const void* tmap, u32 bar, i32 c0, i32 c1, i32 c2, u16 cta_mask,
                                        u64 policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      ".L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], %6, %7;" ::"r"(dst),
      "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(cta_mask), "l"(policy)
      : "memory");
}

// Copies `bytes` (a multiple of 16, 16-byte aligned both sides) from global `src` to shared
// `dst`; completion is signalled as transaction bytes on mbarrier `bar`.
NVFP4_DEVICE void bulk_load(u32 dst, const void* src, u32 bytes, u32 bar, u64 policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}

// Stores the box of a 3-D tensor map at coordinates (c0, c1, c2) from shared memory `src`
// (elements outside the tensor are not written); completes as a bulk async-group.
NVFP4_DEVICE void tma_store_3d(const void* tmap, u32 src, i32 c0, i32 c1, i32 c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(tmap),
               "r"(src), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
NVFP4_DEVICE void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Waits until every committed bulk async-group of this thread has completed.
NVFP4_DEVICE void bulk_wait_group_0() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

NVFP4_DEVICE u32 lds_u32(u32 addr) {
  u32 v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}
NVFP4_DEVICE u32 lds_u8(u32 addr) {
  u16 v;
  asm volatile("ld.shared.u8 %0, [%1];" : "=h"(v) : "r"(addr));
  return v;
}

// Orders global-memory writes this thread has seen (generic proxy) before its later async-proxy
// reads of them (bulk copies).
NVFP4_DEVICE void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

// Orders this thread's generic-proxy shared-memory writes before later async-proxy reads (wgmma).
NVFP4_DEVICE void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// ---- barriers, register reconfiguration --------------------------------------------------------

// Named barrier `id` over `threads` threads (a multiple of 32); id 0 is __syncthreads.
NVFP4_DEVICE void named_barrier(u32 id, u32 threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- thread-block clusters ---------------------------------------------------------------------

NVFP4_DEVICE u32 cluster_ctarank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// Every thread of the cluster: arrive (release), then wait (acquire) for all the others.
NVFP4_DEVICE void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}
// The shared::cluster address of shared-memory offset `addr` in the cluster's CTA `rank`.
NVFP4_DEVICE u32 map_shared_rank(u32 addr, u32 rank) {
  u32 r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
// mbarrier_arrive on a barrier anywhere in the cluster (a mapa address), when `pred`; predicated,
// not branched (see mbar_arrive_if). CTA-scope release: enough to hand back a buffer this thread
// has finished reading. NOTE: .release.cluster costs a GPU-wide MEMBAR per arrival in SASS, which
// halved the throughput of the paired GEMM.
NVFP4_DEVICE void mbar_arrive_cluster_if(u32 cluster_bar, bool pred) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %1, 0;\n@p mbarrier.arrive.release.cta.shared::cluster.b64 _, [%0];\n}\n" ::"r"(
          cluster_bar),
      "r"((u32)pred)
      : "memory");
}

// An arrival on a barrier anywhere in the cluster (a mapa address), releasing at cluster scope:
// this CTA's earlier accesses happen before whatever the barrier's waiter does next.
NVFP4_DEVICE void mbar_arrive_remote(u32 cluster_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(cluster_bar) : "memory");
}
// mbar_wait, acquiring at cluster scope (the phase was completed by another CTA of the cluster).
NVFP4_DEVICE void mbar_wait_cluster(u32 bar, u32 parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_LOOP:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_LOOP;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// 16 bytes into another CTA's shared memory (a mapa address), completing 16 transaction bytes
// on its barrier `cluster_bar` (also a mapa address) when they have landed.
NVFP4_DEVICE void st_async_f4(u32 cluster_addr, float4 v, u32 cluster_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                   cluster_addr),
               "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(cluster_bar)
               : "memory");
}

template <u32 REGS>
NVFP4_DEVICE void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS));
}
template <u32 REGS>
NVFP4_DEVICE void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS));
}

// A load with acquire semantics at GPU scope.
NVFP4_DEVICE u32 ld_acquire_gpu(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Atomic add with acquire-release semantics at GPU scope: publishes what this thread (and, through
// a preceding CTA barrier, its CTA) wrote before it, and sees what the other arrivals published.
NVFP4_DEVICE u32 atom_add_acq_rel_gpu(u32* p, u32 v) {
  u32 old;
  asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// ---- global memory (split-K partials) ----------------------------------------------------------

NVFP4_DEVICE float4 ld_cg_v4(const float* p) {
  float4 v;
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}
NVFP4_DEVICE void st_cg_v4(float* p, float4 v) {
  asm volatile("st.global.cg.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}

// The transpose of an 8 x 8 matrix of 16-bit elements that the warp holds one pair per lane (lane
// l: row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1, the first in the low half), in that layout.
NVFP4_DEVICE u32 movmatrix_trans(u32 a) {
  u32 d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));
  return d;
}

// Two f32 to an f16x2 (lo in the low half), each rounded to nearest even.
NVFP4_DEVICE u32 f32x2_to_f16x2_rn(float lo, float hi) {
  u32 d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

// Two f32 to a bf16x2 (lo in the low half), each rounded to nearest even.
NVFP4_DEVICE u32 f32x2_to_bf16x2_rn(float lo, float hi) {
  u32 d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

// ---- wgmma (warpgroup MMA, sm_90a) -------------------------------------------------------------

// Shared-memory matrix descriptor of a K-major operand stored with the 128-byte swizzle: rows of
// 64 f16 (128 B), 8-row atoms 1024 B apart. `addr` is the 32-bit shared address of the first
// element (the atom base must be 1024-byte aligned; advancing along K adds bytes to `addr`).
NVFP4_DEVICE u64 wgmma_desc_k128b(u32 addr) {
  const u64 start = (addr & 0x3FFFFu) >> 4;
  const u64 lbo = 1;              // unused for swizzled K-major operands
  const u64 sbo = 1024 >> 4;      // 8 rows x 128 B between atoms along N
  return start | (lbo << 16) | (sbo << 32) | (1ull << 62);  // layout type 1: 128-byte swizzle
}

// Orders register accesses before the next wgmma (required after writing A fragments or D).
NVFP4_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
NVFP4_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
NVFP4_DEVICE void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Tells the compiler a register may have changed here (pins accumulators after a wgmma wait).
NVFP4_DEVICE void reg_fence(float& x) { asm volatile("" : "+f"(x)::"memory"); }

// The asm of one wgmma m64nNk16 for each N, with the input types AB (".f32.f16.f16" or
// ".f32.bf16.bf16": f32 accumulators, both inputs of the same 16-bit type).
#define NVFP4_WGMMA_RS_16(AB)                                                                           \
  asm volatile(                                                                                         \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"                                                      \
      "wgmma.mma_async.sync.aligned.m64n16k16" AB " "                                                   \
      "{"                                                                                               \
      "%0, %1, %2, %3, %4, %5, %6, %7"                                                                  \
      "}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"                                                    \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1))

#define NVFP4_WGMMA_RS_32(AB)                                                                                 \
  asm volatile(                                                                                               \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                                            \
      "wgmma.mma_async.sync.aligned.m64n32k16" AB " "                                                         \
      "{"                                                                                                     \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"                                  \
      "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"                                                        \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),       \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1))

#define NVFP4_WGMMA_RS_64(AB)                                                                                    \
  asm volatile(                                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                               \
      "wgmma.mma_async.sync.aligned.m64n64k16" AB " "                                                            \
      "{"                                                                                                        \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                   \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"                           \
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"                                                           \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),    \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])   \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1))

#define NVFP4_WGMMA_RS_128(AB)                                                                                   \
  asm volatile(                                                                                                  \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                               \
      "wgmma.mma_async.sync.aligned.m64n128k16" AB " "                                                           \
      "{"                                                                                                        \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                   \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                         \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                         \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"                           \
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"                                                           \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),          \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),    \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])   \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1))

#define NVFP4_WGMMA_RS_256(AB)                                                                                           \
  asm volatile(                                                                                                          \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"                                                                      \
      "wgmma.mma_async.sync.aligned.m64n256k16" AB " "                                                                   \
      "{"                                                                                                                \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                           \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                 \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                                 \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                                 \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                                 \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                                 \
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "                     \
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"                   \
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"                                                              \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),                  \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),            \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),          \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),          \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),          \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),          \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),          \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),          \
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),          \
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),          \
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),          \
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),          \
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),      \
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),  \
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),  \
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])   \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1))

// D[64 x N] += A[64 x 16] * B[16 x N]: A from registers (4 f16x2 per thread, or bf16x2 with BF16,
// the mma.m16n8k16 A layout per warp, warp w holding rows 16w..16w+15), B K-major in shared memory
// (descriptor) of the same type, f32 accumulators (N/2 per thread: row 16w + lane/4 + 8*((i>>1)&1),
// column 8*(i>>2) + 2*(lane%4) + (i&1)).
template <int N, bool BF16 = false>
NVFP4_DEVICE void wgmma_rs(float* d, const u32* a, u64 desc_b) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 128 || N == 256, "a wgmma N of the variants");
  if constexpr (N == 16) {
    if constexpr (BF16) NVFP4_WGMMA_RS_16(".f32.bf16.bf16"); else NVFP4_WGMMA_RS_16(".f32.f16.f16");
  } else if constexpr (N == 32) {
    if constexpr (BF16) NVFP4_WGMMA_RS_32(".f32.bf16.bf16"); else NVFP4_WGMMA_RS_32(".f32.f16.f16");
  } else if constexpr (N == 64) {
    if constexpr (BF16) NVFP4_WGMMA_RS_64(".f32.bf16.bf16"); else NVFP4_WGMMA_RS_64(".f32.f16.f16");
  } else if constexpr (N == 128) {
    if constexpr (BF16) NVFP4_WGMMA_RS_128(".f32.bf16.bf16"); else NVFP4_WGMMA_RS_128(".f32.f16.f16");
  } else {
    if constexpr (BF16) NVFP4_WGMMA_RS_256(".f32.bf16.bf16"); else NVFP4_WGMMA_RS_256(".f32.f16.f16");
  }
}

}  // namespace ptx
