//! Sizes the host cannot hold end the command with exit status 1 and a message giving the bytes
//! needed and the bytes available, before anything is allocated: never an allocation failure
//! and an abort.

mod common;

use std::fs::File;
use std::path::Path;

use common::{assert_exit, nvfp4_in, stdout, Scratch};
use nvfp4::format::{Nvfp4Tensor, ScaleLayout};
use nvfp4::io::save_problem;
use nvfp4::ops::Gemm;
use nvfp4::Problem;

/// Asserts the tool refused with the "needs N bytes, but only M bytes are available" message,
/// N > M, and returns N.
#[track_caller]
fn assert_too_large(err: &str) -> u64 {
    let number_before = |marker: &str| -> u64 {
        let head = &err[..err.find(marker).unwrap_or_else(|| panic!("no `{marker}` in: {err}"))];
        let digits: String = head.chars().rev().take_while(|c| c.is_ascii_digit()).collect();
        digits.chars().rev().collect::<String>().parse().unwrap_or_else(|_| panic!("no size before `{marker}`: {err}"))
    };
    let needed = number_before(" bytes, but only");
    let available = number_before(" bytes are available");
    assert!(needed > available, "{err}");
    assert!(!err.contains("memory allocation"), "{err}");
    needed
}

#[test]
fn gen_refuses_operands_larger_than_memory() {
    let dir = Scratch::new("gen-huge");
    for (kind, shape) in [
        ("gemm", "1000000x1000000x1000000"),
        ("gemv", "1000000000x1000000x1000"),
        ("dual-gemm", "1000000x1000000x1000000"),
        ("grouped-gemm", "1000000,16/1000000/1000000"),
    ] {
        let o = nvfp4_in(&dir.0, &["gen", kind, "--shape", shape, "-o", "out.safetensors"]);
        let err = assert_exit(&o, 1);
        assert_too_large(&err);
        assert!(err.contains(&format!("generating {kind} ")), "{err}");
    }
    // gemm: two operands of M*K/2 packed bytes and M*K/16 scales each.
    let o = nvfp4_in(&dir.0, &["gen", "gemm", "--shape", "1000000x1000000x1000000", "-o", "out.safetensors"]);
    let m: u64 = 1_000_000;
    assert_eq!(assert_too_large(&common::stderr(&o)), 2 * (m * m / 2 + m * m / 16));
    // Beyond 64 bits.
    let o = nvfp4_in(&dir.0, &["gen", "gemm", "--shape", "4294967296x4294967296x4294967296", "-o", "out.safetensors"]);
    assert!(assert_exit(&o, 1).contains("beyond 64 bits"));
    assert!(dir.listing().is_empty(), "nothing written: {:?}", dir.listing());
}

#[test]
fn run_refuses_an_output_larger_than_memory() {
    // An 18 MB case declaring a 1000000 x 1000000 output (2 TB of f16).
    let dir = Scratch::new("run-huge");
    let (m, n, k) = (1_000_000, 1_000_000, 16);
    let t = |rows: usize| {
        Nvfp4Tensor::new(1, rows, k, vec![0x22; rows * k / 2], vec![0x38; rows * k / 16], ScaleLayout::Plain).unwrap()
    };
    let case = dir.path("case.safetensors");
    save_problem(&case, &Problem::Gemm(Gemm::new(t(m), t(n), None).unwrap())).unwrap();
    assert!(std::fs::metadata(&case).unwrap().len() < 20_000_000);
    for backend in ["cpu", "auto"] {
        let o =
            nvfp4_in(&dir.0, &["run", "gemm", "-i", "case.safetensors", "-o", "out.safetensors", "--backend", backend]);
        let err = assert_exit(&o, 1);
        let needed = assert_too_large(&err);
        assert!(needed >= 2 * (m * n) as u64, "{err}");
        assert!(err.contains("1000000x1000000x16"), "{err}");
    }
    assert_eq!(dir.listing(), vec!["case.safetensors"]);
}

/// A file of `len` bytes whose data the file system does not store (a sparse file), opening with
/// a safetensors header that describes it.
fn sparse_safetensors(path: &Path, header: &str, data_len: u64) {
    use std::io::Write;
    let mut header = header.to_string();
    while !header.len().is_multiple_of(8) {
        header.push(' ');
    }
    let mut f = File::create(path).unwrap();
    f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    f.write_all(header.as_bytes()).unwrap();
    f.set_len(8 + header.len() as u64 + data_len).unwrap();
}

#[test]
fn reading_and_quantizing_files_larger_than_memory_is_refused() {
    // A 580 GB case file and a 4 TB dense weight, stored sparsely: valid headers, sizes no host
    // here can hold.
    let dir = Scratch::new("read-huge");
    let (m, k) = (1u64 << 20, 1u64 << 20);
    let sizes = [m * k / 2, m * k / 16, k / 2, k / 16];
    let mut offsets = vec![0u64];
    for s in sizes {
        offsets.push(offsets.last().unwrap() + s);
    }
    let entry = |name: &str, dtype: &str, shape: &str, i: usize| {
        format!(r#""{name}":{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{},{}]}}"#, offsets[i], offsets[i + 1])
    };
    let header = format!(
        "{{{},{},{},{}}}",
        entry("a", "U8", &format!("[1,{m},{}]", k / 2), 0),
        entry("sfa", "F8_E4M3", &format!("[1,{m},{}]", k / 16), 1),
        entry("b", "U8", &format!("[1,1,{}]", k / 2), 2),
        entry("sfb", "F8_E4M3", &format!("[1,1,{}]", k / 16), 3),
    );
    sparse_safetensors(&dir.path("case.safetensors"), &header, offsets[4]);
    let o = nvfp4_in(&dir.0, &["run", "gemv", "-i", "case.safetensors", "-o", "out.safetensors", "--backend", "cpu"]);
    let err = assert_exit(&o, 1);
    assert_eq!(assert_too_large(&err), offsets[4], "the whole file's tensors: {err}");

    let (n, kk) = (1u64 << 20, 1u64 << 20);
    let header = format!(r#"{{"w":{{"dtype":"F32","shape":[{n},{kk}],"data_offsets":[0,{}]}}}}"#, n * kk * 4);
    sparse_safetensors(&dir.path("dense.safetensors"), &header, n * kk * 4);
    let o = nvfp4_in(&dir.0, &["quantize", "-i", "dense.safetensors", "-o", "q.safetensors"]);
    let err = assert_exit(&o, 1);
    assert!(assert_too_large(&err) > n * kk * 4, "{err}");
    assert!(stdout(&o).is_empty());
    assert_eq!(dir.listing(), vec!["case.safetensors", "dense.safetensors"]);
}
