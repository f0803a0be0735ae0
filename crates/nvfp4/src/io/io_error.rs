//! The error of a failed file access, naming the path: what every reader and writer returns
//! (its own file, so that the atomic writes and the archive reader share it without importing
//! each other).

use std::path::Path;

use crate::Error;

/// `source`, the error of an access to `path`.
pub(crate) fn io_err(path: &Path, source: std::io::Error) -> Error {
    Error::Io { path: path.to_path_buf(), source }
}
