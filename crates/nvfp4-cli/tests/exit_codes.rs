//! Exit status: 0 success, 1 a well-formed command that failed, 2 a command line that no run
//! could accept (found from the arguments alone, before any work). The rule covers values
//! checked by the tool after parsing (a catalogue index out of range, a shape breaking the
//! format's rules, a non-finite alpha) exactly as those the parser rejects itself.

mod common;

use common::{assert_exit, nvfp4_in, stdout, Scratch};

#[test]
fn usage_errors_exit_2_and_write_nothing() {
    let dir = Scratch::new("usage");
    let gen = |extra: &[&str]| {
        let mut args = vec!["gen", "gemm", "-o", "out.safetensors"];
        args.extend_from_slice(extra);
        nvfp4_in(&dir.0, &args)
    };
    for (extra, needle) in [
        (&["--case", "foo:1"][..], "foo:1"),
        (&["--case", "test:99"], "test:99"),
        (&["--case", "bench:3"], "bench:3"),
        (&["--case", "test"], "test"),
        (&["--shape", "12x12x12"], "multiple of 16"),
        (&["--shape", "0x16x16"], ">= 1"),
        (&["--shape", "8x8"], "8x8"),
        (&["--shape", "8x8"], "expected MxNxK or MxNxKxL"),
        (&["--case", "test:0", "--alpha", "nan"], "finite"),
        (&["--case", "test:0", "--alpha", "inf"], "finite"),
        (&["--case", "test:0", "--alpha", "-inf"], "finite"),
        (&["--case", "test:0", "--alpha", "1e-46"], "rounds to 0"),
        (&["--case", "test:0", "--alpha", "-1e-400"], "rounds to 0"),
        (&["--case", "test:0", "--alpha", "1e39"], "overflows"),
        (&["--case", "test:0", "--scales", "tiled"], "tiled"),
        (&["--case", "test:0", "--no-such-flag"], "no-such-flag"),
        (&[], "--case"),
    ] {
        let err = assert_exit(&gen(extra), 2);
        assert!(err.contains(needle), "{extra:?}: `{needle}` not in {err}");
        assert!(err.contains("--help"), "{extra:?}: a usage error points at --help: {err}");
    }
    // The grouped GEMM's MoE form has no case-file form; an all-empty routing has no tokens.
    for (shape, needle) in [
        ("moe:4,0,8/64/32", "no MoE form"),
        ("moe:0,0/64/32", "no tokens"),
        ("8,8/8", "expected m1,m2,../n1,../k1,.. (one N or K for every group) or moe:c1,c2,../N/K"),
        ("moe:8/8", "or moe:c1,c2,../N/K"),
    ] {
        let err =
            assert_exit(&nvfp4_in(&dir.0, &["gen", "grouped-gemm", "--shape", shape, "-o", "moe.safetensors"]), 2);
        assert!(err.contains(needle), "{shape}: `{needle}` not in {err}");
    }
    for args in [&["frobnicate"][..], &[], &["check", "matmul"], &["run", "gemm"], &["check", "--backend", "tpu"]] {
        assert_exit(&nvfp4_in(&dir.0, args), 2);
    }
    assert!(dir.listing().is_empty(), "{:?}", dir.listing());
    // A negative finite alpha is a value, not a flag; 0 is a value too, however it is written.
    assert_exit(&gen(&["--case", "test:0", "--alpha", "-0.5"]), 0);
    assert_exit(&gen(&["--case", "test:0", "--alpha", "0e-400"]), 0);
}

#[test]
fn a_case_whose_factor_overflows_is_refused_not_run_into_nan() {
    // Global scales of 3e38 are each finite, but alpha × global(a) × global(b) overflows f32 and
    // exact zeros came out NaN (0 × inf). A global scale of 0 or below breaks the checkpoints'
    // rule, now the one rule.
    let dir = Scratch::new("factor");
    assert_exit(&nvfp4_in(&dir.0, &["gen", "gemm", "--shape", "40x24x64", "-o", "ok.safetensors"]), 0);
    let bytes = std::fs::read(dir.path("ok.safetensors")).unwrap();
    for (name, scalars, needle) in [
        ("big", &[("a_global_scale", 3e38f32), ("b_global_scale", 3e38)][..], "overflows"),
        ("zero", &[("b_global_scale", 0.0)], "finite and > 0"),
        ("negative", &[("a_global_scale", -1.0)], "finite and > 0"),
    ] {
        let file = format!("{name}.safetensors");
        std::fs::write(dir.path(&file), with_scalars(&bytes, scalars)).unwrap();
        let o = nvfp4_in(&dir.0, &["run", "gemm", "-i", &file, "-o", "out.safetensors", "--backend", "cpu"]);
        let err = assert_exit(&o, 1);
        assert!(err.contains(needle), "{name}: `{needle}` not in {err}");
        assert!(!dir.path("out.safetensors").exists(), "{name}: an output was written");
    }
}

/// The safetensors file `bytes` with F32 scalars added (metadata kept).
fn with_scalars(bytes: &[u8], scalars: &[(&str, f32)]) -> Vec<u8> {
    let (_, meta) = safetensors::SafeTensors::read_metadata(bytes).unwrap();
    let st = safetensors::SafeTensors::deserialize(bytes).unwrap();
    let words: Vec<[u8; 4]> = scalars.iter().map(|(_, v)| v.to_le_bytes()).collect();
    let mut views = st.tensors();
    for ((name, _), w) in scalars.iter().zip(&words) {
        views.push((
            name.to_string(),
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![], w).unwrap(),
        ));
    }
    safetensors::serialize(views, meta.metadata().clone()).unwrap()
}

#[test]
fn failures_exit_1_and_success_exits_0() {
    let dir = Scratch::new("failures");
    assert_exit(&nvfp4_in(&dir.0, &["gen", "gemm", "--case", "test:0", "-o", "ok.safetensors"]), 0);
    assert_exit(&nvfp4_in(&dir.0, &["gen", "grouped-gemm", "--case", "bench:3", "-o", "g.safetensors"]), 0);
    std::fs::write(dir.path("garbage.safetensors"), b"not a safetensors file").unwrap();
    for args in [
        &["run", "gemm", "-i", "missing.safetensors", "-o", "out.safetensors"][..],
        &["run", "gemm", "-i", "garbage.safetensors", "-o", "out.safetensors"],
        &["run", "gemv", "-i", "ok.safetensors", "-o", "out.safetensors"],
        &["quantize", "-i", "missing.safetensors", "-o", "out.safetensors"],
        &["quantize", "-i", "ok.safetensors", "-o", "out.safetensors", "--strict"],
    ] {
        let err = assert_exit(&nvfp4_in(&dir.0, args), 1);
        assert!(err.starts_with("error: ") || err.contains("\nerror: "), "{args:?}: {err}");
    }
    assert_exit(
        &nvfp4_in(&dir.0, &["run", "gemm", "-i", "ok.safetensors", "-o", "out.safetensors", "--backend", "cpu"]),
        0,
    );
    for help in [&["--help"][..], &["gen", "--help"], &["--version"]] {
        assert_exit(&nvfp4_in(&dir.0, help), 0);
    }
}

#[test]
fn help_documents_the_exit_status() {
    let o = nvfp4_in(&std::env::temp_dir(), &["--help"]);
    assert_exit(&o, 0);
    let help = stdout(&o);
    for needle in ["Exit status", "0 success", "1 the command failed", "2 usage error"] {
        assert!(help.contains(needle), "`{needle}` not in:\n{help}");
    }
}
