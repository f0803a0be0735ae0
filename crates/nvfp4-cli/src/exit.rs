//! Exit status. 0: success. 1: the command was well formed but failed (a file that cannot be
//! read or is malformed, an output that cannot be written, a size the host cannot hold, no GPU, a
//! failed check or kernel; a stdout that fails other than by closing, `console.rs`). 2: the
//! command line itself is wrong (an unknown argument, or a value that no run could accept: a
//! malformed or out-of-range shape, case, alpha or scale layout), found from the arguments alone
//! before any file is read or anything is computed.

use std::fmt;
use std::process::ExitCode;

use crate::console::errln;
use clap::error::ErrorKind;
use clap::CommandFactory;

/// The `after_help` text of `nvfp4 --help`.
pub const EXIT_STATUS_HELP: &str = "Exit status: 0 success; 1 the command failed (unreadable or malformed file, \
too large for memory, no GPU, a failed check); 2 usage error (unknown argument, or a value no run can accept: \
shape, case, alpha), reported before any work.";

/// Why a subcommand did not succeed.
pub enum Failure {
    /// The arguments can never work: exit status 2.
    Usage(String),
    /// The run failed: exit status 1.
    Run(nvfp4::Error),
}

impl From<nvfp4::Error> for Failure {
    fn from(e: nvfp4::Error) -> Self {
        Failure::Run(e)
    }
}

/// A usage failure from anything printable.
pub fn usage(e: impl fmt::Display) -> Failure {
    Failure::Usage(e.to_string())
}

/// What a subcommand returns.
pub type Outcome = Result<ExitCode, Failure>;

/// Prints `failure` the way its kind is printed (a usage error as clap prints its own, naming the
/// subcommand's help) and returns its exit status.
pub fn report<C: CommandFactory>(subcommand: &str, failure: Failure) -> ExitCode {
    match failure {
        Failure::Run(e) => {
            errln!("error: {e}");
            ExitCode::FAILURE
        }
        Failure::Usage(msg) => {
            let mut cmd = C::command();
            cmd.build();
            let err = match cmd.find_subcommand_mut(subcommand) {
                Some(sub) => sub.error(ErrorKind::ValueValidation, msg),
                None => cmd.error(ErrorKind::ValueValidation, msg),
            };
            let _ = err.print();
            ExitCode::from(2)
        }
    }
}
