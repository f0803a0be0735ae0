//! `cargo run --example quickstart` (the README's library program) says what passed: one line
//! naming the shape, the backend and the comparison, so a user who runs it sees that it worked.

use std::path::PathBuf;
use std::process::Command;

/// The example `name`, built from the current sources (`cargo test --test quickstart` alone
/// builds no example, and an older binary may be lying there), next to this test's own binary:
/// `target/<profile>/examples/`.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps/<test>");
    let mut build = Command::new(env!("CARGO"));
    build.args(["build", "--quiet", "-p", "nvfp4", "--example", name]);
    if profile_dir.file_name().is_some_and(|d| d == "release") {
        build.arg("--release");
    }
    assert!(build.status().unwrap().success(), "cargo build --example {name}");
    profile_dir.join("examples").join(name)
}

#[test]
fn quickstart_says_what_passed() {
    let o = Command::new(example("quickstart")).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{:?}\n{text}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {text:?}");
    let line = lines[0];
    let backend = line.strip_prefix("64x96x256 GEMM on the ").and_then(|r| r.split(' ').next());
    assert!(matches!(backend, Some("cpu" | "cuda")), "{line}");
    assert!(line.contains(" backend matches the CPU reference: pass (6144 elements, max abs err "), "{line}");
}
