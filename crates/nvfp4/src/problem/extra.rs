//! Extra random shapes for `check`: the edges the SPEC test shapes do not reach (M or N of 1, 7,
//! 40, 130..., K of one or three scale blocks, K not a multiple of 64, L > 1).

use super::{ProblemKind, Rng, Shape};

const GEMV_M: [usize; 5] = [1, 7, 40, 130, 1000];
const GEMV_K: [usize; 4] = [16, 48, 64, 4112];
const GEMM_MN: [usize; 6] = [1, 7, 40, 72, 130, 257];
const GEMM_K: [usize; 4] = [16, 48, 256, 4112];
const DUAL_MN: [usize; 4] = [1, 7, 40, 130];
const DUAL_K: [usize; 3] = [16, 48, 256];
const L: [usize; 2] = [1, 3];
/// Grouped cases drawn per check run.
const GROUPED_CASES: usize = 8;

/// The extra shapes of `kind`: full cross products for the first three operations, and a few
/// seeded random group lists (1 to 5 groups, each with its own M, N, K) for the grouped GEMM.
pub fn extra_shapes(kind: ProblemKind) -> Vec<Shape> {
    let mut out = Vec::new();
    match kind {
        ProblemKind::Gemv => {
            for l in L {
                for k in GEMV_K {
                    for m in GEMV_M {
                        out.push(Shape::Gemv { m, k, l });
                    }
                }
            }
        }
        ProblemKind::Gemm | ProblemKind::DualGemm => {
            let (mn, ks): (&[usize], &[usize]) =
                if kind == ProblemKind::Gemm { (&GEMM_MN, &GEMM_K) } else { (&DUAL_MN, &DUAL_K) };
            for l in L {
                for &k in ks {
                    for &m in mn {
                        for &n in mn {
                            out.push(if kind == ProblemKind::Gemm {
                                Shape::Gemm { m, n, k, l }
                            } else {
                                Shape::DualGemm { m, n, k, l }
                            });
                        }
                    }
                }
            }
        }
        ProblemKind::GroupedGemm => {
            let mut rng = Rng::new(0x6772_6f75_7065_6400);
            let pick = |rng: &mut Rng, v: &[usize]| v[rng.below(v.len() as u32) as usize];
            for _ in 0..GROUPED_CASES {
                let g = 1 + rng.below(5) as usize;
                let groups = (0..g)
                    .map(|_| (pick(&mut rng, &GEMM_MN), pick(&mut rng, &GEMM_MN), pick(&mut rng, &GEMM_K[..3])))
                    .collect();
                out.push(Shape::GroupedGemm { groups });
            }
        }
    }
    out
}
