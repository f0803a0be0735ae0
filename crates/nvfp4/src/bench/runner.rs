//! One benchmark run: open the device, measure the ceilings and the launch floor, then per shape
//! generate the problem, compute the CPU reference, measure the read ceiling of its input bytes,
//! check the kernel (poison, launch, output) and time it if it passed, check and time the
//! cuBLASLt peer, all under the run's protocol, and collect the rows.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::CudaStream;

use super::ceilings::{measure_copy, measure_fp16, measure_fp16_nvfp4_data, Ceilings};
use super::floors::{input_bytes, launch_floor, read_ceiling, ReadCeiling};
use super::gpu::{device_name, driver_present, driver_version, open_stream};
use super::graph::GraphRun;
use super::graph_rows;
use super::kernel_check::{check_kernel, check_mode};
use super::lt::Lt;
use super::options::{Options, MIN_SAMPLES, SEED};
use super::peer::{check_peer, Peer, PeerAgreement};
use super::protocol::Protocol;
use super::report::{fail_verdict, geomeans, now_utc, short_shape, Measurement, Report, Row, PASS};
use super::stats::Samples;
use super::timer::Timer;
use crate::backend::cuda::Floors;
use crate::backend::{CpuBackend, CudaBackend};
use crate::problem::{generate, Output, Problem, ProblemKind, Shape};
use crate::{Error, Result};

/// Runs the benchmark. `log` receives progress lines as they happen. Errors only for what stops
/// the whole run (no driver, no GPU, no cuBLASLt, a ceiling that cannot be measured); a kernel
/// that fails or errors becomes a row with a `FAIL` verdict.
pub fn run(opts: &Options, log: &mut dyn FnMut(&str)) -> Result<Report> {
    if opts.samples < MIN_SAMPLES {
        return Err(Error::Invalid(format!("--samples {} is below the minimum of {MIN_SAMPLES}", opts.samples)));
    }
    if !driver_present() {
        return Err(Error::NoDriver("libcuda.so could not be loaded".into()));
    }
    let date = now_utc();
    let mut notes = Vec::new();
    let backend = CudaBackend::new().map(|b| b.with_overrides(opts.overrides));
    let stream: Arc<CudaStream> = match &backend {
        Ok(b) => b.stream().clone(),
        Err(e) => {
            let s = open_stream()?;
            let note = format!("CUDA backend unavailable ({e}): every kernel fails; ceilings and peer measured");
            log(&note);
            notes.push(note);
            s
        }
    };
    let (device, driver) = match &backend {
        Ok(b) => (b.device_name(), b.driver_version()),
        Err(_) => (device_name(&stream)?, driver_version()?),
    };
    let timer = Timer::new(stream.clone())?;
    let lt = Lt::new(stream)?;
    log(&format!(
        "device: {device} ({driver}); L2 {} MiB; flushing {} MiB per sample",
        timer.l2_bytes() >> 20,
        timer.flush_bytes() >> 20
    ));

    let (copy_tbps, copy) = measure_copy(&timer)?;
    log(&format!("ceiling: copy {copy_tbps:.3} TB/s (median of {}, min {:.1} µs)", copy.len(), copy.min()));
    let (fp16_tflops, gemm) = measure_fp16(&lt, &timer)?;
    log(&format!("ceiling: fp16 {fp16_tflops:.1} TFLOP/s (median of {}, {:.1} µs)", gemm.len(), gemm.median()));
    let (data_tflops, data) = measure_fp16_nvfp4_data(&lt, &timer)?;
    log(&format!(
        "ceiling: fp16 on NVFP4 values {data_tflops:.1} TFLOP/s (median of {}, {:.1} µs; not used for SoL)",
        data.len(),
        data.median()
    ));
    let ceilings = Ceilings { copy_tbps, fp16_tflops, fp16_tflops_nvfp4_data: Some(data_tflops) };
    let floors = match &backend {
        Ok(b) => Some(b.floors()?),
        Err(_) => None,
    };
    let launch_floor = match &floors {
        Some(f) => {
            let lf = launch_floor(f, &timer, opts.warmup, opts.samples)?;
            log(&format!(
                "launch floor: cold {:.2} µs, graph {:.2} µs per launch chained ({:.2} unchained)",
                lf.cold_us, lf.graph_us, lf.graph_unchained_us
            ));
            Some(lf)
        }
        None => None,
    };

    let mut rows = Vec::new();
    for &kind in &opts.problems {
        let shapes = opts.shapes.shapes(kind);
        if shapes.is_empty() {
            let note = format!("{kind}: no {} shapes, skipped", opts.shapes);
            log(&note);
            notes.push(note);
            continue;
        }
        for shape in shapes {
            if let Shape::Moe { .. } = shape {
                let note = format!("{kind} {shape}: the MoE form is not benched, skipped");
                log(&note);
                notes.push(note);
                continue;
            }
            let m = bench_shape(kind, &shape, backend.as_ref(), floors.as_ref(), &timer, &lt, opts, log)?;
            let row = Row::new(&m, &ceilings);
            let us = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.1}"));
            log(&format!(
                "{kind} {}: kernel {} µs, read {} µs, peer {} µs, SoL {:.1} µs: {}",
                short_shape(&row.shape),
                us(row.us_median),
                us(row.read_us),
                us(row.peer_us),
                row.sol_us,
                row.verdict
            ));
            rows.push(row);
        }
    }
    if opts.quantize && opts.mode == Protocol::Cold {
        rows.extend(super::quantize::rows(backend.as_ref(), &timer, &ceilings, opts, log)?);
    } else if opts.quantize {
        let note = format!("{}: timed under the cold protocol only, skipped", super::quantize::PROBLEM);
        log(&note);
        notes.push(note);
    }
    let geomean = geomeans(&rows);
    Ok(Report {
        device,
        driver,
        date,
        shapes: opts.shapes.to_string(),
        mode: opts.mode.to_string(),
        ceilings,
        launch_floor,
        samples: opts.samples,
        warmup: opts.warmup,
        rows,
        geomean,
        notes,
    })
}

/// Generates, checks and times one shape under the run's protocol. Only errors that make the run
/// meaningless propagate (the generator or the CPU reference failing); device failures become
/// the verdict (a read ceiling that cannot be measured is logged and left out).
#[allow(clippy::too_many_arguments)]
fn bench_shape(
    kind: ProblemKind,
    shape: &Shape,
    backend: std::result::Result<&CudaBackend, &Error>,
    floors: Option<&Floors>,
    timer: &Timer,
    lt: &Lt,
    opts: &Options,
    log: &mut dyn FnMut(&str),
) -> Result<Measurement> {
    let name = format!("{kind} {}", short_shape(&shape.to_string()));
    let problem = generate(shape, SEED)?;
    let t = Instant::now();
    let reference = problem.run(&CpuBackend)?;
    log(&format!("{name}: CPU reference in {:.1} s", t.elapsed().as_secs_f64()));

    let set_bytes = input_bytes(&problem, &reference);
    let read = floors.map(|f| read_ceiling(f, timer, set_bytes, opts.mode, opts.warmup, opts.samples));
    let read = match read {
        Some(Ok(r)) => Some(r),
        Some(Err(e)) => {
            log(&format!("{name}: read ceiling not measured: {e}"));
            None
        }
        None => None,
    };
    let (kernel, mut verdict, config, graph) = match (backend, opts.mode) {
        (Ok(b), Protocol::Cold) => {
            let (k, v, c) = bench_kernel(b, &problem, &reference, timer, opts);
            (k, v, c, None)
        }
        (Ok(b), Protocol::Graph) => graph_rows::bench_kernel(b, &problem, &reference, set_bytes, timer, opts),
        (Err(e), _) => (None, fail_verdict(e), String::new(), None),
    };
    let peer_run = match opts.mode {
        Protocol::Cold => bench_peer(lt, &problem, &reference, timer, opts).map(|(s, d, a)| (s, d, a, None)),
        Protocol::Graph => {
            graph_rows::bench_peer(lt, &problem, &reference, timer, opts).map(|(s, d, a, g)| (s, d, a, Some(g)))
        }
    };
    let mut peer_graph: Option<GraphRun> = None;
    let (peer, peer_config) = match peer_run {
        Ok((samples, describe, agreement, g)) => {
            peer_graph = g;
            let how = match agreement {
                PeerAgreement::BitExact => "bit-exact".to_string(),
                PeerAgreement::Close { max_abs_err } => format!("max abs err {max_abs_err:.2e}"),
            };
            log(&format!("{name}: peer {describe}: {how}"));
            (Some(samples), describe)
        }
        Err(e) => {
            if verdict == PASS {
                verdict = fail_verdict(format!("peer: {e}"));
            }
            (None, String::new())
        }
    };
    Ok(Measurement {
        problem: kind,
        shape: shape.clone(),
        bytes: problem.bytes(),
        flops: problem.flops(),
        kernel,
        peer,
        verdict,
        config,
        peer_config,
        read: read.as_ref().map(|r: &ReadCeiling| r.samples.clone()),
        read_config: read.map_or(String::new(), |r| r.config),
        graph,
        peer_graph,
    })
}
/// Checks the kernel, times it only if it passed, and checks it once more after timing.
fn bench_kernel(
    backend: &CudaBackend,
    problem: &Problem,
    reference: &Output,
    timer: &Timer,
    opts: &Options,
) -> (Option<Samples>, String, String) {
    let mut prep = match backend.prepare(problem) {
        Ok(p) => p,
        Err(e) => return (None, fail_verdict(e), String::new()),
    };
    let config = prep.describe();
    let mode = check_mode(problem.kind());
    if let Err(e) = check_kernel(&mut prep, reference, mode) {
        return (None, fail_verdict(e), config);
    }
    let samples = match timer.time_us(|| prep.launch(), opts.warmup, opts.samples) {
        Ok(s) => s,
        Err(e) => return (None, fail_verdict(format!("while timing: {e}")), config),
    };
    if let Err(e) = check_kernel(&mut prep, reference, mode) {
        return (None, fail_verdict(format!("after timing: {e}")), config);
    }
    (Some(samples), PASS.to_string(), config)
}

/// Builds the peer, sanity-checks its output against the reference, then times it.
fn bench_peer(
    lt: &Lt,
    problem: &Problem,
    reference: &Output,
    timer: &Timer,
    opts: &Options,
) -> Result<(Samples, String, PeerAgreement)> {
    let mut peer = Peer::new(lt, problem)?;
    peer.pick_fastest(timer)?;
    peer.launch()?;
    let agreement = check_peer(&peer.output()?, reference).map_err(Error::Invalid)?;
    let samples = timer.time_us(|| peer.launch(), opts.warmup, opts.samples)?;
    Ok((samples, peer.describe(), agreement))
}
