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
