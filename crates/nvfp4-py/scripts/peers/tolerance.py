"""How far an output may lie from its float64 reference, per implementation. Pure (no torch).

Every output element c = round_out(alpha * sum_k p_k), p_k = a_k * w_k, is checked against the
float64 value r = alpha * sum_k p_k of the same operands (each implementation's own: the 16-bit
activation for W4A16, the dequantized NVFP4 activation for W4A4, the BF16-rounded dequantized
weight for cuBLAS and torch._grouped_mm). Let S = |alpha| * sum_k |p_k| (float64 too).

- The products are exact in FP32 (at most 8 + 6, 11 + 6 or 6 + 6 significant bits; SPEC §8), so a
  kernel accumulating in FP32 errs only in its additions: in any order, at most (K - 1) * u32 * S
  (u32 = 2^-24; Higham, Accuracy and Stability of Numerical Algorithms, §4.2), plus u32 * |r| for
  alpha's product. Tensor cores that truncate instead of rounding at most double this.
- The one rounding to the output type adds u_out * |r| (u_out = 2^-8 for BF16, 2^-11 for FP16).
- A peer may add partial sums in the output type (split-K or stream-K partials in BF16: Humming's
  global reduction, cuBLAS under torch's default allow_bf16_reduced_precision_reduction): each of
  up to SPLITS partials and each addition rounds once more, at most u_out * S each.

So |c - r| <= SLACK * (u_out * |r| + acc * S) + FLOOR, acc = (K + 2) * u32 + splits * u_out, SLACK = 2
(truncating adders) and FLOOR half the output type's smallest subnormal.

The gated dual GEMM c = silu(x1) * x2 (x_i each as above, errors e_i <= acc * S_i): to first order
|dc| <= |silu'(x1)| * |x2| * e1 + |silu(x1)| * e2 with |silu'| <= 1.1. A peer that rounds x1 and x2
to the output type before its silu and its product adds u_out * |x_i| to e_i and a second
u_out * |r|.

The elementwise bound is worst case and loose by design (no correct kernel can fail it); a normwise
bound catches the middling errors it lets through: ||c - r|| / ||r|| <= NORM_LIMIT = 2^-6, four
times one BF16 rounding's largest relative error.
"""

from dataclasses import dataclass

U32 = 2.0**-24
UNIT = {"bfloat16": 2.0**-8, "float16": 2.0**-11}
FLOOR = {"bfloat16": 2.0**-134, "float16": 2.0**-25}
SLACK = 2.0
SPLITS = 4
SILU_SLOPE = 1.1
NORM_LIMIT = 2.0**-6


@dataclass(frozen=True)
class Profile:
    """The rounding an implementation does on a K-deep sum rounded to ``out_dtype``."""

    out_dtype: str
    k: int
    splits: int = 0  # partial sums added in the output type (0: FP32 to the final rounding)
    rounds_halves: bool = False  # dual: x1, x2 rounded to the output type before silu * mul

    def __post_init__(self):
        if self.out_dtype not in UNIT:
            raise ValueError(f"out_dtype must be one of {sorted(UNIT)}, got {self.out_dtype!r}")
        if self.k < 1 or self.splits < 0:
            raise ValueError(f"k must be >= 1 and splits >= 0, got k={self.k}, splits={self.splits}")

    @property
    def unit(self):
        return UNIT[self.out_dtype]

    @property
    def floor(self):
        return FLOOR[self.out_dtype]

    @property
    def acc(self):
        """Coefficient of S: the accumulation's error bound."""
        return (self.k + 2) * U32 + self.splits * self.unit

    @property
    def out_coef(self):
        """Coefficient of |r|: the final rounding (twice for a dual GEMM rounded in steps)."""
        return self.unit * (2 if self.rounds_halves else 1)

    @property
    def inter(self):
        """Coefficient of |x_i|: rounding of the dual GEMM's halves before silu * mul."""
        return self.unit if self.rounds_halves else 0.0

    def gemm_bound(self, ref_abs, s):
        """Elementwise bound for a plain product: works on floats, NumPy arrays or tensors."""
        return SLACK * (self.out_coef * ref_abs + self.acc * s) + self.floor

    def dual_bound(self, ref_abs, x1_abs, x2_abs, silu1_abs, s1, s2):
        """Elementwise bound for silu(x1) * x2 from the float64 x1, x2, silu(x1), S1 and S2."""
        e1 = self.acc * s1 + self.inter * x1_abs
        e2 = self.acc * s2 + self.inter * x2_abs
        return SLACK * (self.out_coef * ref_abs + SILU_SLOPE * x2_abs * e1 + silu1_abs * e2) + self.floor


def nvfp4_profile(out_dtype, k):
    """nvfp4: FP32 accumulation, one rounding (SPEC §3, §8)."""
    return Profile(out_dtype, k)


def peer_profile(out_dtype, k, dual=False):
    """Humming, cuBLAS, torch._grouped_mm: may reduce partials in the output type; a dual GEMM
    is their GEMM, then silu and a product in the output type."""
    return Profile(out_dtype, k, splits=SPLITS, rounds_halves=dual)
