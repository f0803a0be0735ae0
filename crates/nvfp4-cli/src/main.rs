//! `nvfp4`: generate, run, check, benchmark and quantize NVFP4 problems.

mod bench;
mod check;
mod gen;
mod kernels;
mod quantize;
mod run;
mod ui;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exact NVFP4 matrix kernels for NVIDIA Hopper, with an exact CPU reference.
#[derive(Parser)]
#[command(name = "nvfp4", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a seeded problem (SPEC distributions) and write it as safetensors.
    Gen(gen::Args),
    /// Run one operation on a case file and write the output as safetensors.
    Run(run::Args),
    /// Check a backend against the CPU reference on every SPEC test case and extra random shapes.
    Check(check::Args),
    /// Time kernels against the speed of light and the cuBLAS FP16 peer (needs a GPU).
    Bench(bench::Args),
    /// Quantize the 2-D f32/f16/bf16 tensors of a safetensors file to NVFP4 (ModelOpt names).
    Quantize(quantize::Args),
    /// Compile every kernel with NVRTC and print registers and spills (no GPU needed).
    Kernels(kernels::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Gen(a) => gen::main(a),
        Command::Run(a) => run::main(a),
        Command::Check(a) => check::main(a),
        Command::Bench(a) => bench::main(a),
        Command::Quantize(a) => quantize::main(a),
        Command::Kernels(a) => kernels::main(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
