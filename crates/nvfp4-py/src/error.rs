//! The library's errors as Python exceptions: `ValueError` for shapes and arguments,
//! `nvfp4.DtypeError` (a `TypeError` and a `ValueError`) for a tensor of the wrong element type,
//! `RuntimeError` for CUDA (and everything the device or the host could not do).

use nvfp4::Error;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
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

/// `nvfp4.DtypeError`: a tensor of an element type the argument does not take. It derives from
/// both `TypeError` (what it is) and `ValueError` (what the package raised for a dtype before it
/// existed, so that `except ValueError` keeps catching it), as NumPy's `AxisError` derives from
/// `ValueError` and `IndexError`.
pub fn dtype_error_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let ty = TYPE.get_or_try_init(py, || {
        let bases = PyTuple::new(py, [py.get_type::<PyTypeError>(), py.get_type::<PyValueError>()])?;
        let body = PyDict::new(py);
        body.set_item("__module__", "nvfp4")?;
        body.set_item(
            "__doc__",
            "A tensor of an element type the argument does not take (a TypeError and a ValueError).",
        )?;
        let made = py.import("builtins")?.getattr("type")?.call1(("DtypeError", bases, body))?;
        Ok::<_, PyErr>(made.cast_into::<PyType>()?.unbind())
    })?;
    Ok(ty.bind(py))
}

/// `nvfp4.DtypeError` with this message.
pub fn dtype(msg: impl Into<String>) -> PyErr {
    let msg = msg.into();
    Python::attach(|py| match dtype_error_type(py) {
        Ok(ty) => PyErr::from_type(ty.clone(), msg),
        Err(e) => e,
    })
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
