//! The two ceilings of SPEC §7, measured in the same run as the kernels: device-to-device copy
//! bandwidth (bytes read + written) and the FP16 tensor-core rate of a cuBLASLt GEMM 8192³; and
//! the speed-of-light arithmetic built on them.

use half::f16;
use rayon::prelude::*;
use serde::Serialize;

use super::gpu::driver_err;
use super::lt::{DeviceF16, Lt, LtPlan};
use super::peer::{abt_spec, dequantize_f16};
use super::stats::Samples;
use super::timer::Timer;
use crate::problem::Problem;
use crate::problem::{generate, Rng, Shape};
use crate::{Error, Result};

/// Bytes copied by the bandwidth measurement (read once and written once).
pub const COPY_BYTES: usize = 1 << 30;
/// Side of the square FP16 GEMM that measures the tensor-core rate.
pub const PEAK_DIM: usize = 8192;
/// Warm-up launches and samples of each ceiling.
pub const CEILING_WARMUP: usize = 3;
/// See [`CEILING_WARMUP`].
pub const CEILING_SAMPLES: usize = 20;

/// Decimal TB/s of `bytes` moved in `us` microseconds.
pub fn tbps(bytes: f64, us: f64) -> f64 {
    bytes / us / 1e6
}

/// TFLOP/s of `flops` done in `us` microseconds.
pub fn tflops(flops: f64, us: f64) -> f64 {
    flops / us / 1e6
}

/// The device's measured ceilings.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Ceilings {
    /// Device-to-device copy bandwidth, bytes read + written, decimal TB/s (median).
    pub copy_tbps: f64,
    /// cuBLASLt FP16 GEMM 8192³ with FP32 accumulation on random non-zero data, TFLOP/s (median).
    pub fp16_tflops: f64,
    /// The same GEMM on e2m1 · e4m3 values drawn as the SPEC's GEMM generator draws them;
    /// informational, not used for the speed of light.
    ///
    /// NOTE: on the H100 (2026-11-22) cuBLAS ran 8192³ in 1218 µs on such values against 1439 µs on
    /// random data in the same run: low-entropy operands draw less power and the clocks stay
    /// higher (METHOD.md saw 13% for zeros). A compute-bound row can therefore beat the speed of
    /// light computed from `fp16_tflops` (`sol_fraction` above 1).
    pub fp16_tflops_nvfp4_data: Option<f64>,
}

impl Ceilings {
    /// Microseconds to move `bytes` at the copy bandwidth.
    pub fn memory_us(&self, bytes: u64) -> f64 {
        bytes as f64 / self.copy_tbps / 1e6
    }

    /// Microseconds to do `flops` at the FP16 tensor rate.
    pub fn math_us(&self, flops: f64) -> f64 {
        flops / self.fp16_tflops / 1e6
    }

    /// Speed of light: the larger of the memory time and the math time.
    pub fn speed_of_light_us(&self, bytes: u64, flops: f64) -> f64 {
        self.memory_us(bytes).max(self.math_us(flops))
    }
}

/// Copies [`COPY_BYTES`] device to device; returns TB/s (read + written) and the samples.
pub fn measure_copy(timer: &Timer) -> Result<(f64, Samples)> {
    let stream = timer.stream();
    let src = stream.alloc_zeros::<u8>(COPY_BYTES).map_err(driver_err("allocating the copy source"))?;
    let mut dst = stream.alloc_zeros::<u8>(COPY_BYTES).map_err(driver_err("allocating the copy destination"))?;
    let samples = timer.time_us(
        || stream.memcpy_dtod(&src, &mut dst).map_err(driver_err("device-to-device copy")),
        CEILING_WARMUP,
        CEILING_SAMPLES,
    )?;
    Ok((tbps(2.0 * COPY_BYTES as f64, samples.median()), samples))
}

/// `len` random f16 values uniform in [-1, 1), none of them zero (zeros run faster than data).
fn random_f16(len: usize, seed: u64) -> Vec<f16> {
    const CHUNK: usize = 1 << 20;
    let mut out = vec![f16::ZERO; len];
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(i, chunk)| {
        let mut rng = Rng::new(seed.wrapping_mul(0x1_0000_0001).wrapping_add(i as u64));
        for x in chunk {
            let v = f16::from_f32(2.0 * rng.unit_f32() - 1.0);
            *x = if v.to_f32() == 0.0 { f16::from_f32(0.5) } else { v };
        }
    });
    out
}

/// Times `C = A · Bᵀ` for square [`PEAK_DIM`] f16 operands (row-major, K-major) with a cuBLASLt
/// FP16 GEMM (FP32 compute); returns TFLOP/s and the samples.
fn time_square_gemm(lt: &Lt, timer: &Timer, a: &[f16], b: &[f16]) -> Result<(f64, Samples)> {
    let d = PEAK_DIM;
    let stream = timer.stream();
    let a = DeviceF16::upload(stream, a)?;
    let b = DeviceF16::upload(stream, b)?;
    let c = DeviceF16::zeros(stream, d * d)?;
    let plan = LtPlan::new(lt, abt_spec(d, d, d, 1), 1.0)?;
    // cuBLAS's A is our B and its B our A (see the peer's module note).
    let samples = timer.time_us(|| plan.launch(lt, &b, &a, &c), CEILING_WARMUP, CEILING_SAMPLES)?;
    let flops = 2.0 * (d as f64).powi(3);
    Ok((tflops(flops, samples.median()), samples))
}

/// The FP16 ceiling: a cuBLASLt GEMM [`PEAK_DIM`]³ (f16 in and out, FP32 compute) on random
/// non-zero data in [-1, 1); returns TFLOP/s and the samples.
pub fn measure_fp16(lt: &Lt, timer: &Timer) -> Result<(f64, Samples)> {
    let len = PEAK_DIM * PEAK_DIM;
    time_square_gemm(lt, timer, &random_f16(len, 1), &random_f16(len, 2))
}

/// The same GEMM on the SPEC GEMM generator's values, dequantized (exact) to f16: see
/// [`Ceilings::fp16_tflops_nvfp4_data`].
pub fn measure_fp16_nvfp4_data(lt: &Lt, timer: &Timer) -> Result<(f64, Samples)> {
    let shape = Shape::Gemm { m: PEAK_DIM, n: PEAK_DIM, k: PEAK_DIM, l: 1 };
    let Problem::Gemm(g) = generate(&shape, 1)? else {
        return Err(Error::Invalid("the GEMM generator returned another problem".into()));
    };
    time_square_gemm(lt, timer, &dequantize_f16(&g.a), &dequantize_f16(&g.b))
}
