//! `nvfp4 run`: one operation on a case file, output saved as safetensors.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use nvfp4::backend::{open_with, BackendChoice, Overrides};
use nvfp4::problem::ProblemKind;

use crate::console::{errln, outln};
use crate::exit::Outcome;

/// Arguments of `nvfp4 run`.
#[derive(clap::Args)]
pub struct Args {
    /// gemv, gemm, dual-gemm or grouped-gemm.
    problem: ProblemKind,
    /// Input case file (as written by `nvfp4 gen`).
    #[arg(short, long)]
    input: PathBuf,
    /// Output safetensors file (`c`, or `c_g{i}` per group); written whole, then renamed into
    /// place. It may not be the input file.
    #[arg(short, long)]
    output: PathBuf,
    /// auto (cuda when a GPU is present), cpu or cuda.
    #[arg(long, default_value = "auto")]
    backend: BackendChoice,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    json: bool,
}

pub fn main(args: Args) -> Outcome {
    nvfp4::io::refuse_same_file(&args.input, &args.output)?;
    nvfp4::io::check_output(&args.output)?;
    let p = nvfp4::io::load_problem(&args.input, args.problem)?;
    let (backend, note) = open_with(args.backend, Overrides::from_env())?;
    if !args.json {
        errln!("{note}");
    }
    let t0 = Instant::now();
    let out = p.run(backend.as_ref())?;
    let secs = t0.elapsed().as_secs_f64();
    drop(p);
    nvfp4::io::save_output(&args.output, &out)?;
    let shapes: Vec<[usize; 3]> = out.tensors().iter().map(|t| t.shape()).collect();
    if args.json {
        let v = serde_json::json!({
            "problem": args.problem.name(), "backend": backend.name(), "seconds": secs,
            "outputs": shapes, "output": args.output.display().to_string(),
        });
        outln!("{v}");
    } else {
        outln!("{} on {} in {secs:.3} s: {shapes:?} -> {}", args.problem, backend.name(), args.output.display());
    }
    Ok(ExitCode::SUCCESS)
}
