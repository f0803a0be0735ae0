//! safetensors io: case-file and output round trips, every malformed-file error, checkpoint
//! weights in both conventions, and `quantize_file`.
//!
//! Expected values are computed here from first principles (own E2M1/E4M3 decoders, own blocked
//! offset formula), never taken from a previous run.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use nvfp4::io::{
    load_compressed_tensors_weight, load_modelopt_weight, load_output, load_problem, load_weight, output_from_bytes,
    output_to_bytes, problem_from_bytes, problem_to_bytes, quantize_file, save_output, save_problem,
    stored_problem_kind, weight_from_bytes, QuantizeOptions, SkipReason, WeightConvention, PROBLEM_KEY,
};
use nvfp4::problem::{generate, Rng};
use nvfp4::{CpuBackend, Error, Nvfp4Tensor, Output, Problem, ProblemKind, ScaleLayout, Shape};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

// ---------------------------------------------------------------------------------------------
// helpers

/// A fresh path under cargo's per-target temp folder.
fn tmp(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("io-{}-{name}.safetensors", std::process::id()))
}

/// One tensor of a hand-written file: dtype, shape, bytes.
type Raw = (Dtype, Vec<usize>, Vec<u8>);

/// Serializes `tensors` (bytes must match dtype x shape) with optional header metadata.
fn build(tensors: &BTreeMap<String, Raw>, meta: Option<HashMap<String, String>>) -> Vec<u8> {
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).expect("test tensor bytes match shape")))
        .collect();
    safetensors::serialize(views, meta).expect("serialize")
}

/// Every tensor and the metadata of a file.
fn parse(bytes: &[u8]) -> (BTreeMap<String, Raw>, Option<HashMap<String, String>>) {
    let st = SafeTensors::deserialize(bytes).expect("valid file");
    let map = st.tensors().into_iter().map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec()))).collect();
    let (_, meta) = SafeTensors::read_metadata(bytes).expect("valid header");
    (map, meta.metadata().clone())
}

/// Rewrites a file's tensors with `f` (metadata kept).
fn edit(bytes: &[u8], f: impl FnOnce(&mut BTreeMap<String, Raw>)) -> Vec<u8> {
    let (mut map, meta) = parse(bytes);
    f(&mut map);
    build(&map, meta)
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Asserts `r` is `Error::Tensor` about `name`, whose message contains every one of `needles`.
#[track_caller]
fn assert_tensor_err<T: std::fmt::Debug>(r: nvfp4::Result<T>, name: &str, needles: &[&str]) {
    match r {
        Err(Error::Tensor { name: got, msg }) => {
            assert_eq!(got, name, "error names the wrong tensor: {msg}");
            for n in needles {
                assert!(msg.contains(n), "message `{msg}` lacks `{n}`");
            }
            let shown = format!("{}", Error::Tensor { name: got.clone(), msg: msg.clone() });
            assert!(shown.contains(name), "Display `{shown}` does not name `{name}`");
        }
        other => panic!("expected Error::Tensor naming `{name}`, got {other:?}"),
    }
}

#[track_caller]
fn assert_file_err<T: std::fmt::Debug>(r: nvfp4::Result<T>) {
    assert!(matches!(r, Err(Error::File { .. })), "expected Error::File, got {r:?}");
}

/// Small shapes of every kind: rows past one 128-row tile and K not a multiple of 64, so blocked
/// scales have padding; L = 2 where the kind allows it.
fn small_shape(kind: ProblemKind) -> Shape {
    match kind {
        ProblemKind::Gemv => Shape::Gemv { m: 130, k: 96, l: 2 },
        ProblemKind::Gemm => Shape::Gemm { m: 40, n: 130, k: 80, l: 2 },
        ProblemKind::DualGemm => Shape::DualGemm { m: 33, n: 20, k: 64, l: 2 },
        ProblemKind::GroupedGemm => Shape::GroupedGemm { groups: vec![(40, 24, 64), (72, 130, 32), (8, 8, 16)] },
    }
}

fn with_alpha(p: Problem, alpha: Option<f32>) -> Problem {
    match p {
        Problem::Gemv(mut g) => {
            g.alpha = alpha;
            Problem::Gemv(g)
        }
        Problem::Gemm(mut g) => {
            g.alpha = alpha;
            Problem::Gemm(g)
        }
        Problem::DualGemm(mut g) => {
            g.alpha = alpha;
            Problem::DualGemm(g)
        }
        Problem::GroupedGemm(mut g) => {
            for (i, x) in g.groups.iter_mut().enumerate() {
                x.alpha = alpha.map(|a| a * (i + 1) as f32);
            }
            Problem::GroupedGemm(g)
        }
        Problem::Moe(mut g) => {
            g.alpha = alpha.into();
            Problem::Moe(g)
        }
    }
}

fn gemm_bytes() -> Vec<u8> {
    let p = generate(&Shape::Gemm { m: 40, n: 24, k: 64, l: 1 }, 7).unwrap();
    problem_to_bytes(&p).unwrap()
}

/// E2M1 decode, written independently of the library.
fn e2m1(code: u8) -> f32 {
    let mag = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][(code & 7) as usize];
    if code & 8 != 0 {
        -mag
    } else {
        mag
    }
}

/// E4M3 decode of a finite code, written independently of the library.
fn e4m3(code: u8) -> f32 {
    let (e, m) = (((code >> 3) & 15) as i32, (code & 7) as f32);
    let mag = if e == 0 { m / 8.0 * 2f32.powi(-6) } else { (1.0 + m / 8.0) * 2f32.powi(e - 7) };
    if code & 0x80 != 0 {
        -mag
    } else {
        mag
    }
}

/// Dequantized `[N, K]` from packed `[N, K/2]`, plain scales `[N, K/16]` and a global scale,
/// multiplied in the order (e2m1 * e4m3) * global.
fn expected_dequant(values: &[u8], scales: &[u8], n: usize, k: usize, global: f32) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * k);
    for r in 0..n {
        for c in 0..k {
            let byte = values[r * k / 2 + c / 2];
            let nib = if c.is_multiple_of(2) { byte & 0xF } else { byte >> 4 };
            out.push(e2m1(nib) * e4m3(scales[r * k / 16 + c / 16]) * global);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// case files: round trips

#[test]
fn every_kind_round_trips_in_both_layouts_with_and_without_alpha() {
    for kind in ProblemKind::ALL {
        let base = generate(&small_shape(kind), 11).unwrap();
        for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
            for alpha in [None, Some(0.375f32)] {
                let p = with_alpha(base.with_layout(layout), alpha);
                let bytes = problem_to_bytes(&p).unwrap();
                let back = problem_from_bytes(&bytes, kind).unwrap();
                assert_eq!(back, p, "{kind} {layout:?} alpha {alpha:?}");

                let (map, meta) = parse(&bytes);
                assert_eq!(meta.unwrap().get(PROBLEM_KEY).map(String::as_str), Some(kind.name()));
                let (sfa, other) = match layout {
                    ScaleLayout::Plain => ("sfa", "sfa_blocked"),
                    ScaleLayout::Blocked => ("sfa_blocked", "sfa"),
                };
                let suffix = if kind == ProblemKind::GroupedGemm { "_g0" } else { "" };
                assert!(map.contains_key(&format!("{sfa}{suffix}")), "{kind}: {sfa}{suffix} written");
                assert!(!map.contains_key(&format!("{other}{suffix}")), "{kind}: {other}{suffix} not written");
                let alpha_name = format!("alpha{suffix}");
                assert_eq!(map.contains_key(&alpha_name), alpha.is_some(), "{kind}: {alpha_name}");
            }
        }
    }
}

#[test]
fn path_round_trip_and_stored_kind() {
    for kind in ProblemKind::ALL {
        let p = with_alpha(generate(&small_shape(kind), 3).unwrap(), Some(2.5));
        let path = tmp(&format!("case-{kind}"));
        save_problem(&path, &p).unwrap();
        assert_eq!(load_problem(&path, kind).unwrap(), p);
        assert_eq!(stored_problem_kind(&path).unwrap(), Some(kind));
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn physical_shapes_follow_spec_section_2() {
    // GEMV: a [L, M, K/2], b [L, 1, K/2], sfa [L, M, K/16]; blocked [L, R, C, 512].
    let p = generate(&Shape::Gemv { m: 130, k: 96, l: 2 }, 1).unwrap();
    let (map, _) = parse(&problem_to_bytes(&p).unwrap());
    let shape = |n: &str| map[n].1.clone();
    assert_eq!((map["a"].0, shape("a")), (Dtype::U8, vec![2, 130, 48]));
    assert_eq!((map["b"].0, shape("b")), (Dtype::U8, vec![2, 1, 48]));
    assert_eq!((map["sfa"].0, shape("sfa")), (Dtype::F8_E4M3, vec![2, 130, 6]));
    assert_eq!(shape("sfb"), vec![2, 1, 6]);
    let (map, _) = parse(&problem_to_bytes(&p.with_layout(ScaleLayout::Blocked)).unwrap());
    assert_eq!(map["sfa_blocked"].1, vec![2, 2, 2, 512]);
    assert_eq!(map["sfb_blocked"].1, vec![2, 1, 2, 512]);
}

#[test]
fn blocked_bytes_in_the_file_sit_at_the_spec_offsets() {
    let (m, k, l) = (130usize, 96usize, 2usize);
    let p = generate(&Shape::Gemm { m, n: 8, k, l }, 5).unwrap();
    let Problem::Gemm(g) = &p else { unreachable!() };
    let plain = g.a.scales().to_vec();
    let (map, _) = parse(&problem_to_bytes(&p.with_layout(ScaleLayout::Blocked)).unwrap());
    let blocked = &map["sfa_blocked"].2;
    let sf = k / 16;
    let (r, c) = (m.div_ceil(128), sf.div_ceil(4));
    assert_eq!(blocked.len(), l * r * c * 512);
    let off = |i: usize, j: usize, b: usize| {
        b * (r * c * 512) + (i / 128) * (c * 512) + (j / 4) * 512 + (i % 32) * 16 + ((i % 128) / 32) * 4 + (j % 4)
    };
    for b in 0..l {
        for i in [0, 1, 31, 32, 33, 127, 128, 129] {
            for j in 0..sf {
                assert_eq!(blocked[off(i, j, b)], plain[(b * m + i) * sf + j], "b {b} row {i} col {j}");
            }
        }
    }
    // Padding (rows 130..256 of the second tile, column 6..8) is zero when we write it.
    assert_eq!(blocked[off(200, 0, 0)], 0);
    assert_eq!(blocked[off(0, 7, 1)], 0);
}

#[test]
fn mixed_layouts_and_global_scales_round_trip() {
    let p = generate(&Shape::DualGemm { m: 20, n: 12, k: 48, l: 1 }, 9).unwrap();
    let Problem::DualGemm(mut d) = p else { unreachable!() };
    d.b1 = d.b1.to_layout(ScaleLayout::Blocked).with_global_scale(0.125);
    d.a = d.a.with_global_scale(3.0);
    let p = Problem::DualGemm(d);
    let bytes = problem_to_bytes(&p).unwrap();
    assert_eq!(problem_from_bytes(&bytes, ProblemKind::DualGemm).unwrap(), p);
    let (map, _) = parse(&bytes);
    assert!(map.contains_key("sfa") && map.contains_key("sfb1_blocked") && map.contains_key("sfb2"));
    assert!(map.contains_key("a_global_scale") && map.contains_key("b1_global_scale"));
    assert!(!map.contains_key("b2_global_scale"), "a global scale of 1.0 is not written");
}

#[test]
fn both_scale_layouts_for_one_operand_are_refused() {
    // Plain scales in the file, plus a blocked copy of other bytes: which one is meant is unknown.
    let p = generate(&Shape::Gemm { m: 40, n: 24, k: 64, l: 1 }, 7).unwrap();
    let bytes = edit(&problem_to_bytes(&p).unwrap(), |m| {
        m.insert("sfb_blocked".into(), (Dtype::F8_E4M3, vec![1, 1, 1, 512], vec![0x7E; 512]));
    });
    assert_tensor_err(problem_from_bytes(&bytes, ProblemKind::Gemm), "sfb_blocked", &["`sfb`", "one scale layout"]);
    // The same in a grouped file, for one group only.
    let p = generate(&small_shape(ProblemKind::GroupedGemm), 3).unwrap();
    let bytes = edit(&problem_to_bytes(&p.with_layout(ScaleLayout::Blocked)).unwrap(), |m| {
        m.insert("sfa_g1".into(), (Dtype::F8_E4M3, vec![1, 72, 2], vec![0x38; 144]));
    });
    assert_tensor_err(problem_from_bytes(&bytes, ProblemKind::GroupedGemm), "sfa_blocked_g1", &["`sfa_g1`"]);
}

#[test]
fn blocked_only_file_decodes_to_the_same_scales() {
    let p = generate(&small_shape(ProblemKind::GroupedGemm), 2).unwrap();
    let bytes = problem_to_bytes(&p.with_layout(ScaleLayout::Blocked)).unwrap();
    let back = problem_from_bytes(&bytes, ProblemKind::GroupedGemm).unwrap();
    assert_eq!(back.with_layout(ScaleLayout::Plain), p);
}

#[test]
fn alpha_as_a_one_element_vector_is_accepted() {
    let bytes = edit(&gemm_bytes(), |m| {
        m.insert("alpha".into(), (Dtype::F32, vec![1], f32_bytes(&[0.5])));
    });
    let Problem::Gemm(g) = problem_from_bytes(&bytes, ProblemKind::Gemm).unwrap() else { panic!("not a gemm") };
    assert_eq!(g.alpha, Some(0.5));
}

// ---------------------------------------------------------------------------------------------
// outputs

#[test]
fn outputs_round_trip() {
    for kind in ProblemKind::ALL {
        let p = generate(&small_shape(kind), 4).unwrap();
        let out = p.run(&CpuBackend).unwrap();
        let bytes = output_to_bytes(&out).unwrap();
        assert_eq!(output_from_bytes(&bytes, kind).unwrap(), out, "{kind}");
        let path = tmp(&format!("out-{kind}"));
        save_output(&path, &out).unwrap();
        assert_eq!(load_output(&path, kind).unwrap(), out, "{kind} via path");
        std::fs::remove_file(&path).unwrap();
        let (map, _) = parse(&bytes);
        let name = if kind == ProblemKind::GroupedGemm { "c_g0" } else { "c" };
        assert_eq!(map[name].0, Dtype::F16);
        assert_eq!(map[name].1, out.tensors()[0].shape().to_vec());
    }
}

#[test]
fn output_values_survive_bit_for_bit() {
    // Includes -0, subnormals, inf and NaN payload-free bits.
    let data: Vec<f16> = [0x0000u16, 0x8000, 0x0001, 0x3C00, 0x7C00, 0xFC00, 0x7BFF, 0xC500]
        .iter()
        .map(|&b| f16::from_bits(b))
        .collect();
    let t = nvfp4::F16Tensor::new(2, 2, 2, data.clone()).unwrap();
    let bytes = output_to_bytes(&Output::Single(t)).unwrap();
    let Output::Single(back) = output_from_bytes(&bytes, ProblemKind::Gemm).unwrap() else { panic!("grouped") };
    let bits = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(back.data()), bits(&data));
}

#[test]
fn output_errors_name_the_tensor() {
    let gemm = generate(&Shape::Gemm { m: 8, n: 2, k: 16, l: 1 }, 1).unwrap();
    let bytes = output_to_bytes(&gemm.run(&CpuBackend).unwrap()).unwrap();
    assert_tensor_err(output_from_bytes(&bytes, ProblemKind::Gemv), "c", &["F16 [L, M, 1]", "[1, 8, 2]"]);
    assert_tensor_err(output_from_bytes(&bytes, ProblemKind::GroupedGemm), "c", &["no group suffix"]);
    let empty = build(&BTreeMap::new(), None);
    assert_tensor_err(output_from_bytes(&empty, ProblemKind::GroupedGemm), "c_g0", &["missing"]);
    let wrong = edit(&bytes, |m| {
        m.insert("c".into(), (Dtype::F32, vec![1, 8, 2], vec![0; 64]));
    });
    assert_tensor_err(output_from_bytes(&wrong, ProblemKind::Gemm), "c", &["expected F16", "found F32"]);
    assert_file_err(output_from_bytes(&bytes[..bytes.len() - 3], ProblemKind::Gemm));
}

// ---------------------------------------------------------------------------------------------
// case files: errors

#[test]
fn missing_tensor() {
    let bytes = gemm_bytes();
    let no_b = edit(&bytes, |m| {
        m.remove("b");
    });
    assert_tensor_err(problem_from_bytes(&no_b, ProblemKind::Gemm), "b", &["missing", "U8 [1, N, 32]"]);
    let no_sfb = edit(&bytes, |m| {
        m.remove("sfb");
    });
    assert_tensor_err(problem_from_bytes(&no_sfb, ProblemKind::Gemm), "sfb", &["missing", "sfb_blocked"]);
    // A gemm file read as a dual gemm (without the kind metadata): its `b` tensors are not
    // part of a dual gemm. Without them, `b1` is missing.
    let (map, _) = parse(&bytes);
    let anonymous = build(&map, None);
    match problem_from_bytes(&anonymous, ProblemKind::DualGemm) {
        Err(Error::Tensor { name, msg }) => {
            assert!(name == "b" || name == "sfb", "names `{name}`: {msg}");
            assert!(msg.contains("not part of a dual-gemm case"), "{msg}");
        }
        other => panic!("expected Error::Tensor, got {other:?}"),
    }
    let only_a = edit(&anonymous, |m| m.retain(|name, _| name.ends_with('a')));
    assert_tensor_err(problem_from_bytes(&only_a, ProblemKind::DualGemm), "b1", &["missing"]);

    let grouped = problem_to_bytes(&generate(&small_shape(ProblemKind::GroupedGemm), 1).unwrap()).unwrap();
    let no_b1 = edit(&grouped, |m| {
        m.remove("b_g1");
    });
    assert_tensor_err(problem_from_bytes(&no_b1, ProblemKind::GroupedGemm), "b_g1", &["missing"]);
    let alpha_only = build(&BTreeMap::from([("alpha_g0".to_string(), (Dtype::F32, vec![], f32_bytes(&[1.0])))]), None);
    assert_tensor_err(problem_from_bytes(&alpha_only, ProblemKind::GroupedGemm), "a_g0", &["missing"]);
}

#[test]
fn wrong_dtype() {
    let bytes = edit(&gemm_bytes(), |m| m.get_mut("sfa").unwrap().0 = Dtype::U8);
    assert_tensor_err(
        problem_from_bytes(&bytes, ProblemKind::Gemm),
        "sfa",
        &["expected F8_E4M3 [1, 40, 4]", "found U8 [1, 40, 4]"],
    );
    let bytes = edit(&gemm_bytes(), |m| m.get_mut("a").unwrap().0 = Dtype::I8);
    assert_tensor_err(problem_from_bytes(&bytes, ProblemKind::Gemm), "a", &["expected U8", "found I8"]);
    let bytes = edit(&gemm_bytes(), |m| {
        m.insert("alpha".into(), (Dtype::F16, vec![], vec![0, 0x3C]));
    });
    assert_tensor_err(problem_from_bytes(&bytes, ProblemKind::Gemm), "alpha", &["F32", "found F16"]);
}

#[test]
fn wrong_shape() {
    // sfa rows differ from a rows.
    let bytes = edit(&gemm_bytes(), |m| {
        m.insert("sfa".into(), (Dtype::F8_E4M3, vec![1, 39, 4], vec![0x38; 39 * 4]));
    });
    assert_tensor_err(
        problem_from_bytes(&bytes, ProblemKind::Gemm),
        "sfa",
        &["[1, 40, 4]", "found F8_E4M3 [1, 39, 4]"],
    );
    // K/16 mismatch.
    let bytes = edit(&gemm_bytes(), |m| {
        m.insert("sfb".into(), (Dtype::F8_E4M3, vec![1, 24, 2], vec![0x38; 48]));
    });
    assert_tensor_err(problem_from_bytes(&bytes, ProblemKind::Gemm), "sfb", &["[1, 24, 4]"]);
    // a of rank 2.
    let bytes = edit(&gemm_bytes(), |m| m.get_mut("a").unwrap().1 = vec![40, 32]);
    assert_tensor_err(problem_from_bytes(&bytes, ProblemKind::Gemm), "a", &["[L, M, K/2]", "found U8 [40, 32]"]);
    // Blocked dims wrong: C should be 1 for K/16 = 4.
    let bytes = edit(&gemm_bytes(), |m| {
        m.remove("sfa");
        m.insert("sfa_blocked".into(), (Dtype::F8_E4M3, vec![1, 1, 2, 512], vec![0; 1024]));
    });
    assert_tensor_err(problem_from_bytes(&bytes, ProblemKind::Gemm), "sfa_blocked", &["[1, 1, 1, 512]"]);
    // A zero dimension.
    let bytes = edit(&gemm_bytes(), |m| {
        m.insert("a".into(), (Dtype::U8, vec![1, 0, 32], vec![]));
    });
    assert_tensor_err(problem_from_bytes(&bytes, ProblemKind::Gemm), "a", &[">= 1"]);
    // K not a multiple of 16 (last dim 4 -> K = 8).
    let bytes = edit(&gemm_bytes(), |m| {
        m.insert("a".into(), (Dtype::U8, vec![1, 40, 4], vec![0; 160]));
    });
    assert_tensor_err(problem_from_bytes(&bytes, ProblemKind::Gemm), "a", &["K = 8", "multiple of 16"]);
}

#[test]
fn inconsistent_k_between_a_and_b() {
    let bytes = edit(&gemm_bytes(), |m| {
        m.insert("b".into(), (Dtype::U8, vec![1, 24, 24], vec![0; 24 * 24]));
        m.insert("sfb".into(), (Dtype::F8_E4M3, vec![1, 24, 3], vec![0x38; 72]));
    });
    assert_tensor_err(problem_from_bytes(&bytes, ProblemKind::Gemm), "b", &["[1, N, 32]", "found U8 [1, 24, 24]"]);
    // And L between a and b.
    let p = generate(&Shape::Gemm { m: 8, n: 8, k: 32, l: 2 }, 1).unwrap();
    let bytes = edit(&problem_to_bytes(&p).unwrap(), |m| {
        m.insert("b".into(), (Dtype::U8, vec![1, 8, 16], vec![0; 128]));
    });
    assert_tensor_err(problem_from_bytes(&bytes, ProblemKind::Gemm), "b", &["[2, N, 16]"]);
    // Dual gemm: b2 N must equal b1 N.
    let p = generate(&Shape::DualGemm { m: 8, n: 8, k: 32, l: 1 }, 1).unwrap();
    let bytes = edit(&problem_to_bytes(&p).unwrap(), |m| {
        m.insert("b2".into(), (Dtype::U8, vec![1, 9, 16], vec![0; 144]));
    });
    assert_tensor_err(problem_from_bytes(&bytes, ProblemKind::DualGemm), "b2", &["[1, 8, 16]"]);
}

#[test]
fn gemv_b_with_two_rows() {
    let p = generate(&Shape::Gemv { m: 16, k: 32, l: 1 }, 1).unwrap();
    let bytes = edit(&problem_to_bytes(&p).unwrap(), |m| {
        m.insert("b".into(), (Dtype::U8, vec![1, 2, 16], vec![0; 32]));
        m.insert("sfb".into(), (Dtype::F8_E4M3, vec![1, 2, 2], vec![0x38; 4]));
    });
    assert_tensor_err(problem_from_bytes(&bytes, ProblemKind::Gemv), "b", &["[1, 1, 16]", "found U8 [1, 2, 16]"]);
}

#[test]
fn grouped_group_with_l_2() {
    let grouped = problem_to_bytes(&generate(&small_shape(ProblemKind::GroupedGemm), 1).unwrap()).unwrap();
    let bytes = edit(&grouped, |m| {
        m.insert("a_g2".into(), (Dtype::U8, vec![2, 8, 8], vec![0; 128]));
    });
    assert_tensor_err(problem_from_bytes(&bytes, ProblemKind::GroupedGemm), "a_g2", &["[1, M, K/2]"]);
}

#[test]
fn non_finite_scalars() {
    for v in [f32::NAN, f32::INFINITY] {
        let bytes = edit(&gemm_bytes(), |m| {
            m.insert("alpha".into(), (Dtype::F32, vec![], f32_bytes(&[v])));
        });
        assert_tensor_err(problem_from_bytes(&bytes, ProblemKind::Gemm), "alpha", &["finite"]);
        let bytes = edit(&gemm_bytes(), |m| {
            m.insert("b_global_scale".into(), (Dtype::F32, vec![1], f32_bytes(&[v])));
        });
        assert_tensor_err(problem_from_bytes(&bytes, ProblemKind::Gemm), "b_global_scale", &["finite"]);
    }
    let bytes = edit(&gemm_bytes(), |m| {
        m.insert("alpha".into(), (Dtype::F32, vec![2], f32_bytes(&[1.0, 2.0])));
    });
    assert_tensor_err(problem_from_bytes(&bytes, ProblemKind::Gemm), "alpha", &["scalar", "[2]"]);
}

#[test]
fn truncated_garbage_and_empty_bytes() {
    let bytes = gemm_bytes();
    for cut in [0, 4, 8, 9, bytes.len() / 2, bytes.len() - 1] {
        assert_file_err(problem_from_bytes(&bytes[..cut], ProblemKind::Gemm));
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert_file_err(problem_from_bytes(&longer, ProblemKind::Gemm));
    assert_file_err(problem_from_bytes(b"this is not a safetensors file at all", ProblemKind::Gemm));
    assert_file_err(problem_from_bytes(&[0xFF; 64], ProblemKind::Gemm));
    // A plausible length followed by non-JSON.
    let mut fake = 16u64.to_le_bytes().to_vec();
    fake.extend_from_slice(b"{not json at all");
    assert_file_err(problem_from_bytes(&fake, ProblemKind::Gemm));
}

#[test]
fn truncated_file_on_disk() {
    let bytes = gemm_bytes();
    let path = tmp("truncated");
    std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
    let err = load_problem(&path, ProblemKind::Gemm).unwrap_err();
    match &err {
        Error::File { path: p, .. } => assert_eq!(p, &path),
        other => panic!("expected Error::File, got {other:?}"),
    }
    assert!(err.to_string().contains(&*path.to_string_lossy()));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn nonexistent_path() {
    let path = tmp("does-not-exist");
    for r in [
        load_problem(&path, ProblemKind::Gemm).map(|_| ()),
        load_output(&path, ProblemKind::Gemm).map(|_| ()),
        load_modelopt_weight(&path, "").map(|_| ()),
        stored_problem_kind(&path).map(|_| ()),
        quantize_file(&path, &tmp("never-written"), QuantizeOptions::default()).map(|_| ()),
    ] {
        match r {
            Err(Error::Io { path: p, source }) => {
                assert_eq!(p, path);
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("expected Error::Io, got {other:?}"),
        }
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-dir").join("x.safetensors");
    let p = generate(&Shape::Gemv { m: 8, k: 16, l: 1 }, 1).unwrap();
    assert!(matches!(save_problem(&dir, &p), Err(Error::Io { .. })));
}

#[test]
fn kind_in_metadata_must_match() {
    let r = problem_from_bytes(&gemm_bytes(), ProblemKind::Gemv);
    match r {
        Err(Error::File { msg, .. }) => assert!(msg.contains("gemm") && msg.contains("gemv"), "{msg}"),
        other => panic!("expected Error::File, got {other:?}"),
    }
}

#[test]
fn corrupted_bytes_never_panic() {
    let kinds = ProblemKind::ALL;
    // Each kind's file with its metadata, and without (so every reader gets past the kind check).
    let sources: Vec<Vec<u8>> = kinds
        .iter()
        .flat_map(|&k| {
            let bytes = problem_to_bytes(&generate(&small_shape(k), 1).unwrap()).unwrap();
            let bare = build(&parse(&bytes).0, None);
            [bytes, bare]
        })
        .collect();
    let mut rng = Rng::new(0xBAD);
    for bytes in &sources {
        let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        for round in 0..400u32 {
            let mut b = bytes.clone();
            // Mostly hit the header, where the damage is interesting.
            let limit = if round.is_multiple_of(4) { b.len() } else { header_end };
            for _ in 0..1 + rng.below(3) {
                let i = rng.below(limit as u32) as usize;
                b[i] = match rng.below(4) {
                    0 => rng.below(256) as u8,
                    1 => b[i] ^ (1 << rng.below(8)),
                    2 => b'0' + rng.below(10) as u8,
                    _ => b'9',
                };
            }
            let cut = if round.is_multiple_of(7) { rng.below(b.len() as u32) as usize } else { b.len() };
            for kind in kinds {
                let _ = problem_from_bytes(&b[..cut], kind);
                let _ = output_from_bytes(&b[..cut], kind);
            }
            let _ = weight_from_bytes(&b[..cut], "");
        }
    }
}

#[test]
fn lying_header_is_refused_without_allocating() {
    // A shape whose byte count overflows, and one far larger than the file.
    for shape in ["[4294967296, 4294967296, 4294967296]", "[1, 1000000000000, 2]"] {
        let header = format!(r#"{{"a":{{"dtype":"U8","shape":{shape},"data_offsets":[0,16]}}}}"#);
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(&[0; 16]);
        assert_file_err(problem_from_bytes(&bytes, ProblemKind::Gemm));
        let path = tmp("lying");
        std::fs::write(&path, &bytes).unwrap();
        assert_file_err(load_modelopt_weight(&path, ""));
        std::fs::remove_file(&path).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// checkpoint weights

/// Random packed values and a spread of scale codes (zero, subnormal, normal, 448) for `[n, k]`.
fn random_weight(n: usize, k: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let mut rng = Rng::new(seed);
    let values = (0..n * k / 2).map(|_| rng.below(256) as u8).collect();
    let codes = [0x00, 0x01, 0x07, 0x08, 0x30, 0x38, 0x3D, 0x40, 0x55, 0x7E];
    let scales = (0..n * k / 16).map(|i| codes[(i + rng.below(3) as usize) % codes.len()]).collect();
    (values, scales)
}

#[test]
fn modelopt_weight_dequantizes_exactly() {
    let (n, k) = (5usize, 64usize);
    let (values, scales) = random_weight(n, k, 21);
    let prefix = "model.layers.0.mlp.down_proj.";
    let global = 0.3f32;
    let mut m = BTreeMap::new();
    m.insert(format!("{prefix}weight"), (Dtype::U8, vec![n, k / 2], values.clone()));
    m.insert(format!("{prefix}weight_scale"), (Dtype::F8_E4M3, vec![n, k / 16], scales.clone()));
    m.insert(format!("{prefix}weight_scale_2"), (Dtype::F32, vec![], f32_bytes(&[global])));
    m.insert(format!("{prefix}input_scale"), (Dtype::F32, vec![], f32_bytes(&[1.0])));
    m.insert("model.layers.0.mlp.up_proj.weight".into(), (Dtype::U8, vec![1, 8], vec![0; 8]));
    let bytes = build(&m, None);
    let path = tmp("modelopt");
    std::fs::write(&path, &bytes).unwrap();

    let t = load_modelopt_weight(&path, prefix).unwrap();
    assert_eq!((t.l(), t.rows(), t.k(), t.layout()), (1, n, k, ScaleLayout::Plain));
    assert_eq!(t.global_scale(), global);
    let want = expected_dequant(&values, &scales, n, k, global);
    assert_eq!(t.dequantize(), want);

    let (t2, conv) = load_weight(&path, prefix).unwrap();
    assert_eq!((t2, conv), (t.clone(), WeightConvention::ModelOpt));
    assert_eq!(weight_from_bytes(&bytes, prefix).unwrap(), (t, WeightConvention::ModelOpt));
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn compressed_tensors_weight_dequantizes_exactly() {
    let (n, k) = (3usize, 48usize);
    let (values, scales) = random_weight(n, k, 33);
    let inverse = 448.0 * 6.0 / 7.5f32; // what llm-compressor stores: 1 / global
    let mut m = BTreeMap::new();
    m.insert("lin.weight_packed".to_string(), (Dtype::U8, vec![n, k / 2], values.clone()));
    m.insert("lin.weight_scale".to_string(), (Dtype::F8_E4M3, vec![n, k / 16], scales.clone()));
    m.insert("lin.weight_global_scale".to_string(), (Dtype::F32, vec![1], f32_bytes(&[inverse])));
    let path = tmp("compressed");
    std::fs::write(&path, build(&m, None)).unwrap();

    let t = load_compressed_tensors_weight(&path, "lin.").unwrap();
    let global = 1.0 / inverse;
    assert_eq!(t.global_scale(), global);
    assert_eq!(t.dequantize(), expected_dequant(&values, &scales, n, k, global));
    assert_eq!(load_weight(&path, "lin.").unwrap(), (t, WeightConvention::CompressedTensors));
    // The ModelOpt loader does not mistake it for its own.
    assert_tensor_err(load_modelopt_weight(&path, "lin."), "lin.weight", &["missing"]);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn weight_errors() {
    let (n, k) = (4usize, 32usize);
    let (values, scales) = random_weight(n, k, 1);
    let ct = |g: f32| {
        let mut m = BTreeMap::new();
        m.insert("weight_packed".to_string(), (Dtype::U8, vec![n, k / 2], values.clone()));
        m.insert("weight_scale".to_string(), (Dtype::F8_E4M3, vec![n, k / 16], scales.clone()));
        m.insert("weight_global_scale".to_string(), (Dtype::F32, vec![1], f32_bytes(&[g])));
        m
    };
    for g in [0.0, -2.0, f32::NAN, f32::INFINITY] {
        let r = weight_from_bytes(&build(&ct(g), None), "");
        assert_tensor_err(r, "weight_global_scale", &["finite and > 0"]);
    }
    // 1 / (smallest subnormal) overflows.
    assert_tensor_err(weight_from_bytes(&build(&ct(1e-45), None), ""), "weight_global_scale", &["overflows"]);

    let mo = || {
        let mut m = BTreeMap::new();
        m.insert("weight".to_string(), (Dtype::U8, vec![n, k / 2], values.clone()));
        m.insert("weight_scale".to_string(), (Dtype::F8_E4M3, vec![n, k / 16], scales.clone()));
        m.insert("weight_scale_2".to_string(), (Dtype::F32, vec![], f32_bytes(&[1.0])));
        m
    };
    let mut m = mo();
    m.remove("weight_scale_2");
    assert_tensor_err(weight_from_bytes(&build(&m, None), ""), "weight_scale_2", &["missing"]);
    let mut m = mo();
    m.insert("weight_scale".into(), (Dtype::F8_E4M3, vec![n, 1], vec![0x38; n]));
    assert_tensor_err(weight_from_bytes(&build(&m, None), ""), "weight_scale", &["[4, 2]", "found F8_E4M3 [4, 1]"]);
    let mut m = mo();
    m.insert("weight".into(), (Dtype::F16, vec![n, 8], vec![0; n * 16]));
    assert_tensor_err(weight_from_bytes(&build(&m, None), ""), "weight", &["expected U8 [N, K/2]", "found F16"]);
    let mut m = mo();
    m.insert("weight_scale_2".into(), (Dtype::BF16, vec![], vec![0x80, 0x3F]));
    assert_tensor_err(weight_from_bytes(&build(&m, None), ""), "weight_scale_2", &["F32", "found BF16"]);
    assert_tensor_err(
        weight_from_bytes(&build(&mo(), None), "layer9."),
        "layer9.weight",
        &["missing", "weight_packed"],
    );

    let path = tmp("weights-garbage");
    std::fs::write(&path, b"garbage garbage garbage").unwrap();
    assert_file_err(load_weight(&path, ""));
    let good = build(&mo(), None);
    std::fs::write(&path, &good[..good.len() - 1]).unwrap();
    assert_file_err(load_modelopt_weight(&path, ""));
    std::fs::write(&path, &good[..4]).unwrap();
    assert_file_err(load_modelopt_weight(&path, ""));
    std::fs::write(&path, &good).unwrap();
    assert!(load_modelopt_weight(&path, "").is_ok());
    std::fs::remove_file(&path).unwrap();
}

// ---------------------------------------------------------------------------------------------
// quantize_file

/// Dense values for a `[n, k]` tensor: row 0 holds 2688 (= 6 * 448, so the ModelOpt global scale
/// is exactly 1) and blocks of exactly representable values q * s for several E4M3 scales s
/// (448, 1, 2^-4, and the subnormal 7/8 * 2^-6); later rows are random at several magnitudes.
/// `round` maps each value to what the file's dtype holds.
fn dense(n: usize, k: usize, seed: u64, round: impl Fn(f32) -> f32) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let q = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let exact_scales = [448.0, 1.0, 0.0625, 0.875 / 64.0];
    let mut out = Vec::with_capacity(n * k);
    for r in 0..n {
        for c in 0..k {
            let block = c / 16;
            let v = if r == 0 {
                let s = exact_scales[block % exact_scales.len()];
                // The block's first element is 6 so its amax is exactly 6 * s.
                let m = if c.is_multiple_of(16) { 6.0 } else { q[rng.below(8) as usize] };
                let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
                sign * m * s
            } else {
                let mag = [1.0, 50.0, 300.0][(r + block) % 3];
                (rng.unit_f32() * 2.0 - 1.0) * mag
            };
            out.push(round(v));
        }
    }
    out
}

/// Checks a dequantized weight against the dense input: within one scale step unit
/// (|x - deq| <= scale * global) everywhere, and exact wherever x is representable.
fn check_quantized(name: &str, t: &Nvfp4Tensor, x: &[f32], min_exact: usize) {
    let (n, k) = (t.rows(), t.k());
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert_eq!(t.global_scale(), amax / 2688.0, "{name}: ModelOpt global = amax / (6 * 448)");
    let g = t.global_scale();
    let deq = t.dequantize();
    assert_eq!(deq.len(), x.len());
    let mut exact = 0;
    for r in 0..n {
        for c in 0..k {
            let i = r * k + c;
            let s = e4m3(t.scale(0, r, c / 16));
            let bound = s * g * (1.0 + 1e-6);
            assert!((x[i] - deq[i]).abs() <= bound, "{name}[{r}, {c}]: x {} deq {} bound {bound}", x[i], deq[i]);
            if (0..16u8).any(|code| e2m1(code) * s * g == x[i]) {
                assert_eq!(deq[i], x[i], "{name}[{r}, {c}]: representable value not exact");
                exact += 1;
            }
        }
    }
    assert!(exact >= min_exact, "{name}: only {exact} representable elements, expected >= {min_exact}");
}

#[test]
fn quantize_file_f32_f16_bf16() {
    let mut m: BTreeMap<String, Raw> = BTreeMap::new();
    let x32 = dense(4, 64, 1, |v| v);
    m.insert("layer.weight".into(), (Dtype::F32, vec![4, 64], f32_bytes(&x32)));
    let x16 = dense(3, 32, 2, |v| f16::from_f32(v).to_f32());
    let b16: Vec<u8> = x16.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect();
    m.insert("emb.weight".into(), (Dtype::F16, vec![3, 32], b16));
    let xb = dense(2, 48, 3, |v| bf16::from_f32(v).to_f32());
    let bb: Vec<u8> = xb.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect();
    m.insert("proj.weight".into(), (Dtype::BF16, vec![2, 48], bb));
    // A tensor with a small amax, so the global scale is not 1.
    let xs: Vec<f32> = dense(2, 32, 4, |v| v).iter().map(|v| v * 1e-3).collect();
    m.insert("small.weight".into(), (Dtype::F32, vec![2, 32], f32_bytes(&xs)));
    m.insert("lm_head".into(), (Dtype::F32, vec![2, 16], f32_bytes(&[0.25; 32])));
    // Copied: 1-D, K not a multiple of 16, integer, 3-D.
    m.insert("layer.bias".into(), (Dtype::F32, vec![4], f32_bytes(&[1.0, 2.0, 3.0, 4.0])));
    m.insert("odd.weight".into(), (Dtype::F32, vec![2, 24], f32_bytes(&[0.5; 48])));
    m.insert("ids".into(), (Dtype::I32, vec![2, 16], (0..128).map(|i| i as u8).collect()));
    m.insert("cube".into(), (Dtype::F16, vec![1, 2, 16], vec![0; 64]));
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    let input = tmp("dense-in");
    let output = tmp("dense-out");
    std::fs::write(&input, build(&m, Some(meta))).unwrap();

    let summary = quantize_file(&input, &output, QuantizeOptions::default()).unwrap();
    let mut quantized: Vec<_> = summary.quantized.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    quantized.sort();
    assert_eq!(
        quantized,
        vec![
            ("emb.weight", [3, 32]),
            ("layer.weight", [4, 64]),
            ("lm_head", [2, 16]),
            ("proj.weight", [2, 48]),
            ("small.weight", [2, 32])
        ]
    );
    let mut skipped: Vec<_> = summary.skipped.iter().map(|s| (s.name.as_str(), s.reason.clone())).collect();
    skipped.sort_by(|a, b| a.0.cmp(b.0));
    assert_eq!(
        skipped,
        vec![
            ("cube", SkipReason::NotTwoD),
            ("ids", SkipReason::Dtype),
            ("layer.bias", SkipReason::NotTwoD),
            ("odd.weight", SkipReason::KNotMultipleOf16)
        ]
    );
    let shown = summary.to_string();
    for name in ["layer.weight", "emb.weight", "lm_head", "ids", "odd.weight"] {
        assert!(shown.contains(name), "summary lacks {name}:\n{shown}");
    }
    for why in ["K = 24 is not a multiple of 16", "I32 is not a dtype", "3-D", "1-D"] {
        assert!(shown.contains(why), "summary lacks the reason `{why}`:\n{shown}");
    }

    let (out, out_meta) = parse(&std::fs::read(&output).unwrap());
    assert_eq!(out_meta.unwrap().get("format").map(String::as_str), Some("pt"), "metadata kept");
    assert_eq!(out["layer.weight"].0, Dtype::U8);
    assert_eq!(out["layer.weight"].1, vec![4, 32]);
    assert_eq!((out["layer.weight_scale"].0, out["layer.weight_scale"].1.clone()), (Dtype::F8_E4M3, vec![4, 4]));
    assert_eq!((out["layer.weight_scale_2"].0, out["layer.weight_scale_2"].1.len()), (Dtype::F32, 0));
    assert!(out.contains_key("lm_head_scale") && out.contains_key("lm_head_scale_2"));
    for name in ["layer.bias", "odd.weight", "ids", "cube"] {
        assert_eq!(out[name], m[name], "{name} copied unchanged");
    }
    assert_eq!(out.len(), 5 * 3 + 4);

    for (prefix, x) in [("layer.", &x32), ("emb.", &x16), ("proj.", &xb), ("small.", &xs)] {
        let t = load_modelopt_weight(&output, prefix).unwrap();
        check_quantized(prefix, &t, x, t.k());
    }
    assert_ne!(load_modelopt_weight(&output, "small.").unwrap().global_scale(), 1.0);
    std::fs::remove_file(&input).unwrap();
    std::fs::remove_file(&output).unwrap();
}

#[test]
fn quantize_file_refuses_non_finite_and_name_clashes() {
    let input = tmp("dense-bad-in");
    let output = tmp("dense-bad-out");
    let mut x = vec![0.5f32; 32];
    x[17] = f32::NAN;
    let m = BTreeMap::from([("w".to_string(), (Dtype::F32, vec![2, 16], f32_bytes(&x)))]);
    std::fs::write(&input, build(&m, None)).unwrap();
    assert_tensor_err(quantize_file(&input, &output, QuantizeOptions::default()), "w", &["element 17"]);

    let m = BTreeMap::from([
        ("w".to_string(), (Dtype::F32, vec![2, 16], f32_bytes(&[0.5; 32]))),
        ("w_scale".to_string(), (Dtype::F32, vec![2], f32_bytes(&[1.0, 1.0]))),
    ]);
    std::fs::write(&input, build(&m, None)).unwrap();
    assert_tensor_err(quantize_file(&input, &output, QuantizeOptions::default()), "w_scale", &["two tensors"]);

    std::fs::write(&input, b"not safetensors").unwrap();
    assert_file_err(quantize_file(&input, &output, QuantizeOptions::default()));
    std::fs::remove_file(&input).unwrap();
    let _ = std::fs::remove_file(&output);
}

#[test]
fn quantize_file_reads_unaligned_data() {
    // Hand-built so the F32 data starts at an odd offset (the safetensors writer would align it).
    let x: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 0.25).collect();
    let header = r#"{"pad":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"F32","shape":[2,16],"data_offsets":[1,129]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.push(7);
    bytes.extend_from_slice(&f32_bytes(&x));
    let input = tmp("unaligned-in");
    let output = tmp("unaligned-out");
    std::fs::write(&input, &bytes).unwrap();
    let s = quantize_file(&input, &output, QuantizeOptions::default()).unwrap();
    assert_eq!(s.quantized, vec![("w".to_string(), [2, 16])]);
    assert_eq!(s.skipped.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(), vec!["pad"]);
    let (t, conv) = {
        // `w` is not `<prefix>weight`; read its three tensors through a renamed copy.
        let (map, _) = parse(&std::fs::read(&output).unwrap());
        let mut renamed = BTreeMap::new();
        renamed.insert("weight".to_string(), map["w"].clone());
        renamed.insert("weight_scale".to_string(), map["w_scale"].clone());
        renamed.insert("weight_scale_2".to_string(), map["w_scale_2"].clone());
        weight_from_bytes(&build(&renamed, None), "").unwrap()
    };
    assert_eq!(conv, WeightConvention::ModelOpt);
    check_quantized("w", &t, &x, 0);
    std::fs::remove_file(&input).unwrap();
    std::fs::remove_file(&output).unwrap();
}

#[test]
fn quantize_names_every_skip_and_strict_mode_refuses_any() {
    // Nothing here can be quantized: K = 40, 1-D, 3-D, F64.
    let m = BTreeMap::from([
        ("odd".to_string(), (Dtype::F32, vec![2, 40], f32_bytes(&[0.5; 80]))),
        ("bias".to_string(), (Dtype::F16, vec![4], vec![0; 8])),
        ("cube".to_string(), (Dtype::BF16, vec![2, 2, 16], vec![0; 128])),
        ("wide".to_string(), (Dtype::F64, vec![1, 16], vec![0; 128])),
    ]);
    let input = tmp("skips-in");
    let output = tmp("skips-out");
    let _ = std::fs::remove_file(&output);
    std::fs::write(&input, build(&m, None)).unwrap();

    let r = quantize_file(&input, &output, QuantizeOptions { strict: true });
    match &r {
        Err(Error::Tensor { name, msg }) => {
            assert!(m.contains_key(name), "{name}");
            for n in m.keys() {
                assert!(msg.contains(n.as_str()), "`{msg}` does not name `{n}`");
            }
        }
        other => panic!("expected a refusal in strict mode, got {other:?}"),
    }
    assert!(!output.exists(), "strict mode wrote {}", output.display());

    let s = quantize_file(&input, &output, QuantizeOptions::default()).unwrap();
    assert!(s.quantized.is_empty());
    let reasons: BTreeMap<&str, &SkipReason> = s.skipped.iter().map(|k| (k.name.as_str(), &k.reason)).collect();
    assert_eq!(
        reasons,
        BTreeMap::from([
            ("bias", &SkipReason::NotTwoD),
            ("cube", &SkipReason::NotTwoD),
            ("odd", &SkipReason::KNotMultipleOf16),
            ("wide", &SkipReason::Dtype)
        ])
    );
    let (out, _) = parse(&std::fs::read(&output).unwrap());
    for (name, t) in &m {
        assert_eq!(&out[name], t, "{name} copied unchanged");
    }
    std::fs::remove_file(&input).unwrap();
    std::fs::remove_file(&output).unwrap();
}
