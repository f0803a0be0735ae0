//! Where outputs go: a FIFO or a character device named by `-o` (or reached through a symbolic
//! link) is written in place and stays what it was; an output that cannot be written (a folder, a
//! missing folder, a path through a file, a read-only file, a block device) is refused before any
//! work, naming the output, and nothing is changed.
//!
//! The devices are made in the scratch folder (`mknod`, which needs root): these tests never
//! write to the system's own `/dev` nodes. Where `mknod` is refused the test says so and skips.

mod common;

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use common::{assert_exit, nvfp4_in, stdout, Scratch};

/// A 40x24x64 gemm case, seed 1, as `gen` writes it.
const GEN: [&str; 6] = ["gen", "gemm", "--shape", "40x24x64", "--seed", "1"];

fn gen_to(dir: &Scratch, out: &str) -> std::process::Output {
    let mut args = GEN.to_vec();
    args.extend(["-o", out]);
    nvfp4_in(&dir.0, &args)
}

/// Makes a device node `name` in `dir` (`kind` "c" or "b"), or says why it cannot.
fn mknod(dir: &Scratch, name: &str, kind: &str, major: &str, minor: &str) -> Result<(), String> {
    let path = dir.path(name);
    let o = Command::new("mknod").arg(&path).args([kind, major, minor]).output().map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    // A folder on a `nodev` mount holds the node but refuses to open it.
    if kind == "c" {
        std::fs::OpenOptions::new().write(true).open(&path).map_err(|e| format!("cannot open it: {e}"))?;
    }
    Ok(())
}

fn reads_fifo_in_background(path: &Path) -> mpsc::Receiver<std::io::Result<Vec<u8>>> {
    let (tx, rx) = mpsc::channel();
    let path = path.to_path_buf();
    // On today's failure (the FIFO replaced by a file) this thread stays blocked in open: the
    // test fails on the timeout below instead of hanging.
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::read(path));
    });
    rx
}

#[test]
fn a_fifo_is_written_in_place() {
    let dir = Scratch::new("fifo");
    assert_exit(&gen_to(&dir, "case.safetensors"), 0);
    let want = std::fs::read(dir.path("case.safetensors")).unwrap();
    let made = Command::new("mkfifo").arg(dir.path("pipe")).status().unwrap();
    assert!(made.success(), "mkfifo");
    std::os::unix::fs::symlink("pipe", dir.path("pipe.link")).unwrap();
    for out in ["pipe", "pipe.link"] {
        let rx = reads_fifo_in_background(&dir.path("pipe"));
        assert_exit(&gen_to(&dir, out), 0);
        let got = rx.recv_timeout(Duration::from_secs(60)).expect("nothing was written into the FIFO").unwrap();
        assert_eq!(got, want, "-o {out}: the FIFO carried the case file");
        assert!(std::fs::metadata(dir.path("pipe")).unwrap().file_type().is_fifo(), "-o {out}: still a FIFO");
    }
    assert!(std::fs::symlink_metadata(dir.path("pipe.link")).unwrap().file_type().is_symlink());
    assert_eq!(dir.listing(), vec!["case.safetensors", "pipe", "pipe.link"], "no temporary file left");
}

#[test]
fn a_character_device_is_written_in_place() {
    // /dev/null is only looked at here: the node written to is a copy of it (1, 3) in the scratch
    // folder, so that today's failure replaces that copy and never the system's.
    assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device());
    let dir = Scratch::new("chardev");
    if let Err(why) = mknod(&dir, "null", "c", "1", "3") {
        eprintln!("skipped: cannot make a character device in {}: {why}", dir.0.display());
        return;
    }
    let rdev = std::fs::metadata(dir.path("null")).unwrap().rdev();
    std::os::unix::fs::symlink("null", dir.path("null.link")).unwrap();
    assert_exit(&gen_to(&dir, "case.safetensors"), 0);
    let runs: [&[&str]; 4] = [
        &GEN,
        &["run", "gemm", "-i", "case.safetensors", "--backend", "cpu"],
        &["quantize", "-i", "case.safetensors"],
        &["run", "gemm", "-i", "case.safetensors", "--backend", "cpu"],
    ];
    for (args, out) in runs.iter().zip(["null", "null.link", "null", "null"]) {
        let mut args = args.to_vec();
        args.extend(["-o", out]);
        assert_exit(&nvfp4_in(&dir.0, &args), 0);
        let meta = std::fs::metadata(dir.path("null")).unwrap();
        assert!(meta.file_type().is_char_device(), "{args:?}: the device was replaced");
        assert_eq!(meta.rdev(), rdev, "{args:?}");
        assert!(std::fs::symlink_metadata(dir.path("null.link")).unwrap().file_type().is_symlink());
    }
    // A stream's size says nothing: no byte count is made up for it.
    let mut args = GEN.to_vec();
    args.extend(["-o", "null", "--json"]);
    let v: serde_json::Value = serde_json::from_str(stdout(&nvfp4_in(&dir.0, &args)).trim()).unwrap();
    assert_eq!(v["file_bytes"], serde_json::Value::Null);
    let o = nvfp4_in(&dir.0, &["quantize", "-i", "case.safetensors", "-o", "null.link", "--json"]);
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["output_bytes"], serde_json::Value::Null);
    assert_eq!(dir.listing(), vec!["case.safetensors", "null", "null.link"], "no temporary file left");
}

/// Runs `args` + `-o out` (or `--json out` for bench) and asserts that it failed on the output,
/// before any work: the message names the output and `needle`, not the input or the backend.
#[track_caller]
fn refused(dir: &Scratch, args: &[&str], flag: &str, out: &str, needle: &str) {
    let mut all = args.to_vec();
    all.extend([flag, out]);
    let err = assert_exit(&nvfp4_in(&dir.0, &all), 1);
    assert!(err.contains(out.trim_end_matches('/')) && err.contains(needle), "{all:?}: `{needle}` not in {err}");
    for early in ["garbage", "needs", "CUDA", "backend"] {
        assert!(!err.contains(early), "{all:?}: did work before checking the output: {err}");
    }
}

#[test]
fn an_output_that_cannot_be_written_is_refused_before_any_work() {
    let dir = Scratch::new("unwritable");
    std::fs::create_dir(dir.path("sub")).unwrap();
    std::fs::write(dir.path("file"), b"x").unwrap();
    std::fs::write(dir.path("garbage.safetensors"), b"not a safetensors file").unwrap();
    let mut outputs = vec![
        ("sub", "folder"),
        ("sub/", "folder"),
        ("missing/out.safetensors", "does not exist"),
        ("file/out.safetensors", "not a folder"),
    ];
    match mknod(&dir, "block", "b", "7", "255") {
        Ok(()) => outputs.push(("block", "block device")),
        Err(why) => eprintln!("skipped the block device: {why}"),
    }
    let listing = dir.listing();
    // Each command would fail later on its own (an unreadable input, a shape beyond memory, no
    // GPU): the output's error coming instead shows it was checked first.
    let huge = ["gen", "gemm", "--shape", "2000000x2000000x2000000"];
    let commands: [(&[&str], &str); 4] = [
        (&huge, "-o"),
        (&["run", "gemm", "-i", "garbage.safetensors", "--backend", "cpu"], "-o"),
        (&["quantize", "-i", "garbage.safetensors"], "-o"),
        (&["bench", "gemm"], "--json"),
    ];
    for (out, needle) in &outputs {
        for (args, flag) in commands {
            refused(&dir, args, flag, out, needle);
        }
    }
    assert_eq!(dir.listing(), listing, "nothing written");
}

#[test]
fn a_read_only_output_file_is_refused_not_replaced() {
    // The mode bits decide, so this holds when the tests run as root (which may write anyway).
    let dir = Scratch::new("read-only");
    std::fs::write(dir.path("garbage.safetensors"), b"not a safetensors file").unwrap();
    std::fs::write(dir.path("ro.safetensors"), b"precious").unwrap();
    std::fs::set_permissions(dir.path("ro.safetensors"), std::fs::Permissions::from_mode(0o444)).unwrap();
    let huge = ["gen", "gemm", "--shape", "2000000x2000000x2000000"];
    refused(&dir, &huge, "-o", "ro.safetensors", "read-only");
    refused(&dir, &["run", "gemm", "-i", "garbage.safetensors"], "-o", "ro.safetensors", "read-only");
    refused(&dir, &["quantize", "-i", "garbage.safetensors"], "-o", "ro.safetensors", "read-only");
    // A run that would succeed is refused too, and the file keeps its bytes and mode.
    refused(&dir, &GEN, "-o", "ro.safetensors", "read-only");
    assert_eq!(std::fs::read(dir.path("ro.safetensors")).unwrap(), b"precious");
    assert_eq!(std::fs::metadata(dir.path("ro.safetensors")).unwrap().permissions().mode() & 0o777, 0o444);
    assert_eq!(dir.listing(), vec!["garbage.safetensors", "ro.safetensors"]);
}
