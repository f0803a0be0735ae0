//! The grouped GEMM's MoE form on the CPU: `MoeGemm::new` refuses every bad input with a shape
//! error naming the rule; the CPU reference equals per-expert GEMMs of slices cut here by hand
//! (bit-identical, empty experts and rows past the last offset included); the MoE check cases
//! are the ones promised and pass the `check --backend cpu` loop; the shape and file rules.

use half::f16;
use nvfp4::check::{cases, mode_for, run_case, Mode};
use nvfp4::problem::{generate, Rng};
use nvfp4::{
    Backend, CpuBackend, Error, F16Tensor, Gemm, MoeGemm, Nvfp4Tensor, OutTensor, Output, OutputDtype, Problem,
    ProblemKind, ScaleLayout, Shape,
};

/// A plain-scale tensor `[l, rows, k]` of any codes (all 16, -0 included) and scales 1..=3.
fn tensor(rng: &mut Rng, l: usize, rows: usize, k: usize) -> Nvfp4Tensor {
    let values = (0..l * rows * k / 2).map(|_| rng.below(256) as u8).collect();
    // E4M3 1.0, 2.0, 3.0.
    let scales = (0..l * rows * k / 16).map(|_| [0x38, 0x40, 0x44][rng.below(3) as usize]).collect();
    Nvfp4Tensor::new(l, rows, k, values, scales, ScaleLayout::Plain).unwrap()
}

fn assert_shape_err(r: nvfp4::Result<MoeGemm>, needle: &str) {
    match r {
        Err(Error::Shape(msg)) => assert!(msg.contains(needle), "`{needle}` not in `{msg}`"),
        other => panic!("expected a shape error naming `{needle}`, got {other:?}"),
    }
}

#[test]
fn new_rejects_each_bad_input() {
    let mut rng = Rng::new(1);
    let (t, n, k, e) = (10, 8, 32, 3);
    let a = tensor(&mut rng, 1, t, k);
    let b = tensor(&mut rng, e, n, k);
    let new = |a: &Nvfp4Tensor, b: &Nvfp4Tensor, offs: &[i32]| MoeGemm::new(a.clone(), b.clone(), offs.to_vec(), None);
    assert!(new(&a, &b, &[2, 2, 10]).is_ok());
    assert!(new(&a, &b, &[0, 0, 0]).is_ok(), "every expert empty, every row past the last offset");
    assert_shape_err(new(&a, &b, &[2, 10]), "one offset per expert");
    assert_shape_err(new(&a, &b, &[2, 5, 7, 10]), "one offset per expert");
    assert_shape_err(new(&a, &b, &[5, 2, 10]), "must not decrease");
    assert_shape_err(new(&a, &b, &[2, 5, 11]), "outside 0..=10");
    assert_shape_err(new(&a, &b, &[-1, 5, 10]), "outside 0..=10");
    assert_shape_err(new(&a, &tensor(&mut rng, e, n, 48), &[2, 5, 10]), "K = 32 vs 48");
    assert_shape_err(new(&tensor(&mut rng, 2, t, k), &b, &[2, 5, 10]), "L = 2");
    assert!(matches!(MoeGemm::new(a.clone(), b.clone(), vec![2, 5, 10], Some(f32::NAN)), Err(Error::Invalid(_))));
    // The fields are public: helpers re-check instead of slicing out of bounds.
    let mut p = new(&a, &b, &[2, 5, 10]).unwrap();
    p.offsets[1] = 99;
    assert!(matches!(p.expert_rows(), Err(Error::Shape(_))));
    assert!(matches!(p.expert_gemm(0), Err(Error::Shape(_))));
    assert!(matches!(CpuBackend.moe_gemm(&p), Err(Error::Shape(_))));
}

#[test]
fn expert_helpers_refuse_what_they_cannot_do() {
    let mut rng = Rng::new(2);
    let p = MoeGemm::new(tensor(&mut rng, 1, 6, 16), tensor(&mut rng, 3, 4, 16), vec![0, 4, 6], None).unwrap();
    assert_eq!(p.expert_rows().unwrap(), vec![0..0, 0..4, 4..6]);
    assert_eq!(p.routed_experts().unwrap(), vec![1, 2]);
    assert!(matches!(p.expert_gemm(0), Err(Error::Shape(_))), "expert 0 has no tokens");
    assert!(matches!(p.expert_gemm(3), Err(Error::Shape(_))), "no expert 3");
    let out = |rows: usize| OutTensor::from(F16Tensor::new(1, rows, 4, vec![f16::ONE; rows * 4]).unwrap());
    let f16 = OutputDtype::F16;
    assert!(matches!(p.assemble(f16, [(1, out(3))]), Err(Error::Shape(_))), "expert 1 has 4 rows");
    assert!(matches!(p.assemble(f16, [(0, out(1))]), Err(Error::Shape(_))), "expert 0 has no rows");
    assert!(
        matches!(p.assemble(OutputDtype::Bf16, [(2, out(2))]), Err(Error::Shape(_))),
        "an f16 part of a bf16 output"
    );
    let whole = p.assemble(f16, [(2, out(2))]).unwrap();
    assert_eq!((whole.shape(), whole.dtype()), ([1, 6, 4], f16));
    assert!(whole.bits()[..16].iter().all(|&v| v == 0) && whole.bits()[16..].iter().all(|&v| v == f16::ONE.to_bits()));
}

/// Expert e's operands cut out of the raw plain buffers here, not by the library.
fn hand_slices(a: &Nvfp4Tensor, b: &Nvfp4Tensor, rows: std::ops::Range<usize>, e: usize) -> Gemm {
    let (k, n) = (a.k(), b.rows());
    let cut = |t: &Nvfp4Tensor, first: usize, count: usize| {
        let (w, s) = (k / 2, k / 16);
        let values = t.values()[first * w..(first + count) * w].to_vec();
        let scales = t.scales()[first * s..(first + count) * s].to_vec();
        Nvfp4Tensor::new(1, count, k, values, scales, ScaleLayout::Plain).unwrap().with_global_scale(t.global_scale())
    };
    Gemm::new(cut(a, rows.start, rows.len()), cut(b, e * n, n), Some(0.75)).unwrap()
}

#[test]
fn cpu_reference_is_each_experts_gemm_and_zero_past_the_last_offset() {
    let mut rng = Rng::new(3);
    let (t, n, k) = (70, 24, 48);
    // Empty experts at the start (0), in the middle (2) and at the end (5); rows 60..70 are
    // past the last offset.
    let offsets = vec![0, 13, 13, 40, 60, 60];
    let a = tensor(&mut rng, 1, t, k).with_global_scale(0.5);
    let b = tensor(&mut rng, offsets.len(), n, k).with_global_scale(2.0);
    let ranges = [0..0, 0..13, 13..13, 13..40, 40..60, 60..60];
    let mut want = vec![f16::from_bits(0); t * n];
    for (e, rows) in ranges.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
        let part = CpuBackend.gemm(&hand_slices(&a, &b, rows.clone(), e)).unwrap();
        want[rows.start * n..rows.end * n].copy_from_slice(part.data());
    }
    assert!(want[..60 * n].iter().any(|v| v.to_f32() != 0.0), "the data is not all zero");
    let plain = MoeGemm::new(a, b, offsets, Some(0.75)).unwrap();
    for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
        let p = Problem::Moe(plain.clone()).into_layout(layout);
        let Output::Single(got) = p.run(&CpuBackend).unwrap() else { panic!("one output tensor") };
        assert_eq!(got.shape(), [1, t, n]);
        let bits = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(got.data()), bits(&want), "{layout:?}");
    }
}

#[test]
fn every_expert_empty_gives_zeros() {
    let mut rng = Rng::new(4);
    let p = MoeGemm::new(tensor(&mut rng, 1, 5, 16), tensor(&mut rng, 2, 3, 16), vec![0, 0], None).unwrap();
    let got = CpuBackend.moe_gemm(&p).unwrap();
    assert_eq!(got.shape(), [1, 5, 3]);
    assert!(got.data().iter().all(|v| v.to_bits() == 0));
}

fn moe_cases() -> Vec<nvfp4::check::CaseSpec> {
    cases(ProblemKind::GroupedGemm, 1).into_iter().filter(|c| matches!(c.shape, Shape::Moe { .. })).collect()
}

#[test]
fn moe_check_cases_are_the_promised_ones() {
    let specs = moe_cases();
    let counts: Vec<(&[usize], usize, usize)> = specs
        .iter()
        .map(|c| match &c.shape {
            Shape::Moe { n, k, counts } => (&counts[..], *n, *k),
            _ => unreachable!(),
        })
        .collect();
    let has = |what: &str, f: &dyn Fn(&[usize]) -> bool| assert!(counts.iter().any(|c| f(c.0)), "no case with {what}");
    has("one expert holding every token", &|c| c.len() > 1 && c.iter().filter(|&&x| x > 0).count() == 1);
    has("an empty first expert", &|c| c.len() > 1 && c[0] == 0);
    has("an empty last expert", &|c| c.len() > 1 && c[c.len() - 1] == 0);
    has("an empty middle expert", &|c| c.len() > 2 && c[1..c.len() - 1].contains(&0));
    has("E = 1", &|c| c.len() == 1);
    assert!(counts.contains(&(&[80, 176, 128, 72, 64, 248, 96, 160][..], 4096, 512)), "the bench routing");
    for (c, n, k) in &counts[6..] {
        assert!((1..=16).contains(&c.len()) && c.iter().all(|&x| x <= 300), "{c:?}");
        assert!([7, 130, 256, 384].contains(n) && [16, 48, 256, 512].contains(k), "{n} {k}");
    }
    assert!(counts.len() >= 10, "{} MoE cases", counts.len());
    for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
        assert!(specs.iter().any(|c| c.layout == layout), "no {layout:?} MoE case");
    }
    assert!(specs.iter().any(|c| c.alpha.is_some()) && specs.iter().any(|c| c.alpha.is_none()));
    assert_eq!(mode_for(ProblemKind::GroupedGemm), Mode::BitExact);
    assert!(specs.iter().all(|c| c.shape.kind() == ProblemKind::GroupedGemm));
}

#[test]
fn moe_check_cases_pass_on_the_cpu() {
    for spec in moe_cases() {
        let report = run_case(&CpuBackend, &spec).unwrap_or_else(|e| panic!("{} {}: {e}", spec.label, spec.shape));
        assert!(report.passed(), "{} {}: {report}", spec.label, spec.shape);
        let Shape::Moe { n, ref counts, .. } = spec.shape else { unreachable!() };
        assert_eq!(report.elements, counts.iter().sum::<usize>() * n, "{}: one [1, T, N] output", spec.label);
    }
}

#[test]
fn shapes_generate_and_refuse_zero_tokens() {
    let shape = Shape::parse(ProblemKind::GroupedGemm, "moe:3,0,5/7/48").unwrap();
    assert_eq!(shape, Shape::Moe { n: 7, k: 48, counts: vec![3, 0, 5] });
    assert_eq!(shape.to_string(), "moe:3,0,5/7/48");
    assert_eq!(shape.kind(), ProblemKind::GroupedGemm);
    let Problem::Moe(p) = generate(&shape, 9).unwrap() else { panic!("a MoE problem") };
    assert_eq!((p.a.l(), p.a.rows(), p.a.k(), p.b.l(), p.b.rows()), (1, 8, 48, 3, 7));
    assert_eq!(p.offsets, vec![3, 3, 8]);
    assert_eq!(Problem::Moe(p).shape(), shape);
    for bad in ["moe:0,0/7/48", "moe:3/7/40", "moe:3/0/48", "moe:3/7,8/48", "moe:3/7", "moe:/7/48"] {
        assert!(Shape::parse(ProblemKind::GroupedGemm, bad).is_err(), "{bad}");
    }
    for counts in [vec![0, 0, 0], vec![]] {
        let s = Shape::Moe { n: 8, k: 16, counts };
        assert!(matches!(s.validate(), Err(Error::Shape(_))), "{s:?}");
        assert!(matches!(generate(&s, 1), Err(Error::Shape(_))), "{s:?}");
    }
    let huge = Shape::Moe { n: 8, k: 16, counts: vec![usize::MAX, 2] };
    assert!(huge.validate().is_err() && huge.input_bytes(ScaleLayout::Plain).is_none());
}

#[test]
fn the_case_file_format_has_no_moe_form() {
    let shape = Shape::Moe { n: 8, k: 32, counts: vec![4, 0, 4] };
    let p = generate(&shape, 1).unwrap();
    for r in [nvfp4::io::problem_to_bytes(&p).map(|_| ()), nvfp4::io::check_file_form(&shape)] {
        match r {
            Err(Error::Invalid(msg)) => assert!(msg.contains("no MoE form"), "{msg}"),
            other => panic!("expected a typed error, got {other:?}"),
        }
    }
    let path = std::env::temp_dir().join(format!("nvfp4-moe-{}.safetensors", std::process::id()));
    assert!(nvfp4::io::save_problem(&path, &p).is_err());
    assert!(!path.exists(), "nothing written");
    assert!(nvfp4::io::check_file_form(&Shape::GroupedGemm { groups: vec![(4, 8, 32)] }).is_ok());
}

#[test]
fn host_bytes_count_every_row_of_the_output() {
    let mut rng = Rng::new(5);
    let (t, n) = (40, 24);
    let p =
        Problem::Moe(MoeGemm::new(tensor(&mut rng, 1, t, 32), tensor(&mut rng, 2, n, 32), vec![10, 30], None).unwrap());
    // The shape holds the routed rows; the output all T of them.
    assert_eq!(p.shape(), Shape::Moe { n, k: 32, counts: vec![10, 20] });
    struct Other;
    impl Backend for Other {
        fn name(&self) -> &'static str {
            "other"
        }
        fn gemv_as(&self, _: &nvfp4::Gemv, _: OutputDtype) -> nvfp4::Result<OutTensor> {
            unimplemented!()
        }
        fn gemm_as(&self, _: &Gemm, _: OutputDtype) -> nvfp4::Result<OutTensor> {
            unimplemented!()
        }
        fn dual_gemm_as(&self, _: &nvfp4::DualGemm, _: OutputDtype) -> nvfp4::Result<OutTensor> {
            unimplemented!()
        }
        fn grouped_gemm_as(&self, _: &nvfp4::GroupedGemm, _: OutputDtype) -> nvfp4::Result<Vec<OutTensor>> {
            unimplemented!()
        }
        fn moe_gemm_as(&self, _: &MoeGemm, _: OutputDtype) -> nvfp4::Result<OutTensor> {
            unimplemented!()
        }
        fn gemv16_as(&self, _: &nvfp4::Gemv<OutTensor>, _: OutputDtype) -> nvfp4::Result<OutTensor> {
            unimplemented!()
        }
        fn gemm16_as(&self, _: &Gemm<OutTensor>, _: OutputDtype) -> nvfp4::Result<OutTensor> {
            unimplemented!()
        }
        fn dual_gemm16_as(&self, _: &nvfp4::DualGemm<OutTensor>, _: OutputDtype) -> nvfp4::Result<OutTensor> {
            unimplemented!()
        }
        fn grouped_gemm16_as(
            &self,
            _: &nvfp4::GroupedGemm<OutTensor>,
            _: OutputDtype,
        ) -> nvfp4::Result<Vec<OutTensor>> {
            unimplemented!()
        }
        fn moe_gemm16_as(&self, _: &MoeGemm<OutTensor>, _: OutputDtype) -> nvfp4::Result<OutTensor> {
            unimplemented!()
        }
    }
    assert_eq!(p.run_host_bytes(&Other), Some((t * n * 2) as u64));
    assert!(p.run_host_bytes(&CpuBackend).unwrap() > 2 * (t * n * 2) as u64);
    assert_eq!(p.flops(), 2.0 * (30 * n * 32) as f64);
}
