// output.cuh: the output element of every kernel, f16 or bf16 by a flag of the launch's
// parameters (nonzero: bf16; uniform across a problem), rounded once to nearest even from the
// finished f32 or f64 value. Kernels write their outputs through these and nothing else. Also the
// one activation an epilogue applies before that rounding: the dual GEMM's SwiGLU gate.
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

// silu(x) = x / (1 + e^-x) in f32, the gate of every dual GEMM (the skeleton's SwiGLU epilogue and
// the fallback's): ex2.approx and rcp.approx, a few ulp, far inside the SPEC tolerance; x -> -inf
// gives -0, NaN stays NaN.
// NOTE: one definition for both kernel families, so that a dual GEMM's gate does not depend on
// which family the plan chose.
NVFP4_DEVICE float silu(float x) { return x * ptx::rcp_approx(1.0f + ptx::ex2_approx(x * -1.4426950408889634f)); }

}  // namespace out
