//! Diagnostics of the skeleton's operations (GEMM, dual GEMM) for kernel work: a dev tool, not a
//! test and not the benchmark; the numbers that count come from `nvfp4 bench`. Needs an NVIDIA
//! GPU. A shape is `MxNxK` (GEMM) or `dual:MxNxK` (dual GEMM).
//!
//! `dev_gemm_diag timing [MxNxK=cfg,cfg ...]`  median/min µs per shape and forced configuration
//!     (`auto` or an `NVFP4_GEMM_SM90` / `NVFP4_DUAL_SM90` value such as `m128n128s2`), L2
//!     flushed before each sample; without arguments, the GEMM bench shapes and 4096³ with a few
//!     configurations each
//! `dev_gemm_diag graph [MxNxK=cfg ...]`       SPEC §7's graph protocol, done here until the bench
//!     has it: N >= 20 launches captured in one CUDA graph over rotating input sets (> 3x L2 of
//!     inputs), µs per launch (median of 10 replays), unchained and chained by programmatic
//!     dependent launch, and the cuBLASLt FP16 peer captured the same way
//! `dev_gemm_diag profile MxNxK [cfg]`         a few flushed launches of one shape, a target for ncu
//! `dev_gemm_diag config MxNxK ...`            the heuristic's choice (no GPU needed)
//! `dev_gemm_diag soak MxNxK cfg SECONDS`      back-to-back launches (warm L2) for SECONDS, to
//!     watch clocks and power from outside (`nvidia-smi --query-gpu=clocks.sm,power.draw -lms`)
//!
//! Every configuration is checked against the CPU reference (bit-exactly for the GEMM, within the
//! SPEC tolerance for the dual GEMM) before it is timed, unless `DIAG_NOCHECK=1` (for ablations:
//! kernel variants loaded from `NVFP4_KERNELS_DIR` that are wrong on purpose).

use nvfp4::backend::cuda::sm90::{self, Forced, Op};
use nvfp4::backend::cuda::{CudaBackend, Overrides, Prepared};
use nvfp4::check::{compare_outputs, Mode};
use nvfp4::problem::Problem;
use nvfp4::problem::{generate, ProblemKind, Shape};
use nvfp4::CpuBackend;

mod common;
use common::{gpu, median_min, time_memset_flush};

const DEFAULT_CASES: [&str; 5] = [
    "128x7168x16384=auto,m256n128s4,m128n128s2",
    "128x4096x7168=auto,m256n128s8,m128n128s4",
    "128x7168x2048=auto,m256n128s4,m128n128s2",
    "128x7168x256=auto",
    "4096x4096x4096=auto,m128n256,m128n128",
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("timing") => timing(&args[1..]),
        Some("graph") => graph(&args[1..]),
        Some("profile") if args.len() >= 2 => profile(&args[1], args.get(2).map(String::as_str)),
        Some("soak") if args.len() >= 4 => soak(&args[1], &args[2], args[3].parse().expect("SECONDS")),
        Some("config") => {
            for s in &args[1..] {
                match parse_case(s) {
                    (Op::Grouped, Shape::GroupedGemm { groups }) => {
                        println!("{}", sm90::grouped_plan(&sm90::GroupedShape::List(groups), 132, None))
                    }
                    (op, Shape::Gemm { m, n, k, l } | Shape::DualGemm { m, n, k, l }) => {
                        println!("{}", sm90::plan(op, (m, n, k, l), 132, None))
                    }
                    (_, other) => panic!("no plan for {other}"),
                }
            }
        }
        _ => {
            eprintln!(
                "usage: dev_gemm_diag timing [MxNxK=cfg,...]... | profile MxNxK [cfg] | config MxNxK... \
                 | soak MxNxK cfg SECONDS"
            );
            std::process::exit(2);
        }
    }
}

/// `MxNxK` (GEMM), `dual:MxNxK` (dual GEMM) or `grouped:m1,m2,../n/k` (grouped GEMM).
fn parse_case(s: &str) -> (Op, Shape) {
    let parse = |kind, t: &str| Shape::parse(kind, t).unwrap_or_else(|e| panic!("shape {s}: {e}"));
    if let Some(rest) = s.strip_prefix("dual:") {
        (Op::Dual, parse(ProblemKind::DualGemm, rest))
    } else if let Some(rest) = s.strip_prefix("grouped:") {
        (Op::Grouped, parse(ProblemKind::GroupedGemm, rest))
    } else {
        (Op::Gemm, parse(ProblemKind::Gemm, s))
    }
}

fn problem(shape: &Shape, seed: u64) -> Problem {
    generate(shape, seed).unwrap()
}

/// Prepares `p` under a forced configuration (`auto`: the heuristic's) and checks it.
fn prepare_checked(b: &CudaBackend, op: Op, p: &Problem, reference: &nvfp4::problem::Output, cfg: &str) -> Prepared {
    let forced = (cfg != "auto").then(|| Forced::parse(cfg).unwrap_or_else(|| panic!("{cfg}: not a forced choice")));
    let overrides = match op {
        Op::Gemm => Overrides { gemm: forced, ..*b.overrides() },
        Op::Dual => Overrides { dual: forced, ..*b.overrides() },
        Op::Grouped => Overrides { grouped: forced, ..*b.overrides() },
    };
    let prep = b.with_overrides(overrides).prepare(p);
    let mut prep = prep.unwrap_or_else(|e| panic!("{cfg}: prepare: {e}"));
    prep.poison().unwrap();
    prep.launch().unwrap();
    let mode = if op == Op::Dual { Mode::Tolerance } else { Mode::BitExact };
    let report = compare_outputs(&prep.output().unwrap(), reference, mode);
    // DIAG_NOCHECK=1 times kernels that are wrong on purpose (ablations of kernel variants
    // loaded with NVFP4_KERNELS_DIR).
    if std::env::var("DIAG_NOCHECK").is_ok_and(|v| v == "1") {
        println!("{cfg}: unchecked ({})", if report.passed() { "passes" } else { "fails" });
    } else {
        assert!(report.passed(), "{cfg}: {report}");
    }
    prep
}

fn timing(args: &[String]) {
    let b = gpu();
    let cases: Vec<String> =
        if args.is_empty() { DEFAULT_CASES.iter().map(|s| s.to_string()).collect() } else { args.to_vec() };
    let mut rows = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let (shape, cfgs) = case.split_once('=').unwrap_or((case, "auto"));
        let (op, shape_v) = parse_case(shape);
        let p = problem(&shape_v, 700 + i as u64);
        let reference = p.run(&CpuBackend).unwrap();
        for cfg in cfgs.split(',') {
            let mut prep = prepare_checked(&b, op, &p, &reference, cfg);
            let (med, min) = time_memset_flush(&b, &mut prep, 30);
            let tflops = p.flops() / (med as f64 * 1e-6) / 1e12;
            let row =
                format!("{shape} {cfg:<11} {med:>8.2} us (min {min:>8.2}) {tflops:>6.1} TFLOP/s | {}", prep.describe());
            println!("{row}");
            rows.push(row);
        }
    }
    println!("\nsm90 timing (L2 flushed, median of 30):");
    for r in rows {
        println!("{r}");
    }
}

/// Input sets whose inputs total more than 3x L2 (at least 2), and the launches of one graph: a
/// multiple of the sets, at least 20.
fn rotation(input_bytes: u64, l2: usize) -> (usize, usize) {
    let sets = ((3 * l2 as u64) / input_bytes.max(1) + 1).max(2) as usize;
    (sets, sets * 20usize.div_ceil(sets))
}

/// µs per launch of `launches` launches of `launch(i)` captured in one graph on `s`: median of 10
/// replays after 3 warm-up replays.
fn graph_us(s: &std::sync::Arc<cudarc::driver::CudaStream>, launches: usize, mut launch: impl FnMut(usize)) -> f32 {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    (0..launches).for_each(&mut launch);
    let g = s.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("an empty graph");
    g.upload().unwrap();
    for _ in 0..3 {
        g.launch().unwrap();
    }
    let ctx = s.context();
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let (e0, e1) = (ctx.new_event(flags).unwrap(), ctx.new_event(flags).unwrap());
    let us = (0..10)
        .map(|_| {
            e0.record(s).unwrap();
            g.launch().unwrap();
            e1.record(s).unwrap();
            e0.elapsed_ms(&e1).unwrap() * 1e3 / launches as f32
        })
        .collect();
    median_min(us).0
}

fn graph(args: &[String]) {
    let b = gpu();
    let s = b.stream().clone();
    let l2 = s.context().attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE).unwrap()
        as usize;
    let lt = nvfp4::bench::Lt::new(s.clone()).unwrap();
    let cases: Vec<String> = if args.is_empty() {
        ["128x7168x16384", "128x4096x7168", "128x7168x2048"].iter().map(|c| c.to_string()).collect()
    } else {
        args.to_vec()
    };
    let mut rows = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let (shape, cfg) = case.split_once('=').unwrap_or((case, "auto"));
        let (op, shape_v) = parse_case(shape);
        let first = problem(&shape_v, 900 + i as u64);
        let (sets, launches) = rotation(first.bytes(), l2);
        let problems: Vec<Problem> = (0..sets)
            .map(|j| if j == 0 { first.clone() } else { problem(&shape_v, 900 + i as u64 + 1000 * j as u64) })
            .collect();
        let references: Vec<_> = problems.iter().map(|p| p.run(&CpuBackend).unwrap()).collect();
        let mut preps: Vec<Prepared> =
            problems.iter().zip(&references).map(|(p, r)| prepare_checked(&b, op, p, r, cfg)).collect();
        let plain = graph_us(&s, launches, |j| preps[j % sets].launch().unwrap());
        let supported = preps.iter().all(|p| p.chains());
        preps.iter_mut().for_each(|p| p.poison().unwrap());
        let chained = graph_us(&s, launches, |j| preps[j % sets].launch_chained().unwrap());
        // Every set's output after the chained replays, checked again.
        let mode = if op == Op::Dual { Mode::Tolerance } else { Mode::BitExact };
        let nocheck = std::env::var("DIAG_NOCHECK").is_ok_and(|v| v == "1");
        for (p, r) in preps.iter().zip(&references) {
            let report = compare_outputs(&p.output().unwrap(), r, mode);
            assert!(nocheck || report.passed(), "chained: {report}");
        }
        // The peer, its own input sets (FP16 operands: more bytes, fewer sets needed).
        let (psets, plaunches) = rotation(fp16_input_bytes(&shape_v), l2);
        let peers: Vec<nvfp4::bench::Peer> =
            problems.iter().cycle().take(psets).map(|p| nvfp4::bench::Peer::new(&lt, p).unwrap()).collect();
        let peer = graph_us(&s, plaunches, |j| peers[j % psets].launch().unwrap());
        let row = format!(
            "{shape} {cfg:<11} graph: {plain:>7.2} us/launch, chained {chained:>7.2} ({}), peer {peer:>7.2} -> \
             {:.2}x | {launches} launches over {sets} sets (peer {plaunches} over {psets}) | {}",
            if supported { "PDL" } else { "no PDL support" },
            peer / chained.min(plain),
            preps[0].describe()
        );
        println!("{row}");
        rows.push(row);
    }
    println!("\nsm90 graph protocol (µs per launch, median of 10 replays):");
    for r in rows {
        println!("{r}");
    }
}

/// Bytes of the FP16 operands the peer reads (A and B, dequantized).
fn fp16_input_bytes(shape: &Shape) -> u64 {
    match *shape {
        Shape::Gemm { m, n, k, l } => (2 * (m + n) * k * l) as u64,
        Shape::DualGemm { m, n, k, l } => (2 * (m + 2 * n) * k * l) as u64,
        _ => panic!("graph mode: GEMM and dual GEMM shapes"),
    }
}

fn profile(shape: &str, cfg: Option<&str>) {
    let b = gpu();
    let (op, shape_v) = parse_case(shape);
    let p = problem(&shape_v, 700);
    let reference = p.run(&CpuBackend).unwrap();
    let mut prep = prepare_checked(&b, op, &p, &reference, cfg.unwrap_or("auto"));
    let (med, _) = time_memset_flush(&b, &mut prep, 5);
    println!("{shape} {}: {med:.2} us | {}", cfg.unwrap_or("auto"), prep.describe());
}

fn soak(shape: &str, cfg: &str, seconds: f64) {
    let b = gpu();
    let (op, shape_v) = parse_case(shape);
    let p = problem(&shape_v, 700);
    let reference = p.run(&CpuBackend).unwrap();
    let mut prep = prepare_checked(&b, op, &p, &reference, cfg);
    let start = std::time::Instant::now();
    let mut launches = 0usize;
    while start.elapsed().as_secs_f64() < seconds {
        for _ in 0..200 {
            prep.launch().unwrap();
        }
        b.stream().synchronize().unwrap();
        launches += 200;
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / launches as f64;
    println!("{shape} {cfg}: {launches} back-to-back launches, {us:.2} us each | {}", prep.describe());
}
