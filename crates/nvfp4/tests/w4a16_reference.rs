//! The CPU reference's W4A16 form (SPEC §8) against its W4A4 form: an NVFP4 activation decoded
//! to bf16 or f16 is exact (every e2m1 × e4m3 value is), so the W4A16 operation on the decoded
//! activation must give the W4A4 operation's bits exactly, for every operation, both output
//! types and an alpha; and a dense activation that differs from the decoded one in one element
//! must change the result (the dense operand is really read).

use nvfp4::ops::HostActivation;
use nvfp4::problem::{generate, Problem, Shape};
use nvfp4::{Backend, CpuBackend, DualGemm, Gemm, Gemv, GroupedGemm, MoeGemm, Nvfp4Tensor, OutTensor, OutputDtype};

/// The activation's exact decoded values (global scale applied: a power of two here) as `dtype`.
fn dense(t: &Nvfp4Tensor, dtype: OutputDtype) -> OutTensor {
    let (l, rows, k) = (t.l(), t.rows(), t.k());
    let bits = (0..l)
        .flat_map(|b| HostActivation::decode_batch(t, b))
        .map(|x| {
            let v = x * t.global_scale();
            let bits = dtype.round_f32(v);
            assert_eq!(dtype.to_f32(bits), v, "decoded NVFP4 values are exact in {dtype}");
            bits
        })
        .collect();
    OutTensor::new(dtype, [l, rows, k], bits).unwrap()
}

fn shapes() -> Vec<Shape> {
    vec![
        Shape::Gemv { m: 40, k: 96, l: 2 },
        Shape::Gemm { m: 9, n: 17, k: 64, l: 2 },
        Shape::DualGemm { m: 7, n: 12, k: 48, l: 1 },
        Shape::GroupedGemm { groups: vec![(5, 8, 32), (3, 16, 64)] },
        Shape::Moe { n: 24, k: 32, counts: vec![6, 0, 11] },
    ]
}

#[test]
fn a_decoded_activation_gives_the_w4a4_bits() {
    let cpu = CpuBackend;
    for shape in shapes() {
        for (seed, dtype) in [(1, OutputDtype::F16), (2, OutputDtype::Bf16)] {
            for act in [OutputDtype::Bf16, OutputDtype::F16] {
                let mut p = generate(&shape, seed).unwrap();
                p.set_alpha(Some(0.375)).unwrap();
                let (w4a4, w4a16) = match &p {
                    Problem::Gemv(g) => {
                        let q = Gemv::new(g.a.clone(), dense(&g.b, act), g.alpha).unwrap();
                        (vec![cpu.gemv_as(g, dtype).unwrap()], vec![cpu.gemv16_as(&q, dtype).unwrap()])
                    }
                    Problem::Gemm(g) => {
                        let q = Gemm::new(dense(&g.a, act), g.b.clone(), g.alpha).unwrap();
                        (vec![cpu.gemm_as(g, dtype).unwrap()], vec![cpu.gemm16_as(&q, dtype).unwrap()])
                    }
                    Problem::DualGemm(d) => {
                        let q = DualGemm::new(dense(&d.a, act), d.b1.clone(), d.b2.clone(), d.alpha).unwrap();
                        (vec![cpu.dual_gemm_as(d, dtype).unwrap()], vec![cpu.dual_gemm16_as(&q, dtype).unwrap()])
                    }
                    Problem::GroupedGemm(g) => {
                        let groups = g
                            .groups
                            .iter()
                            .map(|x| Gemm::new(dense(&x.a, act), x.b.clone(), x.alpha).unwrap())
                            .collect();
                        let q = GroupedGemm::new(groups).unwrap();
                        (cpu.grouped_gemm_as(g, dtype).unwrap(), cpu.grouped_gemm16_as(&q, dtype).unwrap())
                    }
                    Problem::Moe(m) => {
                        let q =
                            MoeGemm::new(dense(&m.a, act), m.b.clone(), m.offsets.clone(), m.alpha.clone()).unwrap();
                        (vec![cpu.moe_gemm_as(m, dtype).unwrap()], vec![cpu.moe_gemm16_as(&q, dtype).unwrap()])
                    }
                };
                assert_eq!(w4a4, w4a16, "{shape} {act} activations, {dtype} out");
                assert!(w4a4.iter().all(|t| t.dtype() == dtype));
            }
        }
    }
}

#[test]
fn the_dense_activation_is_read() {
    let Problem::Gemm(g) = generate(&Shape::Gemm { m: 3, n: 4, k: 32, l: 1 }, 9).unwrap() else { unreachable!() };
    let x = dense(&g.a, OutputDtype::Bf16);
    let mut bits = x.bits().to_vec();
    // Row 2, last k: +3 more than it was, which changes row 2 of the output wherever B's last
    // column is not zero.
    let last = 2 * 32 + 31;
    bits[last] = OutputDtype::Bf16.round_f32(OutputDtype::Bf16.to_f32(bits[last]) + 3.0);
    let moved = OutTensor::new(OutputDtype::Bf16, [1, 3, 32], bits).unwrap();
    let base = CpuBackend.gemm16_as(&Gemm::new(x, g.b.clone(), None).unwrap(), OutputDtype::F16).unwrap();
    let got = CpuBackend.gemm16_as(&Gemm::new(moved, g.b.clone(), None).unwrap(), OutputDtype::F16).unwrap();
    let b_last: Vec<f32> = (0..4).map(|n| HostActivation::decode_batch(&g.b, 0)[n * 32 + 31]).collect();
    for (n, &w) in b_last.iter().enumerate() {
        let (b0, b1) = (base.to_f32()[2 * 4 + n], got.to_f32()[2 * 4 + n]);
        assert_eq!(b0 != b1, w != 0.0, "column {n}");
        assert_eq!(base.bits()[..8], got.bits()[..8], "rows 0 and 1 unchanged");
    }
    // Shape rules hold for the dense form too: K differs.
    let short = OutTensor::new(OutputDtype::Bf16, [1, 3, 16], vec![0; 48]).unwrap();
    assert!(Gemm::new(short, g.b.clone(), None).is_err());
}
