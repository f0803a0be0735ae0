//! `nvfp4 check`.

use std::process::ExitCode;

/// Arguments of `nvfp4 check`.
#[derive(clap::Args)]
pub struct Args {}

pub fn main(_args: Args) -> nvfp4::Result<ExitCode> {
    Ok(ExitCode::SUCCESS)
}
