//! What the tool tells its user: `gen` reports the size of the file it wrote, `--json` prints one
//! JSON document on stdout for every subcommand that takes the flag, `check` on the CPU backend
//! says what that comparison shows and what it does not, `kernels --help` says how to get NVRTC.

mod common;

use common::{assert_exit, nvfp4_in, stdout, Scratch};

#[test]
fn gen_reports_the_size_of_the_written_file() {
    let dir = Scratch::new("gen-size");
    for (kind, shape, scales) in [("gemm", "512x4096x512", "plain"), ("dual-gemm", "130x72x256", "blocked")] {
        let o = nvfp4_in(&dir.0, &["gen", kind, "--shape", shape, "--scales", scales, "-o", "case.safetensors"]);
        assert_exit(&o, 0);
        let size = std::fs::metadata(dir.path("case.safetensors")).unwrap().len();
        let text = stdout(&o);
        assert!(text.contains(&format!("({size} bytes, {:.1} MB)", size as f64 / 1e6)), "{size}: {text}");
        let o =
            nvfp4_in(&dir.0, &["gen", kind, "--shape", shape, "--scales", scales, "-o", "case.safetensors", "--json"]);
        let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
        assert_eq!(v["file_bytes"], size);
    }
}

#[test]
fn every_json_flag_prints_one_document() {
    let dir = Scratch::new("json");
    let docs = [
        &["gen", "gemv", "--case", "test:0", "-o", "case.safetensors", "--json"][..],
        &["run", "gemv", "-i", "case.safetensors", "-o", "out.safetensors", "--backend", "cpu", "--json"],
        &["quantize", "-i", "case.safetensors", "-o", "q.safetensors", "--json"],
        &["check", "gemv", "--backend", "cpu", "--spec-only", "--json"],
    ];
    for args in docs {
        let o = nvfp4_in(&dir.0, args);
        assert_exit(&o, 0);
        let text = stdout(&o);
        let v: Result<serde_json::Value, _> = serde_json::from_str(text.trim());
        assert!(matches!(v, Ok(serde_json::Value::Object(_))), "{args:?} printed:\n{text}");
    }
    // `kernels` and `bench` need NVRTC or a GPU to produce anything; their help lists the flag.
    for sub in ["kernels", "bench"] {
        let o = nvfp4_in(&dir.0, &[sub, "--help"]);
        assert!(stdout(&o).contains("--json"), "{sub} --help");
    }
}

#[test]
fn check_on_the_cpu_backend_says_what_it_shows() {
    let dir = Scratch::new("check-note");
    let o = nvfp4_in(&dir.0, &["check", "gemv", "--backend", "cpu", "--spec-only"]);
    assert_exit(&o, 0);
    let text = stdout(&o);
    for needle in ["reference itself", "tests no GPU kernel", "blocked scales", "does not show", "--backend cuda"] {
        assert!(text.contains(needle), "`{needle}` not in:\n{text}");
    }
    let o = nvfp4_in(&dir.0, &["check", "gemv", "--backend", "cpu", "--spec-only", "--json"]);
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert!(v["what_this_shows"].as_str().unwrap().contains("tests no GPU kernel"));
}

#[test]
fn kernels_help_says_how_to_get_nvrtc() {
    let o = nvfp4_in(&std::env::temp_dir(), &["kernels", "--help"]);
    assert_exit(&o, 0);
    let help = stdout(&o);
    for needle in
        ["NVRTC", "libnvrtc.so", "nvidia-cuda-nvrtc==13.0.88", "nvidia/cu13/lib", "LD_LIBRARY_PATH", "not a GPU"]
    {
        assert!(help.contains(needle), "`{needle}` not in:\n{help}");
    }
    assert!(!help.contains("no GPU needed)"), "{help}");
}
