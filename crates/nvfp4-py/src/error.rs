//! The library's errors as Python exceptions: `ValueError` for shapes, dtypes and arguments,
//! `RuntimeError` for CUDA (and everything the device or the host could not do).

use nvfp4::Error;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::PyErr;

/// The exception for a library error, with its message.
pub fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::KNotMultipleOf16 { .. }
        | Error::Shape(_)
        | Error::BufferSize { .. }
        | Error::Tensor { .. }
        | Error::File { .. }
        | Error::UnknownCase(_)
        | Error::Invalid(_)
        | Error::NonFinite { .. } => PyValueError::new_err(msg),
        Error::Io { .. }
        | Error::NoDriver(_)
        | Error::NoGpu
        | Error::NoNvrtc(_)
        | Error::Compile { .. }
        | Error::TooLarge { .. }
        | Error::OutOfMemory(_)
        | Error::Cuda(_)
        | Error::Unsupported { .. } => PyRuntimeError::new_err(msg),
    }
}

/// `ValueError` with this message.
pub fn value(msg: impl Into<String>) -> PyErr {
    PyValueError::new_err(msg.into())
}

/// `TypeError` with this message.
pub fn kind(msg: impl Into<String>) -> PyErr {
    PyTypeError::new_err(msg.into())
}

/// Results of the binding.
pub type PyResult<T> = Result<T, PyErr>;

/// Maps a library result.
pub trait IntoPy<T> {
    /// The result with a Python exception.
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for nvfp4::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
