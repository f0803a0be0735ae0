//! `nvfp4`: generate, run, check, benchmark and quantize NVFP4 problems.

// Printing goes through `console`, which survives a closed stdout or stderr; the std macros panic.
#![deny(clippy::print_stdout, clippy::print_stderr)]

mod bench;
mod check;
mod check_report;
mod console;
mod exit;
mod gen;
mod kernels;
mod quantize;
mod route;
mod run;
mod ui;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exact NVFP4 matrix kernels for NVIDIA Hopper, with an exact CPU reference.
#[derive(Parser)]
#[command(name = "nvfp4", version, about, long_about = None, after_help = exit::EXIT_STATUS_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a seeded problem (the documented distributions) and write it as safetensors.
    Gen(gen::Args),
    /// Run one operation on a case file and write the output as safetensors.
    Run(run::Args),
    /// Check a backend against the CPU reference on every catalogue test case and extra edge shapes.
    Check(check::Args),
    /// Time kernels against the speed of light and the cuBLAS FP16 peer (needs a GPU).
    Bench(bench::Args),
    /// Quantize the 2-D f32/f16/bf16 tensors of a safetensors file to NVFP4 (ModelOpt names).
    Quantize(quantize::Args),
    /// Print which kernel family runs each shape, with which plan, and why (no GPU needed).
    Route(route::Args),
    /// Compile every kernel with NVRTC and print registers and spills (needs NVRTC, not a GPU).
    ///
    /// NVRTC is the CUDA runtime compiler library, libnvrtc.so (CUDA 13). It comes with a CUDA
    /// installation, or from its Python wheel without one:
    ///
    ///   python3 -m pip install --target DIR nvidia-cuda-nvrtc==13.0.88
    ///
    ///   export LD_LIBRARY_PATH=DIR/nvidia/cu13/lib:$LD_LIBRARY_PATH
    ///
    /// (.ci/nvrtc-check installs it this way under target/nvrtc.) No GPU or driver is needed: the kernels
    /// are compiled for --arch and ptxas's report is printed. Exits 1 on a compile error or a
    /// register spill.
    Kernels(kernels::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (name, result) = match cli.command {
        Command::Gen(a) => ("gen", gen::main(a)),
        Command::Run(a) => ("run", run::main(a)),
        Command::Check(a) => ("check", check::main(a)),
        Command::Bench(a) => ("bench", bench::main(a)),
        Command::Quantize(a) => ("quantize", quantize::main(a)),
        Command::Route(a) => ("route", route::main(a)),
        Command::Kernels(a) => ("kernels", kernels::main(a)),
    };
    console::finish(result.unwrap_or_else(|failure| exit::report::<Cli>(name, failure)))
}
