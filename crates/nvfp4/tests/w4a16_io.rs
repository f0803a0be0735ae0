//! W4A16 case and output files (docs/FORMAT.md §10): round trips of every operation in both
//! activation types and both scale layouts, the mode told from the activation's dtype, every
//! malformed file refused with an error naming the tensor, and nothing written on a failure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use nvfp4::check::reference16::reference16;
use nvfp4::io::{
    case_from_bytes, load_case, load_outputs16, outputs16_from_bytes, outputs16_to_bytes, problem16_from_bytes,
    problem16_to_bytes, problem_from_bytes, problem_to_bytes, save_outputs16, save_problem16, CaseProblem,
};
use nvfp4::problem::{generate, generate16, Problem16, ProblemKind, Shape, Tier};
use nvfp4::{CpuBackend, Error, OutTensor, OutputDtype, ScaleLayout};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

const BF16: OutputDtype = OutputDtype::Bf16;
const F16: OutputDtype = OutputDtype::F16;

fn tmp(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("w4a16-io-{}-{name}.safetensors", std::process::id()))
}

fn shape(kind: ProblemKind) -> Shape {
    match kind {
        ProblemKind::Gemv => Shape::Gemv { m: 130, k: 48, l: 2 },
        ProblemKind::Gemm => Shape::Gemm { m: 40, n: 130, k: 80, l: 2 },
        ProblemKind::DualGemm => Shape::DualGemm { m: 33, n: 20, k: 64, l: 2 },
        ProblemKind::GroupedGemm => Shape::GroupedGemm { groups: vec![(40, 24, 64), (72, 130, 16)] },
    }
}

fn problem(kind: ProblemKind, act: OutputDtype) -> Problem16 {
    let mut p = generate16(&shape(kind), act, Tier::Random, 3).unwrap();
    p.set_alpha(Some(0.75)).unwrap();
    p
}

/// (dtype, shape, bytes) of one tensor.
type Raw = (Dtype, Vec<usize>, Vec<u8>);

/// A file's tensors and metadata, edited by `f`, serialized again.
fn edit(bytes: &[u8], f: impl FnOnce(&mut BTreeMap<String, Raw>)) -> Vec<u8> {
    let st = SafeTensors::deserialize(bytes).unwrap();
    let mut map: BTreeMap<String, Raw> =
        st.tensors().into_iter().map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec()))).collect();
    let (_, meta) = SafeTensors::read_metadata(bytes).unwrap();
    f(&mut map);
    let views: Vec<(String, TensorView)> =
        map.iter().map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize(views, meta.metadata().clone()).unwrap()
}

#[track_caller]
fn refused<T: std::fmt::Debug>(r: nvfp4::Result<T>, name: &str, needle: &str) {
    match r {
        Err(Error::Tensor { name: got, msg }) => {
            assert_eq!(got, name, "{msg}");
            assert!(msg.contains(needle), "`{msg}` lacks `{needle}`");
        }
        other => panic!("expected an error naming `{name}`, got {other:?}"),
    }
}

#[test]
fn cases_round_trip_in_both_types_and_layouts() {
    for kind in ProblemKind::ALL {
        for act in [BF16, F16] {
            for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
                let p = problem(kind, act).into_layout(layout);
                let bytes = problem16_to_bytes(&p).unwrap();
                assert_eq!(problem16_from_bytes(&bytes, kind).unwrap(), p, "{kind} {act} {layout:?}");
                assert_eq!(case_from_bytes(&bytes, kind).unwrap(), CaseProblem::W4a16(p.clone()));
                // The activation is stored as its own dtype, K whole.
                let st = SafeTensors::deserialize(&bytes).unwrap();
                let name = match kind {
                    ProblemKind::Gemv => "b",
                    ProblemKind::GroupedGemm => "a_g0",
                    _ => "a",
                };
                let t = st.tensor(name).unwrap();
                assert_eq!(t.dtype(), if act == BF16 { Dtype::BF16 } else { Dtype::F16 });
                assert_eq!(t.shape(), p.activations()[0].shape());
                // gen -> file -> run equals the reference of the drawn problem.
                let read = match case_from_bytes(&bytes, kind).unwrap() {
                    CaseProblem::W4a16(r) => r,
                    CaseProblem::W4a4(_) => panic!("{kind}: read as W4A4"),
                };
                for out in [BF16, F16] {
                    assert_eq!(read.run_as(&CpuBackend, out).unwrap(), reference16(&p, out).unwrap());
                }
            }
        }
    }
    // W4A4 files still read as W4A4, and each mode's reader names the other.
    for kind in ProblemKind::ALL {
        let w4a4 = problem_to_bytes(&generate(&shape(kind), 1).unwrap()).unwrap();
        assert!(matches!(case_from_bytes(&w4a4, kind).unwrap(), CaseProblem::W4a4(_)));
        let act = if kind == ProblemKind::Gemv {
            "b"
        } else if kind == ProblemKind::GroupedGemm {
            "a_g0"
        } else {
            "a"
        };
        refused(problem16_from_bytes(&w4a4, kind), act, "W4A4");
        let w4a16 = problem16_to_bytes(&problem(kind, BF16)).unwrap();
        refused(problem_from_bytes(&w4a16, kind), act, "W4A16");
    }
}

#[test]
fn malformed_activations_are_refused_by_name() {
    let gemm = problem16_to_bytes(&problem(ProblemKind::Gemm, BF16)).unwrap();
    let put = |name: &str, raw: Raw| {
        let name = name.to_string();
        edit(&gemm, move |m| {
            m.insert(name, raw);
        })
    };
    // Another dtype, a K that is not a multiple of 16, a K that disagrees with the weight.
    refused(
        case_from_bytes(&put("a", (Dtype::F32, vec![2, 40, 80], vec![0; 2 * 40 * 80 * 4])), ProblemKind::Gemm),
        "a",
        "found F32",
    );
    refused(
        problem16_from_bytes(&put("a", (Dtype::BF16, vec![2, 40, 24], vec![0; 2 * 40 * 24 * 2])), ProblemKind::Gemm),
        "a",
        "multiple of 16",
    );
    refused(
        case_from_bytes(&put("a", (Dtype::BF16, vec![2, 40, 96], vec![0; 2 * 40 * 96 * 2])), ProblemKind::Gemm),
        "b",
        "K",
    );
    // L that disagrees, a rank that is not 3.
    refused(
        case_from_bytes(&put("a", (Dtype::F16, vec![1, 40, 80], vec![0; 40 * 80 * 2])), ProblemKind::Gemm),
        "b",
        "[1, N, 40]",
    );
    refused(
        case_from_bytes(&put("a", (Dtype::F16, vec![80, 80], vec![0; 80 * 80 * 2])), ProblemKind::Gemm),
        "a",
        "expected",
    );
    // Missing activation or weight.
    let no_a = edit(&gemm, |m| {
        m.remove("a");
    });
    refused(case_from_bytes(&no_a, ProblemKind::Gemm), "a", "missing");
    let no_b = edit(&gemm, |m| {
        m.remove("b");
    });
    refused(case_from_bytes(&no_b, ProblemKind::Gemm), "b", "missing");
    // Scales or a global scale for a dense activation.
    let scale = (Dtype::F8_E4M3, vec![2, 40, 5], vec![0x38; 400]);
    refused(case_from_bytes(&put("sfa", scale), ProblemKind::Gemm), "sfa", "no scales");
    let global = (Dtype::F32, vec![], 1f32.to_le_bytes().to_vec());
    refused(case_from_bytes(&put("a_global_scale", global), ProblemKind::Gemm), "a_global_scale", "no scales");
    // GEMV: the vector has one row; its weight `a` keeps its scales.
    let gemv = problem16_to_bytes(&problem(ProblemKind::Gemv, F16)).unwrap();
    let two_rows = edit(&gemv, |m| {
        m.insert("b".into(), (Dtype::F16, vec![2, 2, 48], vec![0; 2 * 2 * 48 * 2]));
    });
    refused(case_from_bytes(&two_rows, ProblemKind::Gemv), "b", "one row");
    let vec_scales = edit(&gemv, |m| {
        m.insert("sfb".into(), (Dtype::F8_E4M3, vec![2, 1, 3], vec![0x38; 6]));
    });
    refused(case_from_bytes(&vec_scales, ProblemKind::Gemv), "sfb", "no scales");
    // Grouped: one activation type for every group, and no W4A4 group in a W4A16 case.
    let grouped = problem16_to_bytes(&problem(ProblemKind::GroupedGemm, BF16)).unwrap();
    let mixed = edit(&grouped, |m| {
        let (_, shape, bytes) = m.remove("a_g1").unwrap();
        m.insert("a_g1".into(), (Dtype::F16, shape, bytes));
    });
    refused(case_from_bytes(&mixed, ProblemKind::GroupedGemm), "a_g1", "one activation type");
    let packed = edit(&grouped, |m| {
        m.insert("a_g1".into(), (Dtype::U8, vec![1, 72, 8], vec![0; 72 * 8]));
    });
    refused(case_from_bytes(&packed, ProblemKind::GroupedGemm), "a_g1", "found U8");
    // Read as another kind: the metadata says which.
    assert!(matches!(case_from_bytes(&gemm, ProblemKind::DualGemm), Err(Error::File { .. })));
}

#[test]
fn outputs_round_trip_and_refuse_mixed_or_foreign_types() {
    for kind in ProblemKind::ALL {
        for out in [BF16, F16] {
            let outs = problem(kind, BF16).run_as(&CpuBackend, out).unwrap();
            let bytes = outputs16_to_bytes(kind, &outs).unwrap();
            assert_eq!(outputs16_from_bytes(&bytes, kind).unwrap(), outs, "{kind} {out}");
        }
    }
    let t = |d: OutputDtype| OutTensor::new(d, [1, 2, 3], vec![0x3C00; 6]).unwrap();
    assert!(outputs16_to_bytes(ProblemKind::Gemm, &[t(F16), t(F16)]).is_err(), "two outputs for a GEMM");
    assert!(outputs16_to_bytes(ProblemKind::GroupedGemm, &[]).is_err());
    assert!(outputs16_to_bytes(ProblemKind::GroupedGemm, &[t(F16), t(BF16)]).is_err(), "mixed types");
    let grouped = outputs16_to_bytes(ProblemKind::GroupedGemm, &[t(BF16), t(BF16)]).unwrap();
    let mixed = edit(&grouped, |m| {
        let (_, s, b) = m.remove("c_g1").unwrap();
        m.insert("c_g1".into(), (Dtype::F16, s, b));
    });
    refused(outputs16_from_bytes(&mixed, ProblemKind::GroupedGemm), "c_g1", "BF16");
    let single = outputs16_to_bytes(ProblemKind::Gemm, &[t(F16)]).unwrap();
    let f32_out = edit(&single, |m| {
        m.insert("c".into(), (Dtype::F32, vec![1, 2, 3], vec![0; 24]));
    });
    refused(outputs16_from_bytes(&f32_out, ProblemKind::Gemm), "c", "found F32");
}

#[test]
fn files_are_written_whole_or_not_at_all() {
    let path = tmp("case");
    let _ = std::fs::remove_file(&path);
    let p = problem(ProblemKind::DualGemm, F16);
    save_problem16(&path, &p).unwrap();
    assert_eq!(load_case(&path, ProblemKind::DualGemm).unwrap(), CaseProblem::W4a16(p.clone()));
    // The MoE form has no file form: refused, the previous file left as it was.
    let moe = generate16(&Shape::Moe { n: 8, k: 16, counts: vec![3, 0, 2] }, BF16, Tier::Exact, 1).unwrap();
    let before = std::fs::read(&path).unwrap();
    assert!(matches!(save_problem16(&path, &moe), Err(Error::Invalid(_))));
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let missing = tmp("never");
    let _ = std::fs::remove_file(&missing);
    assert!(save_problem16(&missing, &moe).is_err());
    assert!(!missing.exists(), "a refused case left a file");
    // An output refused (two tensors for one GEMM) writes nothing either.
    let outs = problem(ProblemKind::Gemm, BF16).run_as(&CpuBackend, BF16).unwrap();
    assert!(save_outputs16(&missing, ProblemKind::Gemm, &[outs[0].clone(), outs[0].clone()]).is_err());
    assert!(!missing.exists());
    save_outputs16(&missing, ProblemKind::Gemm, &outs).unwrap();
    assert_eq!(load_outputs16(&missing, ProblemKind::Gemm).unwrap(), outs);
    for f in [&path, &missing] {
        std::fs::remove_file(f).unwrap();
    }
}
