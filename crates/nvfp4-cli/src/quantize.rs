//! `nvfp4 quantize`: dense 2-D tensors to NVFP4 in the ModelOpt convention.

use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `nvfp4 quantize`.
#[derive(clap::Args)]
pub struct Args {
    /// Input safetensors file with f32/f16/bf16 tensors.
    #[arg(short, long)]
    input: PathBuf,
    /// Output safetensors file: `<name>` U8 [N, K/2], `<name>_scale` F8_E4M3 [N, K/16],
    /// `<name>_scale_2` F32 (global scale); other tensors copied unchanged.
    #[arg(short, long)]
    output: PathBuf,
}

pub fn main(args: Args) -> nvfp4::Result<ExitCode> {
    let summary = nvfp4::io::quantize_file(&args.input, &args.output, Default::default())?;
    println!("{summary}");
    Ok(ExitCode::SUCCESS)
}
