//! GPU quantizer timing diagnostics for kernel work (a dev tool, not a test and not the
//! benchmark; the numbers that count come from `nvfp4 bench quantize`). Needs an NVIDIA GPU.
//!
//! `dev_quant_diag timing [FILTER]` times the bench's quantizer cases with the bench's Timer (L2 flushed
//! per sample, events, median) next to the copy ceiling of the same process. Unlike the bench it
//! also times a kernel that fails its check (printing `CHECK FAILED`), so that ablations which
//! skip work (kernel variants from `NVFP4_KERNELS_DIR`) can be measured; their figures are
//! marked and say nothing about a correct kernel. FILTER keeps the cases whose name contains it
//! (e.g. `bf16`).

use nvfp4::backend::cuda::{CudaBackend, DenseBytes};
use nvfp4::bench::ceilings::measure_copy;
use nvfp4::bench::quantize::{activations, cpu_reference, first_difference, moved_bytes, typed, CASES, SHAPE};
use nvfp4::bench::Timer;
use nvfp4::format::{modelopt_global_scale, ScaleLayout};

fn main() {
    if std::env::args().nth(1).as_deref() != Some("timing") {
        eprintln!("usage: dev_quant_diag timing [FILTER]");
        std::process::exit(2);
    }
    let b = CudaBackend::new().unwrap_or_else(|e| panic!("CUDA backend: {e}"));
    let timer = Timer::new(b.stream().clone()).unwrap();
    let (copy_tbps, _) = measure_copy(&timer).unwrap();
    let variant = std::env::var("NVFP4_KERNELS_DIR").unwrap_or_else(|_| "embedded".into());
    println!("kernels: {variant}; copy {copy_tbps:.3} TB/s");
    let (rows, k) = SHAPE;
    let x = activations(rows, k);
    let filter = std::env::args().nth(2).unwrap_or_default();
    for case in CASES.into_iter().filter(|c| c.shape().contains(&filter)) {
        let (bytes, widened) = typed(&x, case.dtype);
        let (global, g) = case.global(modelopt_global_scale(&widened));
        let want = cpu_reference(&widened, rows, k, g).unwrap();
        let input = DenseBytes { dtype: case.dtype, bytes: &bytes, shape: [1, rows, k] };
        let mut job = b.prepare_quantize(input, global, ScaleLayout::Plain).unwrap();
        job.poison().unwrap();
        job.launch().unwrap();
        let verdict = match first_difference(&job.output().unwrap(), &want) {
            None => "ok".to_string(),
            Some(d) => format!("CHECK FAILED: {d}"),
        };
        let s = timer.time_us(|| job.launch(), 10, 30).unwrap();
        let sol = moved_bytes(rows * k, case.dtype) as f64 / copy_tbps / 1e6;
        println!(
            "{:<34} median {:7.1} µs  min {:7.1} µs  {:5.1}% of copy  {verdict}",
            case.shape(),
            s.median(),
            s.min(),
            100.0 * sol / s.median()
        );
    }
}
