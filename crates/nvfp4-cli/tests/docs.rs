//! The documents say what the tool does: README points at docs/FORMAT.md, whose catalogue,
//! tolerance and value table are the library's; README's account of `--json`, the exit status and
//! NVRTC matches the binary's help and the CI script.

mod common;

use std::path::PathBuf;

use common::{nvfp4_in, stdout};
use nvfp4::check::{ATOL, RTOL};
use nvfp4::format::e2m1::E2M1_MAGNITUDES;
use nvfp4::problem::{bench_shapes, test_shapes};
use nvfp4::{ProblemKind, Shape};

fn repo_file(path: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every `code span` of `line`.
fn spans(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

fn help(args: &[&str]) -> String {
    stdout(&nvfp4_in(&std::env::temp_dir(), args))
}

#[test]
fn readme_points_at_the_format_document() {
    let readme = repo_file("README.md");
    assert!(readme.contains("(docs/FORMAT.md)"), "README links docs/FORMAT.md");
    assert!(!readme.contains("SPEC"), "README still speaks of a SPEC outside the repository");
    let format = repo_file("docs/FORMAT.md");
    for section in ["Number formats", "Tensor layouts", "four operations", "Judging an output", "Generators"] {
        assert!(format.contains(section), "docs/FORMAT.md lacks `{section}`");
    }
    assert!(format.contains("On the CPU backend") && format.contains("On the CUDA backend"));
}

#[test]
fn the_documented_catalogue_is_the_librarys() {
    let format = repo_file("docs/FORMAT.md");
    for kind in ProblemKind::ALL {
        for (set, shapes) in [("test", test_shapes(kind)), ("bench", bench_shapes(kind))] {
            let head = format!("- {kind} {set}: ");
            let line = format.lines().find(|l| l.starts_with(&head)).unwrap_or_else(|| panic!("no `{head}` line"));
            let listed: Vec<Shape> = spans(line)
                .iter()
                .map(|s| Shape::parse(kind, s).unwrap_or_else(|e| panic!("{kind} {set} `{s}`: {e}")))
                .collect();
            assert_eq!(listed, shapes, "docs/FORMAT.md's {kind} {set} shapes");
        }
    }
}

#[test]
fn the_documented_numbers_are_the_librarys() {
    let format = repo_file("docs/FORMAT.md");
    let tolerance = format!("|got − ref| ≤ {:e} + {:e} × |ref|", ATOL, RTOL);
    assert!(format.contains(&tolerance), "docs/FORMAT.md lacks `{tolerance}`");
    let row = format.lines().find(|l| l.starts_with("| value |")).expect("the E2M1 table");
    let values: Vec<f32> = row.split('|').filter_map(|c| c.trim().parse().ok()).collect();
    assert_eq!(values, E2M1_MAGNITUDES.to_vec());
}

#[test]
fn the_documented_w4a16_numbers_are_the_librarys() {
    let format = repo_file("docs/FORMAT.md");
    let w4a16 = format.split("## 10. W4A16").nth(1).expect("docs/FORMAT.md §10");
    assert!(w4a16.contains(&format!("K up to {}", nvfp4::problem::EXACT_MAX_K)), "the exact tier's K bound");
    assert_eq!(nvfp4::check::compare16::BF16_RTOL, 2f64.powi(-7));
    assert!(w4a16.contains("2^-7 instead of 1e-3 for BF16"), "the bf16 tolerance");
    assert!(repo_file("README.md").contains("## W4A16"), "README's W4A16 section");
}

#[test]
fn readme_json_paragraph_matches_each_subcommand() {
    let readme = repo_file("README.md");
    let para = readme.split("\n\n").find(|p| p.starts_with("`--json`")).expect("README's `--json` paragraph");
    for sub in ["gen", "run", "check", "bench", "quantize", "kernels"] {
        let h = help(&[sub, "--help"]);
        let takes_file = h.contains("--json <");
        let flag = !takes_file && h.contains("--json");
        assert!(flag || takes_file, "{sub} has no --json");
        if flag {
            assert!(para.contains(&format!("`{sub}`")), "{sub} prints JSON; README's paragraph does not say so");
        } else {
            assert!(para.contains(&format!("`{sub}`")) && para.contains("--json FILE"), "{sub} --json FILE");
        }
    }
}

#[test]
fn help_cites_the_format_document_not_a_spec() {
    // The contract users have is docs/FORMAT.md; a "SPEC" is nowhere in the repository.
    for sub in ["gen", "run", "check", "bench", "quantize", "kernels"] {
        let h = help(&[sub, "--help"]);
        assert!(!h.contains("SPEC"), "{sub} --help cites a SPEC:\n{h}");
    }
    assert!(help(&["check", "--help"]).contains("docs/FORMAT.md §6"));
    assert!(help(&["bench", "--help"]).contains("docs/FORMAT.md §7"));
}

#[test]
fn readme_exit_status_matches_the_help() {
    let readme = repo_file("README.md");
    // The first table after "Exit status:", and only it (later tables have numeric rows too).
    let table: Vec<&str> = readme
        .split("Exit status:")
        .nth(1)
        .expect("README's exit status table")
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter(|l| l.starts_with("| ") && l.chars().nth(2).is_some_and(|c| c.is_ascii_digit()))
        .collect();
    let codes: Vec<&str> = table.iter().map(|l| l.split('|').nth(1).unwrap().trim()).collect();
    assert_eq!(codes, ["0", "1", "2"]);
    let h = help(&["--help"]);
    for (code, word) in [("0", "success"), ("1", "failed"), ("2", "usage")] {
        assert!(h.contains(&format!("{code} ")), "nvfp4 --help lacks {code}");
        assert!(table[code.parse::<usize>().unwrap()].contains(word), "README's row {code} lacks `{word}`");
    }
}

#[test]
fn nvrtc_instructions_name_the_version_ci_installs() {
    let ci = repo_file(".ci/nvrtc-check");
    let version = ci
        .lines()
        .find_map(|l| l.strip_prefix("NVRTC_VERSION="))
        .expect("NVRTC_VERSION in .ci/nvrtc-check")
        .trim()
        .to_string();
    let wheel = format!("nvidia-cuda-nvrtc=={version}");
    assert!(repo_file("README.md").contains(&wheel), "README does not name {wheel}");
    assert!(help(&["kernels", "--help"]).contains(&wheel), "kernels --help does not name {wheel}");
}
