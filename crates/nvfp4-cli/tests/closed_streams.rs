//! A reader that goes away (`nvfp4 check | head -1`) is not a failure: with stdout or stderr
//! closed, every subcommand finishes its work (files included) and exits with its own status, no
//! panic and no message. A stdout that fails otherwise (a full disk) is an error, exit status 1.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{assert_exit, nvfp4_in, Scratch};

/// Which stream of the child is the write end of a pipe whose read end is already closed.
#[derive(Clone, Copy, Debug)]
enum Closed {
    Stdout,
    Stderr,
    Both,
}

/// Runs `nvfp4 args..` in `dir` with `closed` closed by its reader; the other stream is captured.
fn run_closed(dir: &Path, args: &[&str], closed: Closed) -> Output {
    let closed_pipe = || {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        Stdio::from(writer)
    };
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nvfp4"));
    cmd.args(args).current_dir(dir).env_remove("RUST_BACKTRACE");
    match closed {
        Closed::Stdout => cmd.stdout(closed_pipe()).stderr(Stdio::piped()),
        Closed::Stderr => cmd.stdout(Stdio::piped()).stderr(closed_pipe()),
        Closed::Both => cmd.stdout(closed_pipe()).stderr(closed_pipe()),
    };
    cmd.output().expect("run the nvfp4 binary")
}

/// A grouped case of many groups (`run` prints one shape per group) and a dense file of many
/// tensors that `quantize` skips (it names each one).
fn inputs(dir: &Scratch) {
    let ms = vec!["16"; 300].join(",");
    let shape = format!("{ms}/16/32");
    let o = nvfp4_in(&dir.0, &["gen", "grouped-gemm", "--shape", &shape, "-o", "groups.safetensors"]);
    assert_exit(&o, 0);
    let data = [0u8; 12];
    let views: Vec<(String, safetensors::tensor::TensorView)> = (0..300)
        .map(|i| {
            let v = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![3], &data).unwrap();
            (format!("bias{i}"), v)
        })
        .collect();
    std::fs::write(dir.path("dense.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
}

#[test]
fn a_closed_stdout_or_stderr_ends_quietly_with_the_commands_status() {
    let dir = Scratch::new("closed");
    inputs(&dir);
    let commands: [(&[&str], i32, Option<&str>); 8] = [
        (&["check", "gemv", "--backend", "cpu", "--spec-only"], 0, None),
        (&["check", "gemv", "--backend", "cpu", "--spec-only", "--json"], 0, None),
        (&["gen", "gemm", "--case", "test:0", "-o", "gen.safetensors"], 0, Some("gen.safetensors")),
        (
            &["run", "grouped-gemm", "-i", "groups.safetensors", "-o", "run.safetensors", "--backend", "cpu"],
            0,
            Some("run.safetensors"),
        ),
        (&["quantize", "-i", "dense.safetensors", "-o", "q.safetensors"], 0, Some("q.safetensors")),
        (&["--help"], 0, None),
        (&["run", "gemm", "-i", "missing.safetensors", "-o", "x.safetensors"], 1, None),
        (&["gen", "gemm", "--shape", "8x8", "-o", "x.safetensors"], 2, None),
    ];
    for closed in [Closed::Stdout, Closed::Stderr, Closed::Both] {
        for (args, code, written) in commands {
            if let Some(f) = written {
                let _ = std::fs::remove_file(dir.path(f));
            }
            let o = run_closed(&dir.0, args, closed);
            let said = String::from_utf8_lossy(if matches!(closed, Closed::Stdout) { &o.stderr } else { &o.stdout });
            assert_eq!(o.status.code(), Some(code), "{args:?} with {closed:?} closed: {:?}\n{said}", o.status);
            assert!(!said.contains("panicked") && !said.contains("Broken pipe"), "{args:?} {closed:?}: {said}");
            if let Some(f) = written {
                assert!(dir.path(f).is_file(), "{args:?} {closed:?}: the work was not finished");
            }
        }
    }
}

#[test]
fn a_stdout_that_fails_otherwise_is_an_error() {
    // /dev/full is opened here as any program's stdout would be; it is never the tool's `-o`.
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipped: no /dev/full on this system");
        return;
    };
    let dir = Scratch::new("full");
    let o = Command::new(env!("CARGO_BIN_EXE_nvfp4"))
        .args(["gen", "gemm", "--case", "test:0", "-o", "gen.safetensors"])
        .current_dir(&dir.0)
        .stdout(full)
        .output()
        .unwrap();
    let err = assert_exit(&o, 1);
    assert!(err.contains("stdout") && err.contains("No space left"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
