//! Extra random shapes for `check`: the edges the SPEC test shapes do not reach (M or N of 1, 7,
//! 40, 130..., K of one or three scale blocks, K not a multiple of 64, L > 1), and the grouped
//! GEMM's MoE form (empty experts, one expert holding every token, E = 1, the bench's routing).

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
const MOE_N: [usize; 4] = [7, 130, 256, 384];
const MOE_K: [usize; 4] = [16, 48, 256, 512];
/// Largest token count of one expert in the random MoE cases.
const MOE_MAX_COUNT: u32 = 300;
/// Random MoE cases drawn per check run.
const MOE_RANDOM_CASES: usize = 6;

/// The extra shapes of `kind`: full cross products for the first three operations, and a few
/// seeded random group lists (1 to 5 groups, each with its own M, N, K) and the MoE cases
/// ([`moe_shapes`]) for the grouped GEMM.
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
            out.extend(moe_shapes());
        }
    }
    out
}

fn moe(counts: &[usize], n: usize, k: usize) -> Shape {
    Shape::Moe { n, k, counts: counts.to_vec() }
}

/// The MoE form's cases: the edges named, then seeded random ones (E in 1..=16, counts in
/// 0..=300, about one expert in four empty). T = 0 cannot be built (a tensor has no zero
/// dimension), so a draw with every count 0 is skipped.
fn moe_shapes() -> Vec<Shape> {
    let mut out = vec![
        moe(&[0, 0, 257, 0], 130, 256),    // one expert holds every token
        moe(&[0, 0, 40, 72], 256, 48),     // empty experts at the start
        moe(&[64, 0, 0, 33, 128], 7, 512), // empty experts in the middle
        moe(&[96, 17, 0, 0], 384, 16),     // empty experts at the end
        moe(&[130], 256, 256),             // E = 1
        // The first bench case's routing (N = 4096, K = 7168), K cut to keep the reference fast.
        moe(&[80, 176, 128, 72, 64, 248, 96, 160], 4096, 512),
    ];
    let mut rng = Rng::new(0x6d6f_655f_6361_7365);
    let pick = |rng: &mut Rng, v: &[usize]| v[rng.below(v.len() as u32) as usize];
    for _ in 0..MOE_RANDOM_CASES {
        let e = 1 + rng.below(16) as usize;
        let counts: Vec<usize> =
            (0..e).map(|_| if rng.below(4) == 0 { 0 } else { rng.below(MOE_MAX_COUNT + 1) as usize }).collect();
        let (n, k) = (pick(&mut rng, &MOE_N), pick(&mut rng, &MOE_K));
        if counts.iter().any(|&c| c > 0) {
            out.push(Shape::Moe { n, k, counts });
        }
    }
    out
}
