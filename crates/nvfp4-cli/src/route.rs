//! `nvfp4 route`: which kernel family runs each shape, with which plan, and why the families
//! before it did not: the router's answer (backend/cuda/route.rs), printed without running
//! anything. On the GPU when `--device` is given (the driver's occupancy), else for a modeled
//! Hopper of `--sms` SMs, which needs neither a GPU nor NVRTC. `NVFP4_*_SM90` steer it as they
//! steer a run. `--act bf16` (or f16) asks for the W4A16 form of each shape.

use std::process::ExitCode;

use nvfp4::backend::cuda::{route, CudaBackend, Modeled, Overrides};
use nvfp4::bench::ShapeSet;
use nvfp4::problem::{ProblemKind, Shape};
use nvfp4::{OutputDtype, ScaleLayout};

use crate::console::outln;
use crate::exit::Outcome;

/// Arguments of `nvfp4 route`.
#[derive(clap::Args)]
pub struct Args {
    /// One problem (gemv, gemm, dual-gemm, grouped-gemm); all four when absent.
    problem: Option<ProblemKind>,
    /// One shape in the `gen --shape` form (needs the problem), instead of a catalogue.
    #[arg(long, requires = "problem")]
    shape: Option<String>,
    /// The catalogue: bench, test or large (docs/FORMAT.md §6).
    #[arg(long, default_value = "test", value_parser = parse_shapes)]
    shapes: ShapeSet,
    /// Scale layout of the operands: plain or blocked.
    #[arg(long, default_value = "plain", value_parser = parse_layout)]
    layout: ScaleLayout,
    /// W4A16: activations of this 16-bit type (bf16 or f16; the GEMV's vector, every other
    /// operation's A) instead of NVFP4.
    #[arg(long, value_parser = parse_act)]
    act: Option<OutputDtype>,
    /// SMs of the modeled GPU (132: H100 and H200).
    #[arg(long, default_value_t = Modeled::HOPPER.sms)]
    sms: usize,
    /// Ask the GPU (its SMs and the compiled kernels' occupancy) instead of a model.
    #[arg(long)]
    device: bool,
}

fn parse_shapes(s: &str) -> Result<ShapeSet, String> {
    s.parse().map_err(|e: nvfp4::Error| e.to_string())
}

fn parse_act(s: &str) -> Result<OutputDtype, String> {
    match s {
        "bf16" => Ok(OutputDtype::Bf16),
        "f16" => Ok(OutputDtype::F16),
        _ => Err(format!("`{s}`: bf16 or f16")),
    }
}

fn parse_layout(s: &str) -> Result<ScaleLayout, String> {
    match s {
        "plain" => Ok(ScaleLayout::Plain),
        "blocked" => Ok(ScaleLayout::Blocked),
        _ => Err(format!("`{s}`: plain or blocked")),
    }
}

pub fn main(args: Args) -> Outcome {
    let shapes: Vec<Shape> = match (&args.shape, args.problem) {
        (Some(s), Some(kind)) => vec![Shape::parse(kind, s)?],
        _ => args
            .problem
            .map_or(ProblemKind::ALL.to_vec(), |k| vec![k])
            .into_iter()
            .flat_map(|k| args.shapes.shapes(k))
            .collect(),
    };
    let overrides = Overrides::from_env();
    let gpu = if args.device { Some(CudaBackend::new()?.with_overrides(overrides)) } else { None };
    let model = Modeled { sms: args.sms, ..Modeled::HOPPER };
    let mut refused = false;
    for shape in shapes {
        let op = shape.op_meta_in(args.layout, args.act);
        let r = match &gpu {
            Some(b) => b.route(&op),
            None => route(&op, &model, &overrides),
        };
        match r {
            Ok(r) => outln!("{} {shape}: {r}", shape.kind()),
            Err(e) => {
                refused = true;
                outln!("{} {shape}: refused: {e}", shape.kind());
            }
        }
    }
    Ok(if refused { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
