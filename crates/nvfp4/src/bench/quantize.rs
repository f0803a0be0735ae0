//! The quantizer's rows of `nvfp4 bench`: the GPU quantizer on an 8192x8192 activation-like
//! input (bf16 with a calibrated global scale given on the device, as `nvfp4.torch.Linear`
//! passes its `input_scale`; bf16 with the amax pass; bf16 with exactly its own amax scale given,
//! the kernel's slow case; f16 and f32 with a given value), under the same cold
//! protocol and [`Timer`] as the kernels, checked bit-identical against the CPU quantizer before
//! and after timing (a failed check is a `FAIL` row, never timed). The row's speed of light is
//! its bytes (input read once, values and plain scales written once) at the copy bandwidth of
//! the same run, so `sol_fraction` is the fraction of copy bandwidth.

use half::{bf16, f16};
use rayon::prelude::*;

use super::ceilings::{tbps, Ceilings};
use super::options::{Options, SEED};
use super::report::{fail_verdict, Row, PASS};
use super::stats::Samples;
use super::timer::Timer;
use crate::backend::cuda::{CudaBackend, DenseBytes, DenseType, JobGlobal, QuantizeJob};
use crate::format::{modelopt_global_scale, quantize, GlobalScale, Nvfp4Tensor, ScaleLayout};
use crate::problem::Rng;
use crate::{Error, Result};

/// The rows' problem name.
pub const PROBLEM: &str = "quantize";
/// The benchmark input: rows x K.
pub const SHAPE: (usize, usize) = (8192, 8192);
/// Rows per chunk of the generator and of the CPU reference (run in parallel).
const CHUNK_ROWS: usize = 256;

/// Where a case's global scale comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Global {
    /// The amax pass computes it (ModelOpt: amax / 2688).
    Amax,
    /// A calibrated scale in device memory, as `nvfp4.torch.Linear` passes its `input_scale`:
    /// [`CALIBRATION`] times this input's amax / 2688 (a batch's amax is rarely the calibration's).
    Device,
    /// The same, passed by value.
    Value,
    /// Exactly this input's amax / 2688, by value: with bf16 data many quotients x / s land on
    /// e2m1 rounding boundaries, which the kernel resolves by division (its slow case).
    ValueOwnAmax,
}

/// The calibrated global scale of the [`Global::Device`] and [`Global::Value`] cases, relative
/// to the input's own ModelOpt scale.
pub const CALIBRATION: f32 = 1.02;

/// One benchmark case: input type and where the global scale comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Case {
    /// Input element type.
    pub dtype: DenseType,
    /// Global scale source.
    pub global: Global,
}

/// The benchmark cases, in report order.
pub const CASES: [Case; 5] = [
    Case { dtype: DenseType::Bf16, global: Global::Device },
    Case { dtype: DenseType::Bf16, global: Global::Amax },
    Case { dtype: DenseType::Bf16, global: Global::ValueOwnAmax },
    Case { dtype: DenseType::F16, global: Global::Value },
    Case { dtype: DenseType::F32, global: Global::Value },
];

impl Case {
    /// The row's shape text, e.g. `8192x8192 bf16, global amax`.
    pub fn shape(&self) -> String {
        let global = match self.global {
            Global::Amax => "amax",
            Global::Device => "given on device",
            Global::Value => "given value",
            Global::ValueOwnAmax => "given = own amax/2688",
        };
        let ty = match self.dtype {
            DenseType::F32 => "f32",
            DenseType::F16 => "f16",
            DenseType::Bf16 => "bf16",
        };
        format!("{}x{} {ty}, global {global}", SHAPE.0, SHAPE.1)
    }

    /// The job's global-scale source and the scale the CPU reference uses, given the data's
    /// ModelOpt global scale `g`.
    pub fn global(&self, g: f32) -> (JobGlobal, f32) {
        match self.global {
            Global::Amax => (JobGlobal::Auto, g),
            Global::Device => (JobGlobal::Device(CALIBRATION * g), CALIBRATION * g),
            Global::Value => (JobGlobal::Value(CALIBRATION * g), CALIBRATION * g),
            Global::ValueOwnAmax => (JobGlobal::Value(g), g),
        }
    }
}

/// Activation-like values: uniform in [-4, 4), one in 256 scaled by 16 (outliers), so blocks
/// have varied scales. Deterministic in [`SEED`].
pub fn activations(rows: usize, k: usize) -> Vec<f32> {
    let mut x = vec![0f32; rows * k];
    x.par_chunks_mut(CHUNK_ROWS * k).enumerate().for_each(|(c, chunk)| {
        let mut rng = Rng::new(SEED.wrapping_mul(0x1_0000_0001).wrapping_add(c as u64));
        for v in chunk {
            let u = 8.0 * rng.unit_f32() - 4.0;
            *v = if rng.below(256) == 0 { 16.0 * u } else { u };
        }
    });
    x
}

/// The input as `dtype`: its bytes and its values widened back to f32 (exactly).
pub fn typed(x: &[f32], dtype: DenseType) -> (Vec<u8>, Vec<f32>) {
    match dtype {
        DenseType::F32 => (x.iter().flat_map(|v| v.to_le_bytes()).collect(), x.to_vec()),
        DenseType::F16 => {
            let h: Vec<f16> = x.par_iter().map(|&v| f16::from_f32(v)).collect();
            (h.iter().flat_map(|v| v.to_le_bytes()).collect(), h.par_iter().map(|v| v.to_f32()).collect())
        }
        DenseType::Bf16 => {
            let h: Vec<bf16> = x.par_iter().map(|&v| bf16::from_f32(v)).collect();
            (h.iter().flat_map(|v| v.to_le_bytes()).collect(), h.par_iter().map(|v| v.to_f32()).collect())
        }
    }
}

/// The CPU quantizer's result for `x` `[1, rows, k]` with global scale `g`, in row chunks run in
/// parallel (blocks are independent once `g` is fixed; `GlobalScale::Auto` is the same `g`).
pub fn cpu_reference(x: &[f32], rows: usize, k: usize, g: f32) -> Result<Nvfp4Tensor> {
    let parts: Vec<Nvfp4Tensor> = x
        .par_chunks(CHUNK_ROWS * k)
        .map(|c| quantize(c, 1, c.len() / k, k, GlobalScale::Fixed(g)))
        .collect::<Result<_>>()?;
    let values: Vec<u8> = parts.iter().flat_map(|t| t.values().iter().copied()).collect();
    let scales: Vec<u8> = parts.iter().flat_map(|t| t.scales().iter().copied()).collect();
    Ok(Nvfp4Tensor::new(1, rows, k, values, scales, ScaleLayout::Plain)?.with_global_scale(g))
}

/// `None` when `got` equals `want` bit for bit (values, scales, global scale), else the first
/// difference.
pub fn first_difference(got: &Nvfp4Tensor, want: &Nvfp4Tensor) -> Option<String> {
    if got.global_scale().to_bits() != want.global_scale().to_bits() {
        return Some(format!("global scale {:e}, expected {:e}", got.global_scale(), want.global_scale()));
    }
    let diff = |what: &str, a: &[u8], b: &[u8]| {
        if a.len() != b.len() {
            return Some(format!("{what}: {} bytes, expected {}", a.len(), b.len()));
        }
        let n = a.iter().zip(b).filter(|(x, y)| x != y).count();
        a.iter()
            .zip(b)
            .position(|(x, y)| x != y)
            .map(|i| format!("{n} {what} bytes differ (first at byte {i}: got {:#04x}, expected {:#04x})", a[i], b[i]))
    };
    diff("value", got.values(), want.values()).or_else(|| diff("scale", got.scales(), want.scales()))
}

/// Poison, launch, download, compare.
fn check(job: &mut QuantizeJob<'_>, want: &Nvfp4Tensor) -> std::result::Result<(), String> {
    job.poison().map_err(|e| e.to_string())?;
    job.launch().map_err(|e| e.to_string())?;
    let got = job.output().map_err(|e| e.to_string())?;
    first_difference(&got, want).map_or(Ok(()), Err)
}

/// Checks, times (only if the check passed) and checks again.
fn bench_job(
    job: &mut QuantizeJob<'_>,
    want: &Nvfp4Tensor,
    timer: &Timer,
    opts: &Options,
) -> (Option<Samples>, String) {
    if let Err(e) = check(job, want) {
        return (None, fail_verdict(e));
    }
    let samples = match timer.time_us(|| job.launch(), opts.warmup, opts.samples) {
        Ok(s) => s,
        Err(e) => return (None, fail_verdict(format!("while timing: {e}"))),
    };
    if let Err(e) = check(job, want) {
        return (None, fail_verdict(format!("after timing: {e}")));
    }
    (Some(samples), PASS.to_string())
}

/// Bytes a quantization of `n` elements moves at least: the input read once, the packed values
/// and the plain scales written once.
pub fn moved_bytes(n: usize, dtype: DenseType) -> u64 {
    (n * dtype.size() + n / 2 + n / 16) as u64
}

/// A row from the samples (none when the check failed).
fn row(shape: String, bytes: u64, samples: Option<&Samples>, verdict: String, config: String, c: &Ceilings) -> Row {
    let us_median = samples.map(Samples::median);
    let sol_us = c.memory_us(bytes);
    Row {
        problem: PROBLEM.to_string(),
        shape,
        us_median,
        us_min: samples.map(Samples::min),
        tbps: us_median.map(|us| tbps(bytes as f64, us)),
        tflops: None,
        sol_us,
        sol_fraction: us_median.map(|us| sol_us / us),
        peer_us: None,
        speedup: None,
        verdict,
        config,
        peer_config: String::new(),
        read_us: None,
        read_fraction: None,
        read_config: String::new(),
        graph: None,
        peer_graph: None,
    }
}

/// The quantizer's rows. Errors only for what makes the run meaningless (the CPU reference
/// failing); device failures become `FAIL` rows.
pub fn rows(
    backend: std::result::Result<&CudaBackend, &Error>,
    timer: &Timer,
    ceilings: &Ceilings,
    opts: &Options,
    log: &mut dyn FnMut(&str),
) -> Result<Vec<Row>> {
    let (rows, k) = SHAPE;
    let x = activations(rows, k);
    let mut out = Vec::new();
    for case in CASES {
        let (bytes, widened) = typed(&x, case.dtype);
        let (global, g) = case.global(modelopt_global_scale(&widened));
        let want = cpu_reference(&widened, rows, k, g)?;
        let shape = case.shape();
        let input = DenseBytes { dtype: case.dtype, bytes: &bytes, shape: [1, rows, k] };
        let (samples, verdict, config) = match backend {
            Ok(b) => match b.prepare_quantize(input, global, ScaleLayout::Plain) {
                Ok(mut job) => {
                    let (s, v) = bench_job(&mut job, &want, timer, opts);
                    (s, v, job.describe())
                }
                Err(e) => (None, fail_verdict(e), String::new()),
            },
            Err(e) => (None, fail_verdict(e), String::new()),
        };
        let r = row(shape, moved_bytes(rows * k, case.dtype), samples.as_ref(), verdict, config, ceilings);
        log(&format!(
            "{PROBLEM} {}: {} µs, {:.0}% of copy bandwidth: {}",
            r.shape,
            r.us_median.map_or("-".into(), |x| format!("{x:.1}")),
            100.0 * r.sol_fraction.unwrap_or(0.0),
            r.verdict
        ));
        out.push(r);
    }
    Ok(out)
}
