//! `nvfp4 bench` (placeholder).

use std::process::ExitCode;

/// Arguments of `nvfp4 bench`.
#[derive(clap::Args)]
pub struct Args {}

pub fn main(_args: Args) -> nvfp4::Result<ExitCode> {
    Err(nvfp4::Error::Invalid("`nvfp4 bench` is not built yet".into()))
}
