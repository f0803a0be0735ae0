//! One rule for an operation's FP32 scalars, the same from every door: a global scale is finite
//! and > 0 (case files, checkpoints, the operations' constructors); alpha is finite, and a
//! non-zero alpha given wider than f32 must not round to 0 or overflow; the factor
//! alpha × global(A) × global(B) must be finite (an infinite one makes exact zeros NaN) and not
//! round to 0 unless a factor is 0.

use std::collections::BTreeMap;

use nvfp4::io::{problem_from_bytes, problem_to_bytes, weight_from_bytes};
use nvfp4::ops::{alpha_from_f64, check_global_scale, parse_alpha};
use nvfp4::problem::generate;
use nvfp4::{Backend, CpuBackend, DualGemm, Error, Gemm, Gemv, GroupedGemm, MoeGemm, Nvfp4Tensor, Problem};
use nvfp4::{ProblemKind, ScaleLayout, Shape};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

/// Bad global scales: zero of both signs, negative, non-finite.
const BAD_GLOBALS: [f32; 6] = [0.0, -0.0, -2.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY];

fn gemm() -> Gemm {
    match generate(&Shape::Gemm { m: 8, n: 4, k: 32, l: 1 }, 1).unwrap() {
        Problem::Gemm(g) => g,
        _ => unreachable!(),
    }
}

/// A 1x1x16 tensor whose one element is `value_code` (E2M1) times scale 1.0, global `g`.
fn one(value_code: u8, g: f32) -> Nvfp4Tensor {
    let mut values = vec![0u8; 8];
    values[0] = value_code;
    Nvfp4Tensor::new(1, 1, 16, values, vec![0x38], ScaleLayout::Plain).unwrap().with_global_scale(g)
}

/// The case file of `p` with F32 scalars set (or added) by name.
fn with_scalars(p: &Problem, scalars: &[(&str, f32)]) -> Vec<u8> {
    let bytes = problem_to_bytes(p).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> =
        st.tensors().into_iter().map(|(name, v)| (name, (v.dtype(), v.shape().to_vec(), v.data().to_vec()))).collect();
    for (name, v) in scalars {
        owned.insert(name.to_string(), (Dtype::F32, vec![], v.to_le_bytes().to_vec()));
    }
    let views: Vec<(String, TensorView)> =
        owned.iter().map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    let meta = [(nvfp4::io::PROBLEM_KEY.to_string(), p.kind().name().to_string())].into();
    safetensors::serialize(views, Some(meta)).unwrap()
}

#[track_caller]
fn refused<T: std::fmt::Debug>(r: nvfp4::Result<T>, needles: &[&str]) -> String {
    let msg = match r {
        Err(e) => e.to_string(),
        Ok(v) => panic!("expected a refusal naming {needles:?}, got {v:?}"),
    };
    for n in needles {
        assert!(msg.contains(n), "`{n}` not in: {msg}");
    }
    msg
}

#[test]
fn the_global_scale_rule() {
    for g in BAD_GLOBALS {
        refused(check_global_scale(g), &["finite and > 0"]);
    }
    for g in [f32::from_bits(1), 1e-30, 0.5, 1.0, 3e38, f32::MAX] {
        assert_eq!(check_global_scale(g).unwrap().to_bits(), g.to_bits());
    }
}

#[test]
fn case_files_and_checkpoints_share_the_global_scale_rule() {
    let p = Problem::Gemm(gemm());
    for g in BAD_GLOBALS {
        for name in ["a_global_scale", "b_global_scale"] {
            let r = problem_from_bytes(&with_scalars(&p, &[(name, g)]), ProblemKind::Gemm);
            let msg = refused(r, &["finite and > 0"]);
            assert!(msg.contains(name), "{msg}");
        }
        let t = gemm().b;
        let views = [
            ("weight", TensorView::new(Dtype::U8, vec![4, 16], t.values()).unwrap()),
            ("weight_scale", TensorView::new(Dtype::F8_E4M3, vec![4, 2], t.scales()).unwrap()),
        ];
        let gb = g.to_le_bytes();
        let scalar = TensorView::new(Dtype::F32, vec![], &gb).unwrap();
        let mut all: Vec<(&str, TensorView)> = views.into_iter().collect();
        all.push(("weight_scale_2", scalar));
        let bytes = safetensors::serialize(all, None).unwrap();
        refused(weight_from_bytes(&bytes, ""), &["weight_scale_2", "finite and > 0"]);
    }
    // A positive global scale reads back as written.
    let back = problem_from_bytes(&with_scalars(&p, &[("a_global_scale", 0.25)]), ProblemKind::Gemm).unwrap();
    let Problem::Gemm(g) = back else { unreachable!() };
    assert_eq!(g.a.global_scale(), 0.25);
}

#[test]
fn every_constructor_refuses_a_bad_global_scale() {
    let g = gemm();
    let b1 = || Nvfp4Tensor::new(1, 4, 32, g.b.values().to_vec(), g.b.scales().to_vec(), ScaleLayout::Plain).unwrap();
    let row = || Nvfp4Tensor::new(1, 1, 32, g.b.values()[..16].to_vec(), g.b.scales()[..2].to_vec(), g.b.layout());
    for bad in BAD_GLOBALS {
        refused(Gemm::new(g.a.clone().with_global_scale(bad), g.b.clone(), None), &["global scale", "> 0"]);
        refused(Gemm::new(g.a.clone(), g.b.clone().with_global_scale(bad), None), &["global scale", "> 0"]);
        refused(Gemv::new(g.a.clone(), row().unwrap().with_global_scale(bad), None), &["> 0"]);
        refused(DualGemm::new(g.a.clone(), b1(), b1().with_global_scale(bad), None), &["> 0"]);
        refused(MoeGemm::new(g.a.clone(), g.b.clone().with_global_scale(bad), vec![8], None), &["> 0"]);
        // The fields are public: the grouped GEMM checks its groups again.
        let mut group = g.clone();
        group.b = group.b.with_global_scale(bad);
        refused(GroupedGemm::new(vec![g.clone(), group]), &["group 1", "> 0"]);
    }
}

#[test]
fn an_overflowing_factor_is_refused_not_turned_into_nan() {
    // Today's failure: both global scales 3e38 (each finite) make the factor inf, and an output
    // whose exact value is 0 comes out NaN (0 × inf).
    let p = Problem::Gemm(gemm());
    let big = [("a_global_scale", 3e38f32), ("b_global_scale", 3e38)];
    let r = problem_from_bytes(&with_scalars(&p, &big), ProblemKind::Gemm);
    refused(r, &["overflows", "3e38"]);
    // alpha × global(A) overflows although each is finite; so does the dual GEMM's second factor.
    refused(Gemm::new(one(2, 2.0), one(2, 1.0), Some(f32::MAX)), &["overflows"]);
    refused(DualGemm::new(one(2, 2e20), one(2, 1.0), one(2, 2e20), None), &["b2", "overflows"]);
    refused(MoeGemm::new(one(2, 2e20), one(2, 2e20), vec![1], Some(1.0)), &["overflows"]);
    let mut p = Problem::Gemm(Gemm::new(one(2, 2e20), one(2, 1e10), None).unwrap());
    refused(p.set_alpha(Some(1e10)), &["overflows"]);
    // The largest factor accepted still gives no NaN: an exact zero stays zero.
    let zero = Gemm::new(one(0, 2e19), one(0, 1e19), Some(1.0)).unwrap();
    assert_eq!(CpuBackend.gemm(&zero).unwrap().data()[0].to_bits(), 0);
}

#[test]
fn a_factor_that_rounds_to_zero_is_refused_unless_a_factor_is_zero() {
    refused(Gemm::new(one(2, 1e-30), one(2, 1e-30), None), &["rounds to 0"]);
    refused(Gemm::new(one(2, 1.0), one(2, 1e-30), Some(1e-30)), &["rounds to 0"]);
    // An explicit alpha of 0 is a request, not an underflow.
    let g = Gemm::new(one(2, 1.0), one(2, 1.0), Some(0.0)).unwrap();
    assert_eq!(CpuBackend.gemm(&g).unwrap().data()[0].to_bits(), 0);
}

#[test]
fn alpha_given_wider_than_f32() {
    for (x, needle) in [
        (1e-46, "rounds to 0"),
        (1e-50, "rounds to 0"),
        (-1e-300, "rounds to 0"),
        (1e39, "overflows"),
        (-3.5e38, "overflows"),
        (f64::NAN, "finite"),
        (f64::INFINITY, "finite"),
    ] {
        refused(alpha_from_f64(x), &[needle]);
    }
    for (x, want) in [(0.0, 0.0f32), (-0.5, -0.5), (1e-45, f32::from_bits(1)), (f32::MAX as f64, f32::MAX)] {
        assert_eq!(alpha_from_f64(x).unwrap().to_bits(), want.to_bits(), "{x}");
    }
    assert_eq!(alpha_from_f64(-0.0).unwrap().to_bits(), (-0.0f32).to_bits());
    for (s, needle) in [("1e-46", "rounds to 0"), ("1e-400", "rounds to 0"), ("1e39", "overflows"), ("nan", "finite")] {
        refused(parse_alpha(s), &[needle]);
    }
    assert!(matches!(parse_alpha("two"), Err(Error::Invalid(m)) if m.contains("`two` is not a number")));
    for (s, want) in [("0", 0.0f32), ("0e-400", 0.0), ("-0.5", -0.5), ("0.375", 0.375), ("1e-45", f32::from_bits(1))] {
        assert_eq!(parse_alpha(s).unwrap().to_bits(), want.to_bits(), "{s}");
    }
}

#[test]
fn the_reference_checks_again_what_public_fields_may_have_changed() {
    let mut g = gemm();
    g.alpha = Some(f32::INFINITY);
    refused(CpuBackend.gemm(&g), &["finite"]);
    let mut g = gemm();
    g.a = g.a.with_global_scale(3e38);
    g.b = g.b.with_global_scale(3e38);
    refused(CpuBackend.gemm(&g), &["overflows"]);
    let Problem::DualGemm(mut d) = generate(&Shape::DualGemm { m: 4, n: 4, k: 32, l: 1 }, 1).unwrap() else {
        unreachable!()
    };
    d.b2 = d.b2.with_global_scale(-1.0);
    refused(CpuBackend.dual_gemm(&d), &["b2", "> 0"]);
    let mut grouped = GroupedGemm::new(vec![gemm(), gemm()]).unwrap();
    grouped.groups[1].alpha = Some(f32::NAN);
    refused(CpuBackend.grouped_gemm(&grouped), &["finite"]);
}
