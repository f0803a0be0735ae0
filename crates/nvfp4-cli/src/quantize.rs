//! `nvfp4 quantize`: dense 2-D tensors to NVFP4 in the ModelOpt convention.

use std::path::PathBuf;
use std::process::ExitCode;

use nvfp4::io::{QuantizeOptions, QuantizeSummary, SkipReason};

use crate::console::outln;
use crate::exit::Outcome;

/// Arguments of `nvfp4 quantize`.
#[derive(clap::Args)]
pub struct Args {
    /// Input safetensors file with f32/f16/bf16 tensors.
    #[arg(short, long)]
    input: PathBuf,
    /// Output safetensors file: `<name>` U8 [N, K/2], `<name>_scale` F8_E4M3 [N, K/16],
    /// `<name>_scale_2` F32 (global scale); skipped tensors copied unchanged. Written whole, then
    /// renamed into place; it may not be the input file.
    #[arg(short, long)]
    output: PathBuf,
    /// Fail, writing nothing, when any tensor would be skipped (not a 2-D F32/F16/BF16 tensor
    /// with K a multiple of 16).
    #[arg(long)]
    strict: bool,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    json: bool,
}

fn reason_code(r: &SkipReason) -> &'static str {
    match r {
        SkipReason::Dtype => "dtype",
        SkipReason::NotTwoD => "not-2d",
        SkipReason::Empty => "empty",
        SkipReason::KNotMultipleOf16 => "k-not-multiple-of-16",
    }
}

fn json(args: &Args, s: &QuantizeSummary) -> serde_json::Value {
    let quantized: Vec<_> =
        s.quantized.iter().map(|(name, shape)| serde_json::json!({"name": name, "shape": shape})).collect();
    let skipped: Vec<_> = s
        .skipped
        .iter()
        .map(|k| {
            serde_json::json!({
                "name": k.name, "dtype": k.dtype, "shape": k.shape,
                "reason": reason_code(&k.reason), "message": k.to_string(),
            })
        })
        .collect();
    serde_json::json!({
        "input": args.input.display().to_string(), "output": args.output.display().to_string(),
        "quantized": quantized, "skipped": skipped,
        "input_bytes": s.input_bytes, "output_bytes": s.output_bytes,
    })
}

pub fn main(args: Args) -> Outcome {
    let summary = nvfp4::io::quantize_file(&args.input, &args.output, QuantizeOptions { strict: args.strict })?;
    if args.json {
        outln!("{}", json(&args, &summary));
    } else {
        outln!("{summary}");
    }
    Ok(ExitCode::SUCCESS)
}
