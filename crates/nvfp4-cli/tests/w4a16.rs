//! W4A16 on the command line: `gen --act bf16|f16 [--tier ..]` writes a case that `run` runs to
//! the check's reference (on the CPU backend), its usage errors come before any work, a malformed
//! case fails with nothing written, and `check --mode w4a16` runs and reports the W4A16 cases.

mod common;

use common::{assert_exit, nvfp4_in, stdout, Scratch};
use nvfp4::check::reference16::reference16;
use nvfp4::io::{load_case, load_outputs16, CaseProblem};
use nvfp4::{OutputDtype, ProblemKind};

#[test]
fn gen_then_run_gives_the_reference() {
    let dir = Scratch::new("w4a16-roundtrip");
    let runs: [(&str, &str, &[&str], Option<&str>); 6] = [
        ("gemv", "130x4112x3", &["--act", "f16"], None),
        ("gemm", "40x72x48x2", &["--act", "bf16", "--scales", "blocked", "--alpha", "0.5"], Some("f16")),
        ("gemm", "1x130x256", &["--act", "f16", "--tier", "random"], Some("bf16")),
        ("dual-gemm", "7x40x48", &["--act", "bf16", "--tier", "random"], None),
        ("grouped-gemm", "7,40/72/48,16", &["--act", "f16", "--tier", "exact"], None),
        (
            "grouped-gemm",
            "1,130/7,257/16,48",
            &["--act", "bf16", "--tier", "random", "--scales", "blocked"],
            Some("f16"),
        ),
    ];
    for (kind, shape, extra, out_dtype) in runs {
        let mut args = vec!["gen", kind, "--shape", shape, "-o", "case.safetensors"];
        args.extend(extra);
        let text = stdout(&nvfp4_in(&dir.0, &args));
        assert!(text.contains("W4A16"), "{args:?}: {text}");
        let mut run =
            vec!["run", kind, "-i", "case.safetensors", "-o", "out.safetensors", "--backend", "cpu", "--json"];
        if let Some(d) = out_dtype {
            run.extend(["--out-dtype", d]);
        }
        let o = nvfp4_in(&dir.0, &run);
        assert_exit(&o, 0);
        let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
        let kind: ProblemKind = kind.parse().unwrap();
        let CaseProblem::W4a16(p) = load_case(&dir.path("case.safetensors"), kind).unwrap() else {
            panic!("{args:?}: not a W4A16 case")
        };
        let act = p.act_dtype();
        let want_dtype = match out_dtype {
            Some("bf16") => OutputDtype::Bf16,
            Some(_) => OutputDtype::F16,
            None => act,
        };
        assert_eq!(v["mode"], "w4a16");
        assert_eq!(v["output_dtype"], if want_dtype == OutputDtype::Bf16 { "bf16" } else { "f16" });
        let got = load_outputs16(&dir.path("out.safetensors"), kind).unwrap();
        assert_eq!(got, reference16(&p, want_dtype).unwrap(), "{args:?}");
    }
}

#[test]
fn usage_errors_come_first_and_bad_cases_write_nothing() {
    let dir = Scratch::new("w4a16-errors");
    for args in [
        &["gen", "gemm", "--shape", "8x8x32", "--tier", "random", "-o", "x.safetensors"][..],
        &["gen", "gemm", "--shape", "1x1x116512", "--act", "bf16", "-o", "x.safetensors"],
        &["gen", "gemm", "--shape", "8x8x32", "--act", "fp8", "-o", "x.safetensors"],
        &["gen", "grouped-gemm", "--shape", "moe:3,4/8/32", "--act", "bf16", "-o", "x.safetensors"],
        &["check", "--mode", "w4a4", "--tier", "exact", "--backend", "cpu"],
        &["check", "--mode", "w4a8", "--backend", "cpu"],
        &["run", "gemm", "-i", "x.safetensors", "-o", "y.safetensors", "--out-dtype", "f32"],
    ] {
        assert_exit(&nvfp4_in(&dir.0, args), 2);
    }
    assert!(dir.listing().is_empty(), "{:?}", dir.listing());
    // The exact tier's K bound leaves the random tier free.
    let o = nvfp4_in(
        &dir.0,
        &["gen", "gemm", "--shape", "1x1x116512", "--act", "bf16", "--tier", "random", "-o", "k.safetensors"],
    );
    assert_exit(&o, 0);
    // A W4A4 case has an f16 output file only; a W4A16 case read as another kind is refused.
    assert_exit(&nvfp4_in(&dir.0, &["gen", "gemm", "--shape", "8x8x32", "-o", "w4a4.safetensors"]), 0);
    let o = nvfp4_in(
        &dir.0,
        &["run", "gemm", "-i", "w4a4.safetensors", "-o", "y.safetensors", "--out-dtype", "bf16", "--backend", "cpu"],
    );
    assert!(assert_exit(&o, 1).contains("W4A4"));
    assert_exit(
        &nvfp4_in(&dir.0, &["gen", "gemm", "--shape", "8x8x32", "--act", "bf16", "-o", "w4a16.safetensors"]),
        0,
    );
    let o =
        nvfp4_in(&dir.0, &["run", "dual-gemm", "-i", "w4a16.safetensors", "-o", "y.safetensors", "--backend", "cpu"]);
    assert_exit(&o, 1);
    // A dense activation with scales: refused by name, nothing written.
    let bytes = std::fs::read(dir.path("w4a16.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let sfa = [0x38u8; 16];
    let mut views: Vec<(String, safetensors::tensor::TensorView)> = st.tensors();
    views.push((
        "sfa".into(),
        safetensors::tensor::TensorView::new(safetensors::Dtype::F8_E4M3, vec![1, 8, 2], &sfa).unwrap(),
    ));
    std::fs::write(dir.path("bad.safetensors"), safetensors::serialize(views, meta.metadata().clone()).unwrap())
        .unwrap();
    let o = nvfp4_in(&dir.0, &["run", "gemm", "-i", "bad.safetensors", "-o", "y.safetensors", "--backend", "cpu"]);
    assert!(assert_exit(&o, 1).contains("`sfa`"));
    assert!(!dir.path("y.safetensors").exists(), "a failed run wrote its output");
}

#[test]
fn check_runs_and_reports_the_w4a16_cases() {
    let dir = Scratch::new("w4a16-check");
    let o = nvfp4_in(&dir.0, &["check", "gemv", "--mode", "w4a16", "--spec-only", "--backend", "cpu", "--json"]);
    assert_exit(&o, 0);
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let cases = v["cases"].as_array().unwrap();
    assert_eq!(cases.len(), nvfp4::problem::test_shapes(ProblemKind::Gemv).len());
    assert!(cases.iter().all(|c| c["mode"] == "w4a16" && c["passed"] == true));
    for tier in ["exact", "random"] {
        assert!(cases.iter().any(|c| c["tier"] == tier), "no {tier} case");
    }
    assert!(cases.iter().any(|c| c["tier"] == "exact" && c["compare"] == "bit-exact"));
    assert!(v["what_each_mode_shows"]["w4a16"].as_str().unwrap().contains("reference computed inside the check"));
    // One tier only; the text table names the mode and the data.
    let o = nvfp4_in(&dir.0, &["check", "gemv", "--tier", "random", "--spec-only", "--backend", "cpu"]);
    assert_exit(&o, 0);
    let text = stdout(&o);
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("gemv ") && l.contains("test:")).collect();
    assert!(!rows.is_empty() && rows.iter().all(|l| l.contains(" w4a16 ") && l.contains(" random ")), "{text}");
    assert!(text.contains("gemv w4a16: ") && !text.contains("gemv w4a4: "), "{text}");
}
