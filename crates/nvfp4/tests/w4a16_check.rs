//! The W4A16 check (SPEC §8): its reference against hand-worked results, the CPU backend against
//! that reference on every operation, the case list's coverage, and the check failing a backend
//! that is wrong (one element off, alpha ignored, nibbles swapped) or that has no kernel.

use nvfp4::check::compare16::compare16;
use nvfp4::check::reference16::reference16;
use nvfp4::check::w4a16::{case16_problem, cases16, check_w4a16, run_case16, Case16};
use nvfp4::check::Mode;
use nvfp4::format::f32_to_e4m3;
use nvfp4::problem::{Problem16, ProblemKind, Shape, Tier};
use nvfp4::{
    Backend, CpuBackend, DualGemm, Error, Gemm, Gemv, GroupedGemm, MoeGemm, Nvfp4Tensor, OutTensor, OutputDtype,
    ScaleLayout,
};

const BF16: OutputDtype = OutputDtype::Bf16;
const F16: OutputDtype = OutputDtype::F16;

fn dense(dtype: OutputDtype, shape: [usize; 3], vals: &[f32]) -> OutTensor {
    OutTensor::new(dtype, shape, vals.iter().map(|&v| dtype.round_f32(v)).collect()).unwrap()
}

/// A weight `[l, rows, k]` whose every code is `code` and every scale `scale`.
fn weight(l: usize, rows: usize, k: usize, code: u8, scale: f32) -> Nvfp4Tensor {
    let values = vec![code | (code << 4); l * rows * k / 2];
    let scales = vec![f32_to_e4m3(scale); l * rows * k / 16];
    Nvfp4Tensor::new(l, rows, k, values, scales, ScaleLayout::Plain).unwrap()
}

#[test]
fn the_reference_gives_hand_worked_results() {
    // GEMM [1, 2, 32] × [1, 3, 32]: row 0 of A all 1, row 1 all -0.5; weights' codes 2 (1.0),
    // scales 2 and a subnormal 2^-9 for row 2 (code 0x01); global 0.5, alpha 0.25.
    let mut a = vec![1f32; 32];
    a.extend([-0.5f32; 32]);
    let a = dense(BF16, [1, 2, 32], &a);
    let mut b = weight(1, 3, 32, 2, 2.0);
    let mut scales = b.scales().to_vec();
    scales[4] = 0x01;
    scales[5] = 0x01;
    b = Nvfp4Tensor::new(1, 3, 32, b.values().to_vec(), scales, ScaleLayout::Plain).unwrap().with_global_scale(0.5);
    let p = Problem16::Gemm(Gemm::new(a, b, Some(0.25)).unwrap());
    let got = reference16(&p, F16).unwrap()[0].to_f32();
    // Row 0: 32 × 1 × 2 × 0.125 = 8 (rows 0, 1), 32 × 2^-9 × 0.125 = 2^-7 (row 2); row 1: × -0.5.
    assert_eq!(got, [8.0, 8.0, 2f32.powi(-7), -4.0, -4.0, -(2f32.powi(-8))]);

    // GEMV: the matrix rows (codes 0xB: -1.5, scale 1) against a vector of 2s, L = 2.
    let v = dense(F16, [2, 1, 16], &[2.0; 32]);
    let p = Problem16::Gemv(Gemv::new(weight(2, 3, 16, 0xB, 1.0), v, None).unwrap());
    let out = &reference16(&p, BF16).unwrap()[0];
    assert_eq!((out.shape(), out.dtype()), ([2, 3, 1], BF16));
    assert_eq!(out.to_f32(), [-48.0; 6]);

    // Dual GEMM: silu(x1) · x2 with x1 = 16 × 1 × 1 = 16 (codes 2, scale 1), x2 = 16 × 0.5.
    let p = Problem16::DualGemm(
        DualGemm::new(dense(F16, [1, 1, 16], &[1.0; 16]), weight(1, 1, 16, 2, 1.0), weight(1, 1, 16, 1, 1.0), None)
            .unwrap(),
    );
    let x1 = 16f32;
    let want = F16.round_f32(x1 / (1.0 + (-x1).exp()) * 8.0);
    assert_eq!(reference16(&p, F16).unwrap()[0].bits(), [want]);

    // MoE: offsets [0, 2, 2, 3] of T = 4 (expert 0 empty, expert 2 empty), expert e's weight
    // all 1 × (e + 1); row 3 past the last offset stays 0.
    let b = Nvfp4Tensor::new(
        4,
        1,
        16,
        vec![0x22; 4 * 8],
        (0..4).flat_map(|e| [f32_to_e4m3(e as f32 + 1.0)]).collect(),
        ScaleLayout::Plain,
    )
    .unwrap();
    let tokens = dense(BF16, [1, 4, 16], &[1.0; 64]);
    let p = Problem16::Moe(MoeGemm::new(tokens, b, vec![0, 2, 2, 3], None).unwrap());
    assert_eq!(reference16(&p, F16).unwrap()[0].to_f32(), [32.0, 32.0, 64.0, 0.0]);
}

#[test]
fn a_nan_scale_and_an_overflow_keep_their_status() {
    let a = dense(F16, [1, 1, 16], &[60000.0; 16]);
    let mut scales = vec![f32_to_e4m3(1.0); 2];
    scales[1] = 0x7F;
    let b = Nvfp4Tensor::new(1, 2, 16, vec![0x22; 16], scales, ScaleLayout::Plain).unwrap();
    let p = Problem16::Gemm(Gemm::new(a, b, None).unwrap());
    for out in [F16, BF16] {
        let got = reference16(&p, out).unwrap()[0].to_f32();
        // 16 × 60000 overflows f16, not bf16; the NaN scale makes column 1 NaN in both.
        assert_eq!(got[0].is_infinite(), out == F16, "{out}");
        assert!(got[1].is_nan());
        assert!(compare16(
            &p.run_as(&CpuBackend, out).unwrap(),
            &[reference16(&p, out).unwrap()[0].clone()],
            Mode::BitExact
        )
        .passed());
    }
}

#[test]
fn the_cpu_backend_matches_the_checks_reference() {
    // Every operation, both tiers, both types each way, both layouts.
    let shapes = [
        Shape::Gemv { m: 130, k: 48, l: 3 },
        Shape::Gemm { m: 7, n: 40, k: 4112, l: 2 },
        Shape::DualGemm { m: 40, n: 7, k: 256, l: 1 },
        Shape::GroupedGemm { groups: vec![(1, 72, 16), (130, 7, 48)] },
        Shape::Moe { n: 40, k: 48, counts: vec![0, 9, 0, 30] },
    ];
    for (i, shape) in shapes.into_iter().enumerate() {
        for n in 0..8 {
            let act = if n & 1 == 0 { BF16 } else { F16 };
            let out = if n & 2 == 0 { act } else { [F16, BF16][n & 1] };
            let tier = if n & 4 == 0 { Tier::Exact } else { Tier::Random };
            let spec = Case16 {
                label: format!("t:{i}"),
                shape: shape.clone(),
                seed: (i * 8 + n) as u64,
                tier,
                act,
                out,
                layout: if n % 3 == 0 { ScaleLayout::Blocked } else { ScaleLayout::Plain },
                alpha: (n % 3 == 1).then_some(0.5),
                nan_scale: n == 5,
            };
            let report = run_case16(&CpuBackend, &spec).unwrap();
            assert!(report.passed(), "{shape} {spec:?}: {report}");
            assert!(report.elements > 0);
            // The CPU backend and the check's reference share the f64 sums' rounding: equal bits
            // even on random data.
            let p = case16_problem(&spec).unwrap();
            assert_eq!(p.run_as(&CpuBackend, out).unwrap(), reference16(&p, out).unwrap(), "{shape} {spec:?}");
        }
    }
}

#[test]
fn the_cases_cover_every_combination() {
    for kind in ProblemKind::ALL {
        let cases = cases16(kind, 1);
        let tests = cases.iter().filter(|c| c.label.starts_with("test:")).count();
        assert_eq!(tests, nvfp4::problem::test_shapes(kind).len(), "{kind}: every SPEC test shape");
        for tier in Tier::ALL {
            for act in [BF16, F16] {
                for out in [BF16, F16] {
                    for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
                        assert!(
                            cases.iter().any(|c| (c.tier, c.act, c.out, c.layout) == (tier, act, out, layout)),
                            "{kind}: no {tier} {act}->{out} {layout:?} case"
                        );
                    }
                }
            }
        }
        assert!(cases.iter().any(|c| c.alpha.is_some()) && cases.iter().any(|c| c.nan_scale), "{kind}");
        // Exact data is compared bit for bit, except the dual GEMM's (approximate SiLU on GPUs).
        // The gate's slack widens the dual GEMM's random tier only.
        for c in &cases {
            let exact = c.tier == Tier::Exact && kind != ProblemKind::DualGemm;
            assert_eq!(c.mode() == Mode::BitExact, exact, "{kind} {}", c.label);
            let slack = c.tier == Tier::Random && kind == ProblemKind::DualGemm;
            assert_eq!(c.gate_slack(), slack, "{kind} {}", c.label);
        }
        // Exact cases' alphas are powers of two, so their results stay exact.
        assert!(cases.iter().filter(|c| c.tier == Tier::Exact).all(|c| c.alpha.is_none_or(|a| a == 0.5)));
    }
    let gemm = cases16(ProblemKind::Gemm, 1);
    assert!(gemm.iter().any(|c| matches!(c.shape, Shape::Gemm { m: 1, .. })), "GEMM at M = 1");
    let grouped = cases16(ProblemKind::GroupedGemm, 1);
    assert!(grouped.iter().any(|c| matches!(c.shape, Shape::Moe { .. })), "the MoE form");
    let odd = |c: &Case16| matches!(c.shape, Shape::Gemm { k, l, .. } if k % 32 == 16 && l > 1);
    assert!(gemm.iter().any(odd), "K % 32 == 16 with L > 1");
}

/// A backend that is the CPU backend but gets one thing wrong.
struct Faulty(Fault);

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The last element of every output one unit in the last place up.
    LastUlp,
    /// Every output negated past its first row (a sign error in a tile).
    Negated,
    /// Alpha ignored.
    NoAlpha,
    /// No kernel for 16-bit activations.
    Unsupported,
}

impl Faulty {
    fn spoil(&self, t: OutTensor) -> OutTensor {
        let dtype = t.dtype();
        let mut bits = t.bits().to_vec();
        match self.0 {
            Fault::LastUlp => {
                if let Some(b) = bits.last_mut() {
                    *b = b.wrapping_add(1);
                }
            }
            Fault::Negated => bits.iter_mut().skip(t.shape()[2]).for_each(|b| *b ^= 0x8000),
            Fault::NoAlpha | Fault::Unsupported => {}
        }
        OutTensor::new(dtype, t.shape(), bits).unwrap()
    }

    fn run<T: Clone>(
        &self,
        p: &T,
        f: impl Fn(&T) -> nvfp4::Result<OutTensor>,
        strip: impl Fn(&mut T),
    ) -> nvfp4::Result<OutTensor> {
        if let Fault::Unsupported = self.0 {
            return Err(Error::Unsupported { backend: "faulty".into(), what: "W4A16".into() });
        }
        let mut q = p.clone();
        if let Fault::NoAlpha = self.0 {
            strip(&mut q);
        }
        f(&q).map(|t| self.spoil(t))
    }
}

impl Backend for Faulty {
    fn name(&self) -> &'static str {
        "faulty"
    }
    fn gemv_as(&self, p: &Gemv, d: OutputDtype) -> nvfp4::Result<OutTensor> {
        CpuBackend.gemv_as(p, d)
    }
    fn gemm_as(&self, p: &Gemm, d: OutputDtype) -> nvfp4::Result<OutTensor> {
        CpuBackend.gemm_as(p, d)
    }
    fn dual_gemm_as(&self, p: &DualGemm, d: OutputDtype) -> nvfp4::Result<OutTensor> {
        CpuBackend.dual_gemm_as(p, d)
    }
    fn grouped_gemm_as(&self, p: &GroupedGemm, d: OutputDtype) -> nvfp4::Result<Vec<OutTensor>> {
        CpuBackend.grouped_gemm_as(p, d)
    }
    fn moe_gemm_as(&self, p: &MoeGemm, d: OutputDtype) -> nvfp4::Result<OutTensor> {
        CpuBackend.moe_gemm_as(p, d)
    }
    fn gemv16_as(&self, p: &Gemv<OutTensor>, d: OutputDtype) -> nvfp4::Result<OutTensor> {
        self.run(p, |q| CpuBackend.gemv16_as(q, d), |q| q.alpha = None)
    }
    fn gemm16_as(&self, p: &Gemm<OutTensor>, d: OutputDtype) -> nvfp4::Result<OutTensor> {
        self.run(p, |q| CpuBackend.gemm16_as(q, d), |q| q.alpha = None)
    }
    fn dual_gemm16_as(&self, p: &DualGemm<OutTensor>, d: OutputDtype) -> nvfp4::Result<OutTensor> {
        self.run(p, |q| CpuBackend.dual_gemm16_as(q, d), |q| q.alpha = None)
    }
    fn grouped_gemm16_as(&self, p: &GroupedGemm<OutTensor>, d: OutputDtype) -> nvfp4::Result<Vec<OutTensor>> {
        if let Fault::Unsupported = self.0 {
            return Err(Error::Unsupported { backend: "faulty".into(), what: "W4A16".into() });
        }
        let groups = p.groups.iter().map(|g| self.gemm16_as(g, d)).collect::<nvfp4::Result<_>>()?;
        Ok(groups)
    }
    fn moe_gemm16_as(&self, p: &MoeGemm<OutTensor>, d: OutputDtype) -> nvfp4::Result<OutTensor> {
        self.run(p, |q| CpuBackend.moe_gemm16_as(q, d), |q| q.alpha = None.into())
    }
}

#[test]
fn the_check_fails_a_wrong_backend_and_names_a_missing_kernel() {
    let small: Vec<(ProblemKind, Case16)> = ProblemKind::ALL
        .into_iter()
        .flat_map(|k| cases16(k, 1).into_iter().filter(|c| c.label.starts_with("extra:")).take(12).map(move |c| (k, c)))
        .collect();
    for fault in [Fault::LastUlp, Fault::Negated, Fault::NoAlpha] {
        let b = Faulty(fault);
        let mut failed = 0;
        for (kind, c) in &small {
            let r = run_case16(&b, c).unwrap();
            let caught = !r.passed();
            // A one-ulp change escapes the tolerance only; the others fail wherever they change
            // a value (alpha: where a case has one).
            // A NaN scale may make a whole small output NaN, which no change shows.
            let must = !c.nan_scale
                && match fault {
                    Fault::LastUlp => c.mode() == Mode::BitExact,
                    Fault::Negated => c.tier == Tier::Random && !c.shape.outputs().iter().all(|o| o[1] == 1),
                    Fault::NoAlpha => c.alpha.is_some() && c.tier == Tier::Random,
                    Fault::Unsupported => unreachable!(),
                };
            assert!(caught || !must, "{fault:?} passed {kind} {} {}: {r}", c.label, c.shape);
            failed += caught as usize;
        }
        assert!(failed > 0, "{fault:?} never caught");
    }
    // No kernel: every case is an error (the check reports it as a failure, never a skip).
    let verdicts = check_w4a16(&Faulty(Fault::Unsupported), &[ProblemKind::Gemv], 1);
    assert_eq!(verdicts.len(), cases16(ProblemKind::Gemv, 1).len());
    assert!(verdicts.iter().all(|(_, _, v)| matches!(v, Err(Error::Unsupported { .. }))));
}
