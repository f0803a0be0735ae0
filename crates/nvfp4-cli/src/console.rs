//! Every line the binary prints goes through here (the crate denies `println!` and `eprintln!`,
//! which panic when their stream cannot be written).
//!
//! A closed stdout or stderr (`nvfp4 check | head -1`: the reader went away) is not a failure of
//! the command: what was left to print is dropped, the command finishes its work (an output file,
//! a bench report) and exits with its own status. Any other error writing stdout (a full disk)
//! loses output the user asked for: [`finish`] reports it on stderr and exits 1.

use std::fmt;
use std::io::{self, ErrorKind, Write};
use std::process::ExitCode;
use std::sync::OnceLock;

/// The first error writing stdout other than a closed pipe, as text.
static STDOUT_FAILED: OnceLock<String> = OnceLock::new();

/// Records the outcome of a write to stdout.
fn note(result: io::Result<()>) {
    if let Err(e) = result {
        if e.kind() != ErrorKind::BrokenPipe {
            let _ = STDOUT_FAILED.set(e.to_string());
        }
    }
}

/// Writes to stdout (see the module docs).
pub fn write_out(args: fmt::Arguments<'_>) {
    note(io::stdout().lock().write_fmt(args));
}

/// Writes to stderr; nothing is left to tell when that fails, so the failure is dropped.
pub fn write_err(args: fmt::Arguments<'_>) {
    let _ = io::stderr().lock().write_fmt(args);
}

/// The exit status once everything is printed: `code`, or 1 (with a message on stderr) when
/// stdout could not be written for a reason other than a closed reader.
pub fn finish(code: ExitCode) -> ExitCode {
    note(io::stdout().lock().flush());
    match STDOUT_FAILED.get() {
        None => code,
        Some(e) => {
            write_err(format_args!("error: cannot write to stdout: {e}\n"));
            if code == ExitCode::SUCCESS {
                ExitCode::FAILURE
            } else {
                code
            }
        }
    }
}

/// `print!` through [`write_out`].
macro_rules! out {
    ($($arg:tt)*) => { $crate::console::write_out(format_args!($($arg)*)) };
}

/// `println!` through [`write_out`].
macro_rules! outln {
    ($($arg:tt)*) => { $crate::console::write_out(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `eprintln!` through [`write_err`].
macro_rules! errln {
    ($($arg:tt)*) => { $crate::console::write_err(format_args!("{}\n", format_args!($($arg)*))) };
}

pub(crate) use {errln, out, outln};
