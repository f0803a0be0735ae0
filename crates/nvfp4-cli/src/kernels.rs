//! `nvfp4 kernels` (placeholder).

use std::process::ExitCode;

/// Arguments of `nvfp4 kernels`.
#[derive(clap::Args)]
pub struct Args {}

pub fn main(_args: Args) -> nvfp4::Result<ExitCode> {
    Err(nvfp4::Error::Invalid("`nvfp4 kernels` is not built yet".into()))
}
