//! Writes that cannot lose data: files are written through a temporary file in the destination's
//! folder and renamed into place; a failed write leaves the old file; an output that is the
//! input file is refused, however it is spelled.

use std::fs;
use std::path::{Path, PathBuf};

use nvfp4::io::{
    load_problem, quantize_file, refuse_same_file, same_file, save_output, save_problem, write_atomically,
    write_bytes_atomically, QuantizeOptions,
};
use nvfp4::problem::generate;
use nvfp4::{CpuBackend, Error, ProblemKind, Shape};

/// A fresh, empty folder for one test.
fn folder(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nvfp4-writes-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn a_failed_write_leaves_the_old_file_and_no_temporary() {
    let dir = folder("failed");
    let dest = dir.join("out.bin");
    fs::write(&dest, b"old contents").unwrap();
    let r = write_atomically(&dest, |tmp| {
        fs::write(tmp, b"half of the new").unwrap();
        Err(Error::Invalid("the writer failed midway".into()))
    });
    assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
    assert_eq!(fs::read(&dest).unwrap(), b"old contents");
    assert_eq!(listing(&dir), vec!["out.bin"]);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_write_replaces_the_file_instead_of_rewriting_it() {
    // A second name for the old file (a hard link) keeps the old bytes: the new file is a new
    // inode renamed into place, not the old one truncated and rewritten.
    let dir = folder("replace");
    let dest = dir.join("case.safetensors");
    let keep = dir.join("previous.safetensors");
    let old = generate(&Shape::Gemm { m: 8, n: 8, k: 32, l: 1 }, 1).unwrap();
    save_problem(&dest, &old).unwrap();
    fs::hard_link(&dest, &keep).unwrap();
    let new = generate(&Shape::Gemm { m: 16, n: 8, k: 32, l: 1 }, 2).unwrap();
    save_problem(&dest, &new).unwrap();
    assert_eq!(load_problem(&dest, ProblemKind::Gemm).unwrap(), new);
    assert_eq!(load_problem(&keep, ProblemKind::Gemm).unwrap(), old);
    save_output(&dest, &new.run(&CpuBackend).unwrap()).unwrap();
    assert_eq!(load_problem(&keep, ProblemKind::Gemm).unwrap(), old);
    assert_eq!(listing(&dir), vec!["case.safetensors", "previous.safetensors"]);
    fs::remove_dir_all(&dir).unwrap();
}

#[cfg(unix)]
#[test]
fn links_are_followed_and_permissions_kept() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let dir = folder("links");
    let target = dir.join("target.json");
    let link = dir.join("link.json");
    fs::write(&target, b"{}").unwrap();
    fs::set_permissions(&target, fs::Permissions::from_mode(0o640)).unwrap();
    symlink("target.json", &link).unwrap();
    write_bytes_atomically(&link, b"{\"new\": true}").unwrap();
    assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link is still a link");
    assert_eq!(fs::read(&target).unwrap(), b"{\"new\": true}");
    assert_eq!(fs::metadata(&target).unwrap().permissions().mode() & 0o777, 0o640);
    assert_eq!(listing(&dir), vec!["link.json", "target.json"]);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn same_file_sees_through_spellings_and_links() {
    let dir = folder("same");
    let input = dir.join("in.safetensors");
    fs::write(&input, b"data").unwrap();
    fs::create_dir_all(dir.join("sub")).unwrap();
    let mut same = vec![input.clone(), dir.join(".").join("in.safetensors"), dir.join("sub/../in.safetensors")];
    fs::hard_link(&input, dir.join("hard")).unwrap();
    same.push(dir.join("hard"));
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&input, dir.join("soft")).unwrap();
        std::os::unix::fs::symlink("sub/../soft", dir.join("soft2")).unwrap();
        same.push(dir.join("soft"));
        same.push(dir.join("soft2"));
    }
    for out in &same {
        assert!(same_file(&input, out).unwrap(), "{} is the input", out.display());
        match refuse_same_file(&input, out) {
            Err(Error::Invalid(msg)) => assert!(msg.contains("is the input"), "{msg}"),
            other => panic!("{}: expected a refusal, got {other:?}", out.display()),
        }
    }
    fs::write(dir.join("other"), b"data").unwrap();
    for out in [dir.join("other"), dir.join("absent"), dir.join("sub")] {
        assert!(!same_file(&input, &out).unwrap(), "{} is not the input", out.display());
        refuse_same_file(&input, &out).unwrap();
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn quantize_refuses_to_write_over_its_input() {
    let dir = folder("quantize");
    let input = dir.join("dense.safetensors");
    let x: Vec<u8> = (0..64).flat_map(|i| (i as f32 * 0.25).to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, 32], &x).unwrap();
    fs::write(&input, safetensors::serialize([("w", view)], None).unwrap()).unwrap();
    let before = fs::read(&input).unwrap();
    for out in [input.clone(), dir.join(".").join("dense.safetensors")] {
        let r = quantize_file(&input, &out, QuantizeOptions::default());
        assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
    }
    assert_eq!(fs::read(&input).unwrap(), before);
    assert_eq!(listing(&dir), vec!["dense.safetensors"]);
    fs::remove_dir_all(&dir).unwrap();
}

#[cfg(unix)]
#[test]
fn the_writer_itself_refuses_what_it_must_not_replace() {
    // Without any check first (a library caller's path): a read-only file and a folder are
    // refused, untouched, and check_output says the same before any work.
    use nvfp4::io::check_output;
    use std::os::unix::fs::PermissionsExt;
    let dir = folder("refuse");
    let ro = dir.join("ro.bin");
    fs::write(&ro, b"precious").unwrap();
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o444)).unwrap();
    fs::create_dir(dir.join("sub")).unwrap();
    for (dest, needle) in [(ro.clone(), "read-only"), (dir.join("sub"), "folder"), (dir.join("sub/"), "folder")] {
        for r in [write_bytes_atomically(&dest, b"new"), check_output(&dest)] {
            match r {
                Err(Error::Io { path, source }) => {
                    let msg = source.to_string();
                    assert!(path == dest && msg.contains(needle), "{msg}");
                }
                other => panic!("{}: expected a refusal, got {other:?}", dest.display()),
            }
        }
    }
    assert_eq!(fs::read(&ro).unwrap(), b"precious");
    assert_eq!(listing(&dir), vec!["ro.bin", "sub"]);
    assert!(listing(&dir.join("sub")).is_empty());
    fs::remove_dir_all(&dir).unwrap();
}

#[cfg(unix)]
#[test]
fn a_fifo_is_filled_in_place() {
    use std::os::unix::fs::FileTypeExt;
    let dir = folder("fifo");
    let fifo = dir.join("pipe");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(fs::read(reader));
    });
    nvfp4::io::check_output(&fifo).unwrap();
    write_bytes_atomically(&fifo, b"through the pipe").unwrap();
    let got = rx.recv_timeout(std::time::Duration::from_secs(60)).expect("nothing reached the reader").unwrap();
    assert_eq!(got, b"through the pipe");
    assert!(fs::metadata(&fifo).unwrap().file_type().is_fifo());
    assert_eq!(listing(&dir), vec!["pipe"]);
    fs::remove_dir_all(&dir).unwrap();
}
