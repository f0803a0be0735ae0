//! `nvfp4 run`: one operation on a case file of either mode (W4A4, or W4A16 with a 16-bit
//! activation tensor), output saved as safetensors.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use nvfp4::backend::{open_with, BackendChoice, Overrides};
use nvfp4::check::w4a16::short;
use nvfp4::io::CaseProblem;
use nvfp4::problem::ProblemKind;
use nvfp4::{Error, OutputDtype};

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
    /// The output type of a W4A16 case: bf16 or f16 (default: the activation's type). A W4A4
    /// case's output is f16.
    #[arg(long, value_parser = parse_dtype)]
    out_dtype: Option<OutputDtype>,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    json: bool,
}

fn parse_dtype(s: &str) -> Result<OutputDtype, String> {
    match s {
        "bf16" => Ok(OutputDtype::Bf16),
        "f16" => Ok(OutputDtype::F16),
        _ => Err(format!("unknown output type `{s}` (bf16, f16)")),
    }
}

pub fn main(args: Args) -> Outcome {
    nvfp4::io::refuse_same_file(&args.input, &args.output)?;
    nvfp4::io::check_output(&args.output)?;
    let case = nvfp4::io::load_case(&args.input, args.problem)?;
    if let (CaseProblem::W4a4(_), Some(OutputDtype::Bf16)) = (&case, args.out_dtype) {
        return Err(Error::Invalid(format!(
            "{} holds a W4A4 case, whose output file is f16; --out-dtype bf16 applies to W4A16 cases",
            args.input.display()
        ))
        .into());
    }
    let (backend, note) = open_with(args.backend, Overrides::from_env())?;
    if !args.json {
        errln!("{note}");
    }
    let t0 = Instant::now();
    // The W4A16 activation's type (`None` for W4A4), the output type, the output shapes and the
    // seconds the run took (before writing).
    let (act, dtype, shapes, secs) = match case {
        CaseProblem::W4a4(p) => {
            let out = p.run(backend.as_ref())?;
            let secs = t0.elapsed().as_secs_f64();
            drop(p);
            nvfp4::io::save_output(&args.output, &out)?;
            (None, OutputDtype::F16, out.tensors().iter().map(|t| t.shape()).collect::<Vec<_>>(), secs)
        }
        CaseProblem::W4a16(p) => {
            let (act, dtype) = (p.act_dtype(), args.out_dtype.unwrap_or(p.act_dtype()));
            let outs = p.run_as(backend.as_ref(), dtype)?;
            let secs = t0.elapsed().as_secs_f64();
            drop(p);
            nvfp4::io::save_outputs16(&args.output, args.problem, &outs)?;
            (Some(act), dtype, outs.iter().map(|t| t.shape()).collect(), secs)
        }
    };
    if args.json {
        let v = serde_json::json!({
            "problem": args.problem.name(), "mode": if act.is_some() { "w4a16" } else { "w4a4" },
            "activation": act.map_or("nvfp4", short), "output_dtype": short(dtype), "backend": backend.name(),
            "seconds": secs, "outputs": shapes, "output": args.output.display().to_string(),
        });
        outln!("{v}");
    } else {
        let what = act.map_or_else(String::new, |a| format!(" (W4A16 {} -> {})", short(a), short(dtype)));
        outln!("{}{what} on {} in {secs:.3} s: {shapes:?} -> {}", args.problem, backend.name(), args.output.display());
    }
    Ok(ExitCode::SUCCESS)
}
