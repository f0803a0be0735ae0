// output.cuh: the output element of every kernel, f16 or bf16 by a flag of the launch's
// parameters (nonzero: bf16; uniform across a problem), rounded once to nearest even from the
// finished f32 or f64 value. Kernels write their outputs through these and nothing else.
#pragma once

#include "ptx.cuh"

namespace out {

// One element, as bits.
NVFP4_DEVICE u16 of_f32(float v, i32 bf16) { return bf16 ? ptx::f32_to_bf16_rn(v) : ptx::f32_to_f16_rn(v); }
NVFP4_DEVICE u16 of_f64(double v, i32 bf16) { return bf16 ? ptx::f64_to_bf16_rn(v) : ptx::f64_to_f16_rn(v); }

// of_f64 as one predicated conversion instead of the compiler's choice.
// NOTE: register allocation decides between the two, measured with `nvfp4 kernels` (NVRTC 13.0):
// in the GEMV (128 registers at its launch bound) of_f64 spilled 44 bytes and this none; in the
// wgmma kernels (AlphaF64 stores) this spilled 0.5-2 KB per variant and of_f64 none.
NVFP4_DEVICE u16 of_f64_predicated(double v, i32 bf16) { return ptx::f64_to_f16_or_bf16_rn(v, bf16); }

// Two elements (lo in the low half), as one 32-bit word.
NVFP4_DEVICE u32 pair_of_f32(float lo, float hi, i32 bf16) {
  return bf16 ? ptx::f32x2_to_bf16x2_rn(lo, hi) : ptx::f32x2_to_f16x2_rn(lo, hi);
}

}  // namespace out
