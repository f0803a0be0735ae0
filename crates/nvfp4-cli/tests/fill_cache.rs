//! `nvfp4 kernels --fill-cache`: with no cache folder configured it refuses, naming the variables
//! that set one; with one, it either stores each compiled kernel file there under the name a
//! launch looks for (NVRTC present) or fails with a clear error (NVRTC absent), never a panic; a
//! filter that matches no kernel file is refused, and the report's flags do not combine with it.

mod common;

use std::process::Command;

use common::{assert_exit, stderr, stdout, Scratch};

fn fill(dir: &Scratch, env: &[(&str, &std::path::Path)], only: &str) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nvfp4"));
    c.args(["kernels", "--fill-cache", "--only", only]).current_dir(&dir.0);
    for var in ["NVFP4_CACHE_DIR", "XDG_CACHE_HOME", "HOME", "RUST_BACKTRACE"] {
        c.env_remove(var);
    }
    c.envs(env.iter().copied()).output().expect("run the nvfp4 binary")
}

#[test]
fn without_a_cache_folder_it_says_which_variable_sets_one() {
    let dir = Scratch::new("fill-no-dir");
    let o = fill(&dir, &[], "gemv16");
    let err = assert_exit(&o, 1);
    assert!(err.contains("NVFP4_CACHE_DIR"), "{err}");
    assert!(dir.listing().is_empty(), "{:?}", dir.listing());
}

#[test]
fn fills_the_folder_or_says_why_not() {
    let dir = Scratch::new("fill");
    let cache = dir.path("cubins");
    let o = fill(&dir, &[("NVFP4_CACHE_DIR", &cache)], "gemv16.cu");
    match o.status.code() {
        Some(0) => {
            let names: Vec<String> = std::fs::read_dir(&cache)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            // One module, stored as `<file stem>-<64 hex digits>.cubin`, no temporary left.
            assert_eq!(names.len(), 1, "{names:?}");
            let key = names[0].strip_prefix("gemv16-").and_then(|n| n.strip_suffix(".cubin")).unwrap_or("");
            assert!(key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()), "{names:?}");
            assert!(stdout(&o).contains("1 kernel files, 1 compiled now"), "{}", stdout(&o));
            // A second fill finds it there.
            let again = fill(&dir, &[("NVFP4_CACHE_DIR", &cache)], "gemv16.cu");
            assert_exit(&again, 0);
            assert!(stdout(&again).contains("0 compiled now, 1 already there"), "{}", stdout(&again));
        }
        _ => {
            let err = assert_exit(&o, 1);
            assert!(err.to_lowercase().contains("nvrtc"), "{err}");
            assert!(!cache.exists() || std::fs::read_dir(&cache).unwrap().next().is_none());
        }
    }
    assert!(!stderr(&o).contains("panicked"));
}

#[test]
fn a_filter_matching_no_kernel_file_is_refused() {
    let dir = Scratch::new("fill-no-match");
    let cache = dir.path("cubins");
    let o = fill(&dir, &[("NVFP4_CACHE_DIR", &cache)], "no-such-kernel");
    let err = assert_exit(&o, 1);
    assert!(err.contains("no-such-kernel"), "{err}");
    assert!(!cache.exists());
}

#[test]
fn the_report_flags_do_not_combine_with_it() {
    let dir = Scratch::new("fill-json");
    for flag in [&["--json"][..], &["--cubin-dir", "x"][..]] {
        let o = Command::new(env!("CARGO_BIN_EXE_nvfp4"))
            .args(["kernels", "--fill-cache"])
            .args(flag)
            .current_dir(&dir.0)
            .output()
            .expect("run the nvfp4 binary");
        let err = assert_exit(&o, 2);
        assert!(err.contains("cannot be used with"), "{err}");
    }
    assert!(dir.listing().is_empty());
}
