//! `nvfp4 gen`.

use std::process::ExitCode;

/// Arguments of `nvfp4 gen`.
#[derive(clap::Args)]
pub struct Args {}

pub fn main(_args: Args) -> nvfp4::Result<ExitCode> {
    Ok(ExitCode::SUCCESS)
}
