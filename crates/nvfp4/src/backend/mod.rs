//! Backends: `cpu` (exact reference) and `cuda` (Hopper kernels), and the choice between them.

pub mod cpu;
pub mod cuda;

use std::fmt;
use std::str::FromStr;

pub use cpu::CpuBackend;
pub use cuda::{CudaBackend, Overrides};

use crate::ops::Backend;
use crate::{Error, Result};

/// Which backend the caller asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// CUDA when a GPU is present, else the CPU.
    #[default]
    Auto,
    /// The exact CPU backend.
    Cpu,
    /// The CUDA backend; an error when no GPU can be used.
    Cuda,
}

impl FromStr for BackendChoice {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(BackendChoice::Auto),
            "cpu" => Ok(BackendChoice::Cpu),
            "cuda" => Ok(BackendChoice::Cuda),
            _ => Err(Error::Invalid(format!("unknown backend `{s}` (auto, cpu, cuda)"))),
        }
    }
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Cpu => "cpu",
            BackendChoice::Cuda => "cuda",
        })
    }
}

/// Opens the chosen backend. `Auto` picks CUDA when it opens and the CPU otherwise; the second
/// value says what was picked and why, for the caller to print.
pub fn open(choice: BackendChoice) -> Result<(Box<dyn Backend>, String)> {
    open_with(choice, Overrides::NONE)
}

/// [`open`], the CUDA backend routing under `overrides` (a program reads them from the
/// environment once, where it starts: [`Overrides::from_env`]).
pub fn open_with(choice: BackendChoice, overrides: Overrides) -> Result<(Box<dyn Backend>, String)> {
    let cuda = || CudaBackend::new().map(|b| b.with_overrides(overrides));
    match choice {
        BackendChoice::Cpu => Ok((Box::new(CpuBackend), "backend: cpu".into())),
        BackendChoice::Cuda => {
            let b = cuda()?;
            let note = format!("backend: cuda ({})", b.device_name());
            Ok((Box::new(b), note))
        }
        BackendChoice::Auto => match cuda() {
            Ok(b) => {
                let note = format!("backend: cuda ({}), picked by auto", b.device_name());
                Ok((Box::new(b), note))
            }
            Err(e) => Ok((Box::new(CpuBackend), format!("backend: cpu, picked by auto ({e})"))),
        },
    }
}
