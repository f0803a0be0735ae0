//! `nvfp4 gen`: draw a seeded problem with the documented distributions and save it: W4A4
//! (NVFP4 activations) by default, W4A16 with `--act bf16|f16` (a 16-bit activation tensor from
//! the exact or the random tier, docs/FORMAT.md §10).

use std::path::PathBuf;
use std::process::ExitCode;

use nvfp4::memory::{checked_sum, ensure_host};
use nvfp4::problem::{check_exact_tier, generate, generate16, generate16_bytes, Case, ProblemKind, Shape, Tier};
use nvfp4::{OutputDtype, ScaleLayout};

use crate::console::outln;
use crate::exit::{usage, Outcome};

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
    /// Optional FP32 alpha stored in the file and applied before rounding: finite, and not a
    /// non-zero value that rounds to 0 in f32.
    #[arg(long, value_parser = parse_alpha, allow_hyphen_values = true)]
    alpha: Option<f32>,
    /// The activation: nvfp4 (W4A4), or a 16-bit tensor of bf16 or f16 (W4A16; the GEMV's
    /// vector, every other operation's A).
    #[arg(long, default_value = "nvfp4", value_parser = parse_act)]
    act: Act,
    /// W4A16 data: exact (FP32 sums exact, so results are bit-identical) or random (bell-shaped
    /// activations, weights quantized with a non-trivial global scale). Default: exact.
    #[arg(long)]
    tier: Option<Tier>,
    /// Output safetensors file (written whole, then renamed into place).
    #[arg(short, long)]
    output: PathBuf,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    json: bool,
}

/// The activation `--act` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// NVFP4 (W4A4).
    Nvfp4,
    /// 16-bit (W4A16).
    Dense(OutputDtype),
}

pub fn parse_act(s: &str) -> Result<Act, String> {
    match s {
        "nvfp4" => Ok(Act::Nvfp4),
        "bf16" => Ok(Act::Dense(OutputDtype::Bf16)),
        "f16" => Ok(Act::Dense(OutputDtype::F16)),
        _ => Err(format!("unknown activation `{s}` (nvfp4, bf16, f16)")),
    }
}

pub fn parse_layout(s: &str) -> Result<ScaleLayout, String> {
    match s {
        "plain" => Ok(ScaleLayout::Plain),
        "blocked" => Ok(ScaleLayout::Blocked),
        _ => Err(format!("unknown scale layout `{s}` (plain, blocked)")),
    }
}

/// The library's alpha rule (`nvfp4::ops::parse_alpha`): finite, and a non-zero decimal that
/// neither overflows f32 nor rounds to 0 there.
fn parse_alpha(s: &str) -> Result<f32, String> {
    nvfp4::ops::parse_alpha(s).map_err(|e| match e {
        nvfp4::Error::Invalid(msg) => msg,
        other => other.to_string(),
    })
}

/// The shape the arguments name; every failure is a usage error (the catalogue and the shape
/// rules are known without reading anything).
/// A shape the case-file format cannot hold (the MoE form) is a usage error too.
fn shape_of(args: &Args) -> Result<Shape, crate::exit::Failure> {
    let shape = match (&args.case, &args.shape) {
        (Some(case), _) => case.shape(args.problem).map_err(usage)?,
        (None, Some(s)) => Shape::parse(args.problem, s).map_err(usage)?,
        (None, None) => return Err(usage("one of --case or --shape is required")),
    };
    nvfp4::io::check_file_form(&shape).map_err(usage)?;
    match (args.act, args.tier) {
        (Act::Nvfp4, Some(_)) => return Err(usage("--tier draws W4A16 data: give --act bf16 or --act f16")),
        (Act::Dense(_), None | Some(Tier::Exact)) => check_exact_tier(&shape).map_err(usage)?,
        _ => {}
    }
    Ok(shape)
}

/// Draws and writes the W4A16 case; returns the tier.
fn gen16(args: &Args, shape: &Shape, act: OutputDtype) -> Result<Tier, crate::exit::Failure> {
    let tier = args.tier.unwrap_or(Tier::Exact);
    // The generator's operands, plus the weights' scales once more while they change layout.
    let extra = if args.scales == ScaleLayout::Plain { Some(0) } else { shape.scale_bytes(args.scales) };
    let needed = checked_sum([generate16_bytes(shape, tier), extra]);
    ensure_host(&format!("generating W4A16 {} {shape} with {:?} scales", args.problem, args.scales), needed)?;
    let mut p = generate16(shape, act, tier, args.seed)?;
    p.set_alpha(args.alpha)?;
    nvfp4::io::save_problem16(&args.output, &p.into_layout(args.scales))?;
    Ok(tier)
}

pub fn main(args: Args) -> Outcome {
    let shape = shape_of(&args)?;
    nvfp4::io::check_output(&args.output)?;
    let tier = match args.act {
        Act::Nvfp4 => {
            // The generated operands, plus each operand's scales once more while they change layout.
            let extra = if args.scales == ScaleLayout::Plain { Some(0) } else { shape.scale_bytes(args.scales) };
            let needed = checked_sum([shape.input_bytes(ScaleLayout::Plain), extra]);
            ensure_host(&format!("generating {} {shape} with {:?} scales", args.problem, args.scales), needed)?;
            let mut p = generate(&shape, args.seed)?;
            p.set_alpha(args.alpha)?;
            nvfp4::io::save_problem(&args.output, &p.into_layout(args.scales))?;
            None
        }
        Act::Dense(act) => Some(gen16(&args, &shape, act)?),
    };
    let act = match args.act {
        Act::Nvfp4 => "nvfp4",
        Act::Dense(d) => nvfp4::check::w4a16::short(d),
    };
    // A character device or a FIFO is written in place: its size says nothing.
    let file_bytes = match std::fs::metadata(&args.output) {
        Ok(m) if m.is_file() => Some(m.len()),
        Ok(_) => None,
        Err(source) => return Err(nvfp4::Error::Io { path: args.output.clone(), source }.into()),
    };
    if args.json {
        let v = serde_json::json!({
            "problem": args.problem.name(), "shape": shape.to_string(), "seed": args.seed,
            "activation": act, "tier": tier.map(Tier::name),
            "scales": format!("{:?}", args.scales).to_lowercase(), "alpha": args.alpha,
            "file_bytes": file_bytes, "output": args.output.display().to_string(),
        });
        outln!("{v}");
    } else {
        let size = match file_bytes {
            Some(n) => format!("{n} bytes, {:.1} MB", n as f64 / 1e6),
            None => "written in place: not a regular file".into(),
        };
        let mode = tier.map_or_else(String::new, |t| format!("W4A16 {act}, {t} tier, "));
        outln!(
            "{} {shape} ({mode}seed {}, {:?} scales) -> {} ({size})",
            args.problem,
            args.seed,
            args.scales,
            args.output.display(),
        );
    }
    Ok(ExitCode::SUCCESS)
}
