//! The MoE form's per-expert alphas on the CPU: expert e's rows with E factors are bit for bit the
//! rows the scalar path gives with alpha = expert e's factor (W4A4 and W4A16, both output types,
//! both scale layouts, empty experts and rows past the last offset included), E equal factors are
//! the one alpha, and every bad count or value is a typed error naming the rule and the expert;
//! `nvfp4 check` gives half its MoE cases that carry an alpha one per expert, and fails a backend
//! that applies one alpha to every expert.

use nvfp4::check::reference16::reference16;
use nvfp4::check::w4a16::{case16_problem, cases16, run_case16};
use nvfp4::check::{case_problem, cases, expert_alphas, run_case};
use nvfp4::ops::HostActivation;
use nvfp4::problem::{generate, generate16, Problem16, Rng, Tier};
use nvfp4::{
    Backend, CpuBackend, DualGemm, Error, Gemm, Gemv, GroupedGemm, MoeAlpha, MoeGemm, Nvfp4Tensor, OutTensor,
    OutputDtype, Problem, ProblemKind, ScaleLayout, Shape,
};

/// Tokens per expert: empty experts at the start, in the middle and at the end, with 5 rows
/// past the last offset added by [`operands`].
const COUNTS: [usize; 6] = [0, 13, 0, 27, 20, 0];

/// Distinct factors, none a power of two but one, of both signs and 0, one per expert of COUNTS.
const ALPHAS: [f32; 6] = [0.8125, -1.3, 0.0, 3.1e-3, 2.5, 0.7];

fn offsets(counts: &[usize]) -> Vec<i32> {
    counts
        .iter()
        .scan(0, |s, &c| {
            *s += c as i32;
            Some(*s)
        })
        .collect()
}

/// NVFP4 tokens `[1, T + 5, K]` and experts `[E, N, K]` with non-trivial global scales.
fn operands(counts: &[usize], n: usize, k: usize, seed: u64) -> (Nvfp4Tensor, Nvfp4Tensor) {
    let t = counts.iter().sum::<usize>() + 5;
    let Problem::Gemm(g) = generate(&Shape::Gemm { m: t, n: n * counts.len(), k, l: 1 }, seed).unwrap() else {
        panic!("a GEMM")
    };
    let b =
        Nvfp4Tensor::new(counts.len(), n, k, g.b.values().to_vec(), g.b.scales().to_vec(), ScaleLayout::Plain).unwrap();
    (g.a.with_global_scale(0.75), b.with_global_scale(1.5))
}

/// Rows of `whole` `[1, T, N]` in `rows`, as bits.
fn rows(whole: &OutTensor, rows: std::ops::Range<usize>) -> Vec<u16> {
    let n = whole.shape()[2];
    whole.bits()[rows.start * n..rows.end * n].to_vec()
}

/// The per-expert result of `p` against the scalar path run once per expert with that expert's
/// factor, expert by expert; every row past the last offset zero.
fn assert_each_expert_is_the_scalar_path<A: HostActivation + Clone>(
    p: &MoeGemm<A>,
    run: impl Fn(&MoeGemm<A>) -> OutTensor,
    what: &str,
) {
    let got = run(p);
    let ranges = p.expert_rows().unwrap();
    for (e, r) in ranges.iter().enumerate() {
        let scalar = MoeGemm::new(p.a.clone(), p.b.clone(), p.offsets.clone(), p.alpha.of_expert(e).unwrap()).unwrap();
        assert_eq!(rows(&got, r.clone()), rows(&run(&scalar), r.clone()), "{what}: expert {e}");
    }
    let t = got.shape()[1];
    assert!(rows(&got, p.routed_tokens()..t).iter().all(|&x| x == 0), "{what}: rows past the last offset");
    // Distinct factors give distinct rows: the experts' factors were really applied, each its own.
    let one = MoeGemm::new(p.a.clone(), p.b.clone(), p.offsets.clone(), Some(ALPHAS[1])).unwrap();
    let routed = p.routed_tokens();
    assert_ne!(rows(&got, 0..routed), rows(&run(&one), 0..routed), "{what}: not one alpha for all");
}

#[test]
fn w4a4_expert_rows_are_the_scalar_path_with_their_alpha() {
    let (a, b) = operands(&COUNTS, 24, 64, 11);
    for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
        for dtype in [OutputDtype::F16, OutputDtype::Bf16] {
            let p = MoeGemm::new(a.to_layout(layout), b.to_layout(layout), offsets(&COUNTS), ALPHAS.to_vec()).unwrap();
            let run = |q: &MoeGemm| CpuBackend.moe_gemm_as(q, dtype).unwrap();
            assert_each_expert_is_the_scalar_path(&p, run, &format!("W4A4 {layout:?} {dtype}"));
        }
    }
}

#[test]
fn w4a16_expert_rows_are_the_scalar_path_with_their_alpha() {
    let shape = Shape::Moe { n: 40, k: 96, counts: COUNTS.to_vec() };
    for (i, tier) in [Tier::Exact, Tier::Random].into_iter().enumerate() {
        for act in [OutputDtype::Bf16, OutputDtype::F16] {
            let Problem16::Moe(mut p) = generate16(&shape, act, tier, 20 + i as u64).unwrap() else {
                panic!("the MoE form")
            };
            p.alpha = ALPHAS.to_vec().into();
            for dtype in [OutputDtype::F16, OutputDtype::Bf16] {
                let run = |q: &MoeGemm<OutTensor>| CpuBackend.moe_gemm16_as(q, dtype).unwrap();
                assert_each_expert_is_the_scalar_path(&p, run, &format!("W4A16 {tier:?} {act} -> {dtype}"));
                // The check's own reference, written apart from the backend, agrees where the
                // sums are exact in any order.
                if tier == Tier::Exact {
                    let want = reference16(&Problem16::Moe(p.clone()), dtype).unwrap().remove(0);
                    assert_eq!(run(&p).bits(), want.bits(), "W4A16 {act} -> {dtype}: reference16");
                }
            }
        }
    }
}

#[test]
fn equal_factors_are_the_one_alpha() {
    let (a, b) = operands(&COUNTS, 16, 48, 12);
    let one = MoeGemm::new(a.clone(), b.clone(), offsets(&COUNTS), Some(-0.3)).unwrap();
    let per = MoeGemm::new(a, b, offsets(&COUNTS), vec![-0.3; COUNTS.len()]).unwrap();
    assert_eq!(CpuBackend.moe_gemm(&per).unwrap().data(), CpuBackend.moe_gemm(&one).unwrap().data());
    // The problem's own setter, and one alpha set back over per-expert ones.
    let mut p = Problem::Moe(one.clone());
    p.set_moe_alpha(vec![-0.3; COUNTS.len()].into()).unwrap();
    assert_eq!(p.run(&CpuBackend).unwrap(), Problem::Moe(one.clone()).run(&CpuBackend).unwrap());
    p.set_alpha(Some(2.0)).unwrap();
    let Problem::Moe(m) = &p else { panic!("still the MoE form") };
    assert_eq!(m.alpha, MoeAlpha::One(Some(2.0)));
}

fn refused(r: nvfp4::Result<MoeGemm>, shape: bool, needles: &[&str]) {
    let msg = match (r, shape) {
        (Err(Error::Shape(m)), true) | (Err(Error::Invalid(m)), false) => m,
        (other, _) => {
            panic!("expected a {} error naming {needles:?}, got {other:?}", if shape { "shape" } else { "value" })
        }
    };
    for n in needles {
        assert!(msg.contains(n), "`{n}` not in `{msg}`");
    }
}

#[test]
fn bad_counts_and_values_are_typed_errors_naming_the_expert() {
    let counts = [3, 0, 5];
    let (a, b) = operands(&counts, 8, 32, 13);
    let new = |alphas: Vec<f32>| MoeGemm::new(a.clone(), b.clone(), offsets(&counts), alphas);
    assert!(new(vec![1.0, 0.0, -2.0]).is_ok(), "any sign and 0 are allowed");
    refused(new(vec![1.0, 2.0]), true, &["2 alphas for E = 3 experts"]);
    refused(new(vec![1.0; 4]), true, &["4 alphas for E = 3 experts"]);
    refused(new(vec![]), true, &["0 alphas for E = 3 experts"]);
    // Non-finite factors, as the scalar alpha refuses them, naming the expert.
    refused(new(vec![1.0, f32::NAN, 1.0]), false, &["expert 1", "alpha must be finite", "NaN"]);
    refused(new(vec![1.0, 1.0, f32::NEG_INFINITY]), false, &["expert 2", "finite"]);
    // The factor with the global scales (0.75 and 1.5 here) overflows f32, or (with a tiny
    // weight scale) rounds to 0 where the alpha is not 0.
    refused(new(vec![1.0, 1.0, f32::MAX]), false, &["expert 2", "overflows"]);
    let tiny = b.clone().with_global_scale(2f32.powi(-20));
    let small = |alphas: Vec<f32>| MoeGemm::new(a.clone(), tiny.clone(), offsets(&counts), alphas);
    refused(small(vec![1e-40, 1.0, 1.0]), false, &["expert 0", "rounds to 0"]);
    assert!(small(vec![0.0, 1.0, 1.0]).is_ok(), "alpha 0 makes a factor of 0 on purpose");
    // An expert without tokens follows the rules too: its factor is the operation's.
    refused(new(vec![1.0, f32::INFINITY, 1.0]), false, &["expert 1"]);

    // The fields are public: a changed alpha is refused where it is used, not panicked on.
    let mut p = new(vec![1.0, 1.0, 1.0]).unwrap();
    p.alpha = vec![1.0].into();
    assert!(matches!(CpuBackend.moe_gemm(&p), Err(Error::Shape(_))));
    assert!(matches!(p.expert_gemm(2), Err(Error::Shape(_))), "no alpha for expert 2");
    p.alpha = vec![1.0, 1.0, f32::NAN].into();
    assert!(matches!(CpuBackend.moe_gemm(&p), Err(Error::Invalid(_))));

    // The problems' setter refuses as the constructor does and leaves the problem as it was; the
    // other operations have no experts.
    let good = new(vec![0.5, 1.0, 2.0]).unwrap();
    let mut prob = Problem::Moe(good.clone());
    assert!(matches!(prob.set_moe_alpha(vec![1.0; 2].into()), Err(Error::Shape(_))));
    assert!(matches!(prob.set_moe_alpha(vec![f32::NAN; 3].into()), Err(Error::Invalid(_))));
    assert_eq!(prob, Problem::Moe(good));
    let mut gemm = generate(&Shape::Gemm { m: 4, n: 8, k: 32, l: 1 }, 1).unwrap();
    assert!(matches!(gemm.set_moe_alpha(vec![1.0].into()), Err(Error::Invalid(m)) if m.contains("no experts")));
}

/// Random routings and factors: the per-expert result is each expert's scalar run, on shapes
/// the hand-picked case does not cover (E = 1, many experts, every expert empty but one).
#[test]
fn random_routings_follow_the_scalar_path() {
    let mut rng = Rng::new(0x0061_6c70_6861);
    for case in 0..6 {
        let e = 1 + rng.below(9) as usize;
        let mut counts: Vec<usize> =
            (0..e).map(|_| if rng.below(3) == 0 { 0 } else { rng.below(40) as usize }).collect();
        counts[rng.below(e as u32) as usize] += 1; // at least one token
        let alphas: Vec<f32> = (0..e).map(|_| (rng.below(2001) as f32 - 1000.0) / 337.0).collect();
        let (a, b) = operands(&counts, 8 + 8 * rng.below(4) as usize, 32 * (1 + rng.below(3) as usize), 30 + case);
        let p = MoeGemm::new(a, b, offsets(&counts), alphas.clone()).unwrap();
        let got = CpuBackend.moe_gemm(&p).unwrap();
        let got = OutTensor::from(got);
        for (x, r) in p.expert_rows().unwrap().into_iter().enumerate() {
            let scalar = MoeGemm::new(p.a.clone(), p.b.clone(), p.offsets.clone(), Some(alphas[x])).unwrap();
            let want = OutTensor::from(CpuBackend.moe_gemm(&scalar).unwrap());
            assert_eq!(rows(&got, r.clone()), rows(&want, r), "case {case} {counts:?} expert {x}");
        }
    }
}

/// The CPU reference, except that the MoE form applies expert 0's alpha to every expert: what a
/// kernel that read one alpha would compute.
struct OneAlpha;

fn first_alpha<A: Clone>(p: &MoeGemm<A>) -> MoeGemm<A> {
    MoeGemm { alpha: MoeAlpha::One(p.alpha.of_expert(0).unwrap()), ..p.clone() }
}

impl Backend for OneAlpha {
    fn name(&self) -> &'static str {
        "one alpha"
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
        CpuBackend.moe_gemm_as(&first_alpha(p), d)
    }
    fn gemv16_as(&self, p: &Gemv<OutTensor>, d: OutputDtype) -> nvfp4::Result<OutTensor> {
        CpuBackend.gemv16_as(p, d)
    }
    fn gemm16_as(&self, p: &Gemm<OutTensor>, d: OutputDtype) -> nvfp4::Result<OutTensor> {
        CpuBackend.gemm16_as(p, d)
    }
    fn dual_gemm16_as(&self, p: &DualGemm<OutTensor>, d: OutputDtype) -> nvfp4::Result<OutTensor> {
        CpuBackend.dual_gemm16_as(p, d)
    }
    fn grouped_gemm16_as(&self, p: &GroupedGemm<OutTensor>, d: OutputDtype) -> nvfp4::Result<Vec<OutTensor>> {
        CpuBackend.grouped_gemm16_as(p, d)
    }
    fn moe_gemm16_as(&self, p: &MoeGemm<OutTensor>, d: OutputDtype) -> nvfp4::Result<OutTensor> {
        CpuBackend.moe_gemm16_as(&first_alpha(p), d)
    }
}

/// The factors the check promises a MoE case with alpha `a` and `e` experts: for an even `e`,
/// half, one and two times `a`, repeating; for an odd `e`, the one alpha.
fn promised(a: f32, e: usize) -> MoeAlpha {
    if e % 2 == 1 {
        return MoeAlpha::One(Some(a));
    }
    MoeAlpha::PerExpert([0.5 * a, a, 2.0 * a].into_iter().cycle().take(e).collect())
}

#[test]
fn check_moe_cases_with_an_alpha_give_one_per_expert_in_half() {
    let specs: Vec<_> = cases(ProblemKind::GroupedGemm, 1)
        .into_iter()
        .filter(|c| matches!(c.shape, Shape::Moe { .. }) && c.alpha.is_some())
        .collect();
    let (mut per, mut caught) = (0, 0);
    for spec in &specs {
        let Problem::Moe(p) = case_problem(spec).unwrap() else { panic!("{}: the MoE form", spec.label) };
        let want = promised(spec.alpha.unwrap(), p.experts());
        assert_eq!(p.alpha, want, "{}", spec.label);
        if let MoeAlpha::PerExpert(v) = &want {
            assert_eq!(expert_alphas(&spec.shape, spec.alpha).as_ref(), Some(v));
            per += 1;
        }
        assert!(run_case(&CpuBackend, spec).unwrap().passed(), "{}", spec.label);
        caught += usize::from(!run_case(&OneAlpha, spec).unwrap().passed());
    }
    assert!(per > 0 && per < specs.len(), "{per} of {} W4A4 MoE cases with an alpha per expert", specs.len());
    assert!(caught > 0, "no MoE case fails a backend that applies one alpha to every expert");
    // Other operations, and cases without an alpha, keep the one alpha.
    assert_eq!(expert_alphas(&Shape::Gemm { m: 1, n: 8, k: 16, l: 1 }, Some(0.5)), None);
    assert_eq!(expert_alphas(&Shape::Moe { n: 8, k: 16, counts: vec![1, 2] }, None), None);

    let specs16: Vec<_> = cases16(ProblemKind::GroupedGemm, 1)
        .into_iter()
        .filter(|c| matches!(c.shape, Shape::Moe { .. }) && c.alpha.is_some())
        .collect();
    let (mut per, mut caught) = (0, 0);
    for spec in &specs16 {
        let Problem16::Moe(p) = case16_problem(spec).unwrap() else { panic!("{}: the MoE form", spec.label) };
        let want = promised(spec.alpha.unwrap(), p.experts());
        per += usize::from(matches!(want, MoeAlpha::PerExpert(_)));
        assert_eq!(p.alpha, want, "{}", spec.label);
        assert!(run_case16(&CpuBackend, spec).unwrap().passed(), "{}", spec.label);
        caught += usize::from(!run_case16(&OneAlpha, spec).unwrap().passed());
    }
    assert!(per > 0 && per < specs16.len(), "{per} of {} W4A16 MoE cases with an alpha per expert", specs16.len());
    assert!(caught > 0, "no W4A16 MoE case fails a backend that applies one alpha to every expert");
}
