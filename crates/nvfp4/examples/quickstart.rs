//! Quantize two matrices, multiply them on the best backend present, compare with the reference.

use nvfp4::format::{quantize, GlobalScale};
use nvfp4::{check, Backend, CpuBackend, Gemm};

fn main() -> nvfp4::Result<()> {
    let (m, n, k) = (64, 96, 256);
    let x: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 8.0).collect();
    let w: Vec<f32> = (0..n * k).map(|i| ((i * 53 % 97) as f32 - 48.0) / 16.0).collect();
    // [L, rows, K] NVFP4 tensors with ModelOpt global scales.
    let a = quantize(&x, 1, m, k, GlobalScale::Auto)?;
    let b = quantize(&w, 1, n, k, GlobalScale::Auto)?;
    let gemm = Gemm::new(a, b, None)?;
    let (backend, _) = nvfp4::backend::open(Default::default())?; // cuda if present, else cpu
    let got = backend.gemm(&gemm)?;
    let reference = CpuBackend.gemm(&gemm)?;
    let report = check::compare(&got, &reference, check::Mode::Tolerance);
    assert!(report.passed(), "{report}");
    println!("{m}x{n}x{k} GEMM on the {} backend matches the CPU reference: {report}", backend.name());
    Ok(())
}
