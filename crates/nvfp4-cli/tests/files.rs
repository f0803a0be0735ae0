//! Files the tool writes: never over its own input (however the path is spelled), always
//! through a temporary file renamed into place, so an existing file is replaced whole.

mod common;

use common::{assert_exit, nvfp4_in, Scratch};

/// Generates a small gemm case at `name` in `dir`.
fn gen(dir: &Scratch, name: &str, seed: &str) {
    let o = nvfp4_in(&dir.0, &["gen", "gemm", "--shape", "40x24x64", "--seed", seed, "-o", name]);
    assert_exit(&o, 0);
}

#[test]
fn run_and_quantize_refuse_to_write_over_their_input() {
    let dir = Scratch::new("same-file");
    gen(&dir, "x.safetensors", "1");
    std::fs::create_dir(dir.path("sub")).unwrap();
    std::fs::hard_link(dir.path("x.safetensors"), dir.path("hard.safetensors")).unwrap();
    let mut outputs = vec!["x.safetensors", "./x.safetensors", "sub/../x.safetensors", "hard.safetensors"];
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink("x.safetensors", dir.path("soft.safetensors")).unwrap();
        outputs.push("soft.safetensors");
    }
    let abs = dir.path("x.safetensors").display().to_string();
    outputs.push(&abs);
    let before = std::fs::read(dir.path("x.safetensors")).unwrap();
    let listing = dir.listing();
    for out in &outputs {
        // With --backend cuda the refusal still comes first: no backend is opened, nothing read.
        for backend in ["cpu", "cuda"] {
            let o = nvfp4_in(&dir.0, &["run", "gemm", "-i", "x.safetensors", "-o", out, "--backend", backend]);
            let err = assert_exit(&o, 1);
            assert!(err.contains("is the input"), "run -o {out}: {err}");
            assert!(!err.contains("backend:"), "run -o {out} opened a backend first: {err}");
        }
        let o = nvfp4_in(&dir.0, &["quantize", "-i", "x.safetensors", "-o", out]);
        let err = assert_exit(&o, 1);
        assert!(err.contains("is the input"), "quantize -o {out}: {err}");
    }
    assert_eq!(std::fs::read(dir.path("x.safetensors")).unwrap(), before, "the input is unchanged");
    assert_eq!(dir.listing(), listing, "nothing written");
}

#[test]
fn outputs_replace_existing_files_whole() {
    // A hard link to the old file keeps the old bytes: the tool wrote a new file and renamed it
    // over the old name instead of truncating and rewriting the old file in place.
    let dir = Scratch::new("replace");
    gen(&dir, "case.safetensors", "1");
    std::fs::hard_link(dir.path("case.safetensors"), dir.path("old-case.safetensors")).unwrap();
    let old = std::fs::read(dir.path("case.safetensors")).unwrap();
    gen(&dir, "case.safetensors", "2");
    assert_eq!(std::fs::read(dir.path("old-case.safetensors")).unwrap(), old);
    assert_ne!(std::fs::read(dir.path("case.safetensors")).unwrap(), old);

    gen(&dir, "other.safetensors", "3");
    std::fs::hard_link(dir.path("other.safetensors"), dir.path("old-out.safetensors")).unwrap();
    let o = nvfp4_in(&dir.0, &["run", "gemm", "-i", "case.safetensors", "-o", "other.safetensors", "--backend", "cpu"]);
    assert_exit(&o, 0);
    let out = nvfp4::io::load_output(&dir.path("other.safetensors"), nvfp4::ProblemKind::Gemm).unwrap();
    assert_eq!(out.tensors()[0].shape(), [1, 40, 24]);
    let kept = nvfp4::io::load_problem(&dir.path("old-out.safetensors"), nvfp4::ProblemKind::Gemm);
    assert!(kept.is_ok(), "the old file under its second name is intact: {kept:?}");

    let o = nvfp4_in(&dir.0, &["quantize", "-i", "case.safetensors", "-o", "other.safetensors"]);
    assert_exit(&o, 0);
    assert!(nvfp4::io::load_problem(&dir.path("old-out.safetensors"), nvfp4::ProblemKind::Gemm).is_ok());
    assert_eq!(
        dir.listing(),
        vec!["case.safetensors", "old-case.safetensors", "old-out.safetensors", "other.safetensors"],
        "no temporary file left behind"
    );
}

#[test]
fn a_failing_run_leaves_the_existing_output_alone() {
    // The case is malformed (a gap in its groups), so the run fails after the output path was
    // accepted: the file already at that path must survive untouched.
    let dir = Scratch::new("failing");
    let o = nvfp4_in(&dir.0, &["gen", "grouped-gemm", "--shape", "8,8,8/16/32", "-o", "g.safetensors"]);
    assert_exit(&o, 0);
    let bytes = std::fs::read(dir.path("g.safetensors")).unwrap();
    let edited = rename_tensors(&bytes, &[("a_g1", "a_g5")]);
    std::fs::write(dir.path("gap.safetensors"), edited).unwrap();
    std::fs::write(dir.path("out.safetensors"), b"precious").unwrap();
    let o = nvfp4_in(&dir.0, &["run", "grouped-gemm", "-i", "gap.safetensors", "-o", "out.safetensors"]);
    let err = assert_exit(&o, 1);
    assert!(err.contains("a_g1"), "{err}");
    assert_eq!(std::fs::read(dir.path("out.safetensors")).unwrap(), b"precious");
    assert_eq!(dir.listing(), vec!["g.safetensors", "gap.safetensors", "out.safetensors"]);
}

/// The safetensors file `bytes` with tensors renamed.
fn rename_tensors(bytes: &[u8], renames: &[(&str, &str)]) -> Vec<u8> {
    let st = safetensors::SafeTensors::deserialize(bytes).unwrap();
    let views: Vec<(String, safetensors::tensor::TensorView)> = st
        .tensors()
        .into_iter()
        .map(|(name, v)| {
            let name = renames.iter().find(|(from, _)| *from == name).map_or(name, |(_, to)| to.to_string());
            (name, v)
        })
        .collect();
    safetensors::serialize(views, None).unwrap()
}
