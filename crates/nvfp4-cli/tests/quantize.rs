//! `nvfp4 quantize`: every tensor it does not quantize is named with the reason, `--strict`
//! turns any skip into a failure that writes nothing, and `--json` reports the same.

mod common;

use common::{assert_exit, nvfp4_in, stdout, Scratch};
use safetensors::tensor::TensorView;
use safetensors::Dtype;

/// A dense file: one quantizable weight, and tensors that cannot be quantized for each reason.
fn dense_file(dir: &Scratch, with_weight: bool) {
    let w: Vec<u8> = (0..64).flat_map(|i| (i as f32 / 8.0 - 4.0).to_le_bytes()).collect();
    let odd: Vec<u8> = (0..80).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let bias = vec![0u8; 8];
    let ids = vec![1u8; 16];
    let mut tensors = vec![
        ("odd.weight", TensorView::new(Dtype::F32, vec![2, 40], &odd).unwrap()),
        ("norm.bias", TensorView::new(Dtype::F16, vec![4], &bias).unwrap()),
        ("ids", TensorView::new(Dtype::I64, vec![2], &ids).unwrap()),
    ];
    if with_weight {
        tensors.push(("proj.weight", TensorView::new(Dtype::F32, vec![2, 32], &w).unwrap()));
    }
    std::fs::write(dir.path("dense.safetensors"), safetensors::serialize(tensors, None).unwrap()).unwrap();
}

#[test]
fn every_skip_is_named_with_its_reason() {
    let dir = Scratch::new("quantize-skips");
    for with_weight in [false, true] {
        dense_file(&dir, with_weight);
        let o = nvfp4_in(&dir.0, &["quantize", "-i", "dense.safetensors", "-o", "q.safetensors"]);
        assert_exit(&o, 0);
        let out = stdout(&o);
        for line in
            ["odd.weight F32 [2, 40]: K = 40 is not a multiple of 16", "norm.bias F16 [4]: 1-D", "ids I64 [2]: I64"]
        {
            assert!(out.contains(line), "`{line}` not in:\n{out}");
        }
        assert!(out.contains("skipped 3 tensor(s)"), "{out}");
        assert_eq!(out.contains("proj.weight [2, 32] ->"), with_weight, "{out}");
    }
}

#[test]
fn strict_mode_fails_on_any_skip_and_writes_nothing() {
    let dir = Scratch::new("quantize-strict");
    dense_file(&dir, true);
    let o = nvfp4_in(&dir.0, &["quantize", "-i", "dense.safetensors", "-o", "q.safetensors", "--strict"]);
    let err = assert_exit(&o, 1);
    for name in ["odd.weight", "norm.bias", "ids"] {
        assert!(err.contains(name), "`{name}` not in {err}");
    }
    assert_eq!(dir.listing(), vec!["dense.safetensors"]);

    // A file of quantizable tensors only passes in strict mode.
    let w: Vec<u8> = (0..64).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let t = TensorView::new(Dtype::F32, vec![2, 32], &w).unwrap();
    std::fs::write(dir.path("clean.safetensors"), safetensors::serialize([("w", t)], None).unwrap()).unwrap();
    let o = nvfp4_in(&dir.0, &["quantize", "-i", "clean.safetensors", "-o", "q.safetensors", "--strict"]);
    assert_exit(&o, 0);
    assert!(stdout(&o).contains("skipped 0 tensor(s)"));
}

#[test]
fn json_summary() {
    let dir = Scratch::new("quantize-json");
    dense_file(&dir, true);
    let o = nvfp4_in(&dir.0, &["quantize", "-i", "dense.safetensors", "-o", "q.safetensors", "--json"]);
    assert_exit(&o, 0);
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("stdout is one JSON document");
    assert_eq!(v["quantized"][0]["name"], "proj.weight");
    assert_eq!(v["quantized"][0]["shape"], serde_json::json!([2, 32]));
    let skipped: Vec<(String, String)> = v["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].as_str().unwrap().to_string(), s["reason"].as_str().unwrap().to_string()))
        .collect();
    let mut skipped = skipped;
    skipped.sort();
    let want = [("ids", "dtype"), ("norm.bias", "not-2d"), ("odd.weight", "k-not-multiple-of-16")];
    assert_eq!(skipped, want.map(|(a, b)| (a.to_string(), b.to_string())));
    let size = std::fs::metadata(dir.path("q.safetensors")).unwrap().len();
    assert_eq!(v["output_bytes"], size);
    assert_eq!(v["input_bytes"], std::fs::metadata(dir.path("dense.safetensors")).unwrap().len());
}

/// A file with one dense `[2, 32]` tensor named `name`, of dtype `dtype`, from f32 values.
fn one_tensor_file(dir: &Scratch, file: &str, name: &str, dtype: Dtype, x: &[f32]) {
    let bytes: Vec<u8> = match dtype {
        Dtype::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::BF16 => x.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect(),
        _ => unreachable!("f32 and bf16 only"),
    };
    let t = TensorView::new(dtype, vec![2, 32], &bytes).unwrap();
    std::fs::write(dir.path(file), safetensors::serialize([(name, t)], None).unwrap()).unwrap();
}

/// A NaN or an infinity fails the command (the library's rule, as in Python): the message names
/// the tensor and the first such element, and nothing is written.
#[test]
fn nan_or_infinity_fails_naming_the_tensor_and_the_element() {
    let dir = Scratch::new("quantize-nonfinite");
    for (dtype, bad, shown) in [(Dtype::F32, f32::NAN, "NaN"), (Dtype::BF16, f32::NEG_INFINITY, "-inf")] {
        let mut x: Vec<f32> = (0..64).map(|i| i as f32 / 8.0).collect();
        x[49] = bad; // row 1, k 17
        x[63] = f32::INFINITY; // a later one, not the one named
        one_tensor_file(&dir, "dense.safetensors", "proj.weight", dtype, &x);
        let o = nvfp4_in(&dir.0, &["quantize", "-i", "dense.safetensors", "-o", "q.safetensors"]);
        let err = assert_exit(&o, 1);
        let want = format!("tensor `proj.weight`: element 49 ([l, row, k] = [0, 1, 17]) is {shown}");
        assert!(err.contains(&want), "`{want}` not in {err}");
        assert_eq!(dir.listing(), vec!["dense.safetensors"], "{dtype:?}");
    }
}

/// Tensors of tiny values (f32 1e-44: amax / 2688 underflowed to 0, a global scale the reader
/// refused) are written with the global scale 2^-126, and the file reads back with the library's
/// checkpoint reader.
#[test]
fn a_tensor_of_tiny_values_gives_a_file_the_reader_accepts() {
    let dir = Scratch::new("quantize-tiny");
    // bf16 2^-133 (its smallest subnormal): scale e4m3(2^-133 / 6 / 2^-126 = 0.0013) = 2^-9
    // (code 1), quotient 2^-133 / 2^-135 = 4 (code 6, so bytes 0x66).
    for (dtype, x, scale, byte) in [(Dtype::F32, 1e-44, 0u8, 0u8), (Dtype::BF16, 2f32.powi(-133), 0x01, 0x66)] {
        one_tensor_file(&dir, "dense.safetensors", "proj.weight", dtype, &[x; 64]);
        let o = nvfp4_in(&dir.0, &["quantize", "-i", "dense.safetensors", "-o", "q.safetensors"]);
        assert_exit(&o, 0);
        let (w, convention) = nvfp4::io::load_weight(&dir.path("q.safetensors"), "proj.")
            .unwrap_or_else(|e| panic!("{dtype:?}: the written file does not read back: {e}"));
        assert_eq!(convention, nvfp4::io::WeightConvention::ModelOpt);
        assert_eq!(w.global_scale(), 2f32.powi(-126), "{dtype:?}");
        assert_eq!((w.rows(), w.k()), (2, 32));
        assert!(w.scales().iter().all(|&s| s == scale), "{dtype:?}: {:?}", w.scales());
        assert!(w.values().iter().all(|&v| v == byte), "{dtype:?}: {:?}", w.values());
    }
}
