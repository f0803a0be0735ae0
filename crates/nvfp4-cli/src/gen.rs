//! `nvfp4 gen`: draw a seeded problem with the SPEC distributions and save it.

use std::path::PathBuf;
use std::process::ExitCode;

use nvfp4::problem::{generate, Case, ProblemKind, Shape};
use nvfp4::ScaleLayout;

/// Arguments of `nvfp4 gen`.
#[derive(clap::Args)]
pub struct Args {
    /// gemv, gemm, dual-gemm or grouped-gemm.
    problem: ProblemKind,
    /// A catalogue case: test:N or bench:N (N from 0).
    #[arg(long, conflicts_with = "shape", required_unless_present = "shape")]
    case: Option<Case>,
    /// An explicit shape: MxKxL (gemv), MxNxK[xL] (gemm, dual-gemm), m1,m2/n1,n2/k1,k2 (grouped-gemm).
    #[arg(long)]
    shape: Option<String>,
    /// Generator seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Scale layout written to the file: plain [L, rows, K/16] or blocked [L, R, C, 512].
    #[arg(long, default_value = "plain", value_parser = parse_layout)]
    scales: ScaleLayout,
    /// Optional FP32 alpha stored in the file and applied before rounding.
    #[arg(long)]
    alpha: Option<f32>,
    /// Output safetensors file.
    #[arg(short, long)]
    output: PathBuf,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    json: bool,
}

pub fn parse_layout(s: &str) -> Result<ScaleLayout, String> {
    match s {
        "plain" => Ok(ScaleLayout::Plain),
        "blocked" => Ok(ScaleLayout::Blocked),
        _ => Err(format!("unknown scale layout `{s}` (plain, blocked)")),
    }
}

pub fn main(args: Args) -> nvfp4::Result<ExitCode> {
    let shape = match (&args.case, &args.shape) {
        (Some(case), _) => case.shape(args.problem)?,
        (None, Some(s)) => Shape::parse(args.problem, s)?,
        (None, None) => unreachable!("clap requires --case or --shape"),
    };
    let mut p = generate(&shape, args.seed)?;
    p.set_alpha(args.alpha)?;
    let p = p.with_layout(args.scales);
    nvfp4::io::save_problem(&args.output, &p)?;
    if args.json {
        let v = serde_json::json!({
            "problem": args.problem.name(), "shape": shape.to_string(), "seed": args.seed,
            "scales": format!("{:?}", args.scales).to_lowercase(), "bytes": p.bytes(),
            "output": args.output.display().to_string(),
        });
        println!("{v}");
    } else {
        println!(
            "{} {shape} (seed {}, {:?} scales, {:.1} MB) -> {}",
            args.problem,
            args.seed,
            args.scales,
            p.bytes() as f64 / 1e6,
            args.output.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
