//! `nvfp4 bench`: parses the arguments, runs [`nvfp4::bench::run`], prints the table and writes
//! the JSON report. Exits non-zero when any kernel fails its check.

use std::path::PathBuf;
use std::process::ExitCode;

use nvfp4::backend::Overrides;
use nvfp4::bench::{self, Options, Protocol, ShapeSet, DEFAULT_SAMPLES, DEFAULT_WARMUP};
use nvfp4::ProblemKind;

use crate::console::{errln, out};
use crate::exit::Outcome;

/// Arguments of `nvfp4 bench`.
#[derive(clap::Args)]
pub struct Args {
    /// What to time: a problem (gemv, gemm, dual-gemm, grouped-gemm) or `quantize` (the GPU
    /// quantizer on 8192x8192 inputs); all four problems and the quantizer when absent.
    #[arg(value_parser = parse_target)]
    problem: Option<Target>,
    /// Shape catalogue: bench (leaderboard), test (correctness) or large (GEMM 4096³ and 8192³).
    #[arg(long, default_value = "bench", value_parser = parse_shapes)]
    shapes: ShapeSet,
    /// Write the report as JSON to this file (unlike the other subcommands' `--json` flag, which
    /// prints to stdout: the table stays on stdout here).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Timing protocol (docs/FORMAT.md §7): cold (one launch per sample, L2 flushed before it) or graph
    /// (N launches in one CUDA graph over rotating input sets, chained with programmatic
    /// dependent launch where the kernel supports it; µs per launch).
    #[arg(long, default_value = "cold", value_parser = parse_mode)]
    mode: Protocol,
    /// Timed samples per measurement (at least 20): launches with the L2 flushed (cold), or graph
    /// replays (graph).
    #[arg(long, default_value_t = DEFAULT_SAMPLES)]
    samples: usize,
    /// Warm-up launches before the timed samples.
    #[arg(long, default_value_t = DEFAULT_WARMUP)]
    warmup: usize,
}

/// One thing `nvfp4 bench` can time.
#[derive(Clone, Copy, Debug)]
enum Target {
    Problem(ProblemKind),
    Quantize,
}

fn parse_target(s: &str) -> Result<Target, String> {
    if s == nvfp4::bench::quantize::PROBLEM {
        return Ok(Target::Quantize);
    }
    s.parse().map(Target::Problem).map_err(|e: nvfp4::Error| format!("{e} (or {})", nvfp4::bench::quantize::PROBLEM))
}

fn parse_mode(s: &str) -> Result<Protocol, String> {
    s.parse().map_err(|e: nvfp4::Error| e.to_string())
}

fn parse_shapes(s: &str) -> Result<ShapeSet, String> {
    s.parse().map_err(|e: nvfp4::Error| e.to_string())
}

pub fn main(args: Args) -> Outcome {
    // A report that cannot be written is found now, not after minutes of timing.
    if let Some(path) = &args.json {
        nvfp4::io::check_output(path)?;
    }
    let (problems, quantize) = match args.problem {
        None => (ProblemKind::ALL.to_vec(), true),
        Some(Target::Problem(p)) => (vec![p], false),
        Some(Target::Quantize) => (Vec::new(), true),
    };
    let opts = Options {
        problems,
        shapes: args.shapes,
        samples: args.samples,
        warmup: args.warmup,
        mode: args.mode,
        quantize,
        overrides: Overrides::from_env(),
    };
    let report = bench::run(&opts, &mut |line| errln!("{line}"))?;
    out!("{}", report.table());
    if let Some(path) = &args.json {
        // Through a temporary file, so an interrupted run never leaves half a report.
        nvfp4::io::write_bytes_atomically(path, format!("{}\n", report.to_json()?).as_bytes())?;
        errln!("wrote {}", path.display());
    }
    Ok(if report.all_passed() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
