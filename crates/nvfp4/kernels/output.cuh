// output.cuh: the output element of every kernel, f16 or bf16 by a flag of the launch's
// parameters (nonzero: bf16; uniform across a problem), rounded once to nearest even from the
// finished f32 or f64 value. Kernels write their outputs through these and nothing else.
#pragma once

#include "ptx.cuh"

namespace out {

// One element, as bits.
NVFP4_DEVICE u16 of_f32(float v, i32 bf16) { return bf16 ? ptx::f32_to_bf16_rn(v) : ptx::f32_to_f16_rn(v); }
NVFP4_DEVICE u16 of_f64(double v, i32 bf16) { return bf16 ? ptx::f64_to_bf16_rn(v) : ptx::f64_to_f16_rn(v); }

// Two elements (lo in the low half), as one 32-bit word.
NVFP4_DEVICE u32 pair_of_f32(float lo, float hi, i32 bf16) {
  return bf16 ? ptx::f32x2_to_bf16x2_rn(lo, hi) : ptx::f32x2_to_f16x2_rn(lo, hi);
}

}  // namespace out
