//! `nvfp4 run`.

use std::process::ExitCode;

/// Arguments of `nvfp4 run`.
#[derive(clap::Args)]
pub struct Args {}

pub fn main(_args: Args) -> nvfp4::Result<ExitCode> {
    Ok(ExitCode::SUCCESS)
}
