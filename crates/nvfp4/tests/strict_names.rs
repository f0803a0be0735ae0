//! Strict reading of case and output files: a name that looks like one of ours but that the
//! reader would not use (a gap in the group numbers, a group without `a_g{i}`, another problem's
//! operand, a group suffix where there are no groups) is an error naming that tensor, never
//! silently ignored.

use std::collections::BTreeMap;

use nvfp4::io::{output_from_bytes, output_to_bytes, problem_from_bytes, problem_to_bytes};
use nvfp4::problem::generate;
use nvfp4::{CpuBackend, Error, ProblemKind, ScaleLayout, Shape};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

/// Name -> (dtype, shape, bytes) of every tensor in a file, and its metadata.
type Tensors = BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>;

fn tensors(bytes: &[u8]) -> Tensors {
    let st = SafeTensors::deserialize(bytes).unwrap();
    st.tensors().into_iter().map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec()))).collect()
}

fn build(t: &Tensors) -> Vec<u8> {
    let views: Vec<(String, TensorView)> =
        t.iter().map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize(views, None).unwrap()
}

/// The file of `bytes` with `f` applied to its tensors (metadata dropped).
fn edit(bytes: &[u8], f: impl FnOnce(&mut Tensors)) -> Vec<u8> {
    let mut t = tensors(bytes);
    f(&mut t);
    build(&t)
}

/// Renames tensor `from` to `to`.
fn rename(t: &mut Tensors, from: &str, to: &str) {
    let v = t.remove(from).unwrap_or_else(|| panic!("no `{from}` to rename"));
    t.insert(to.to_string(), v);
}

#[track_caller]
fn assert_names<T: std::fmt::Debug>(r: nvfp4::Result<T>, name: &str, needle: &str) {
    match r {
        Err(Error::Tensor { name: got, msg }) => {
            assert_eq!(got, name, "{msg}");
            assert!(msg.contains(needle), "`{msg}` lacks `{needle}`");
        }
        other => panic!("expected Error::Tensor naming `{name}`, got {other:?}"),
    }
}

/// Three groups, every tensor named `*_g0`, `*_g1`, `*_g2`.
fn grouped_bytes(layout: ScaleLayout) -> Vec<u8> {
    let p = generate(&Shape::GroupedGemm { groups: vec![(8, 16, 32), (24, 8, 16), (16, 16, 64)] }, 5).unwrap();
    problem_to_bytes(&p.with_layout(layout)).unwrap()
}

#[test]
fn a_gap_in_group_numbers_is_refused() {
    for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
        let sf = if layout == ScaleLayout::Plain { "sfa" } else { "sfa_blocked" };
        let sfb = if layout == ScaleLayout::Plain { "sfb" } else { "sfb_blocked" };
        // Group 1 renumbered to 3: a_g0, a_g2, a_g3, no a_g1. Before, the reader took group 0 only.
        let gap = edit(&grouped_bytes(layout), |t| {
            for base in ["a", "b", sf, sfb] {
                rename(t, &format!("{base}_g1"), &format!("{base}_g3"));
            }
        });
        assert_names(problem_from_bytes(&gap, ProblemKind::GroupedGemm), "a_g1", "without a gap");
        // Only a_g1 removed: the rest of group 1 has no anchor either, but the gap is named first.
        let hole = edit(&grouped_bytes(layout), |t| {
            t.remove("a_g1");
        });
        assert_names(problem_from_bytes(&hole, ProblemKind::GroupedGemm), "a_g1", "missing");
    }
}

#[test]
fn tensors_of_a_group_without_a_are_refused() {
    let bytes = grouped_bytes(ScaleLayout::Plain);
    let stray = edit(&bytes, |t| {
        let v = t["sfa_g0"].clone();
        t.insert("sfa_g7".into(), v);
    });
    assert_names(problem_from_bytes(&stray, ProblemKind::GroupedGemm), "sfa_g7", "no `a_g7`");
    let stray_alpha = edit(&bytes, |t| {
        t.insert("alpha_g3".into(), (Dtype::F32, vec![], 1f32.to_le_bytes().to_vec()));
    });
    assert_names(problem_from_bytes(&stray_alpha, ProblemKind::GroupedGemm), "alpha_g3", "group 3");
}

#[test]
fn group_numbers_must_be_plain() {
    let bytes = edit(&grouped_bytes(ScaleLayout::Plain), |t| rename(t, "b_g2", "b_g02"));
    assert_names(problem_from_bytes(&bytes, ProblemKind::GroupedGemm), "b_g02", "not written as 0, 1, 2");
}

#[test]
fn grouped_files_need_suffixes_and_ungrouped_files_refuse_them() {
    let grouped = grouped_bytes(ScaleLayout::Plain);
    let unsuffixed = edit(&grouped, |t| {
        t.insert("alpha".into(), (Dtype::F32, vec![], 2f32.to_le_bytes().to_vec()));
    });
    assert_names(problem_from_bytes(&unsuffixed, ProblemKind::GroupedGemm), "alpha", "no group suffix");

    let gemm = problem_to_bytes(&generate(&Shape::Gemm { m: 8, n: 8, k: 32, l: 1 }, 2).unwrap()).unwrap();
    let suffixed = edit(&gemm, |t| {
        let v = t["a"].clone();
        t.insert("a_g1".into(), v);
    });
    assert_names(problem_from_bytes(&suffixed, ProblemKind::Gemm), "a_g1", "no groups");
}

#[test]
fn another_problems_operands_are_refused() {
    let gemm = problem_to_bytes(&generate(&Shape::Gemm { m: 8, n: 8, k: 32, l: 1 }, 2).unwrap()).unwrap();
    let with_b2 = edit(&gemm, |t| {
        let v = t["b"].clone();
        t.insert("b2".into(), v);
    });
    assert_names(problem_from_bytes(&with_b2, ProblemKind::Gemm), "b2", "dual-gemm");
    let dual = problem_to_bytes(&generate(&Shape::DualGemm { m: 8, n: 8, k: 32, l: 1 }, 2).unwrap()).unwrap();
    let with_sfb = edit(&dual, |t| {
        let v = t["sfb1"].clone();
        t.insert("sfb".into(), v);
    });
    assert_names(problem_from_bytes(&with_sfb, ProblemKind::DualGemm), "sfb", "not part of a dual-gemm case");
}

#[test]
fn names_that_are_not_ours_are_ignored() {
    let p = generate(&Shape::Gemm { m: 8, n: 8, k: 32, l: 1 }, 2).unwrap();
    let bytes = edit(&problem_to_bytes(&p).unwrap(), |t| {
        for name in ["c", "notes", "a_gate", "sfa_g", "b_gx", "a_g"] {
            t.insert(name.into(), (Dtype::U8, vec![1], vec![7]));
        }
    });
    assert_eq!(problem_from_bytes(&bytes, ProblemKind::Gemm).unwrap(), p);
}

#[test]
fn output_group_numbers_are_checked() {
    let p = generate(&Shape::GroupedGemm { groups: vec![(8, 16, 32), (24, 8, 16), (16, 16, 64)] }, 5).unwrap();
    let out = p.run(&CpuBackend).unwrap();
    let bytes = output_to_bytes(&out).unwrap();
    assert_eq!(output_from_bytes(&bytes, ProblemKind::GroupedGemm).unwrap(), out);
    let gap = edit(&bytes, |t| rename(t, "c_g1", "c_g4"));
    assert_names(output_from_bytes(&gap, ProblemKind::GroupedGemm), "c_g1", "without a gap");
    let single =
        output_to_bytes(&generate(&Shape::Gemm { m: 8, n: 8, k: 32, l: 1 }, 2).unwrap().run(&CpuBackend).unwrap())
            .unwrap();
    let extra = edit(&single, |t| {
        let v = t["c"].clone();
        t.insert("c_g0".into(), v);
    });
    assert_names(output_from_bytes(&extra, ProblemKind::Gemm), "c_g0", "no groups");
}
