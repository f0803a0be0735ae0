//! The one error type of the library. Every fallible call returns [`Result`]; nothing panics on
//! bad input.

use std::path::PathBuf;

/// Everything that can go wrong in nvfp4, typed so callers can match on it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// K is not a multiple of the 16-element NVFP4 block.
    #[error("K = {k} is not a multiple of 16 (an NVFP4 scale block is 16 elements)")]
    KNotMultipleOf16 { k: usize },
    /// A dimension is zero or the operands of one operation disagree.
    #[error("shape error: {0}")]
    Shape(String),
    /// A buffer's length does not match the shape it is said to have.
    #[error("{what}: buffer holds {got} bytes, its shape needs {expected}")]
    BufferSize { what: String, expected: usize, got: usize },
    /// A tensor in a file is missing, has the wrong dtype or the wrong shape.
    #[error("tensor `{name}`: {msg}")]
    Tensor { name: String, msg: String },
    /// A file could not be parsed at all (truncated, corrupt header, not safetensors).
    #[error("{}: {msg}", path.display())]
    File { path: PathBuf, msg: String },
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// A case name such as `test:3` that names nothing.
    #[error("unknown case `{0}` (expected test:N or bench:N within the catalogue)")]
    UnknownCase(String),
    /// An argument outside what the call accepts.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A dense input to quantize holds a NaN or an infinity, which NVFP4 cannot encode: the
    /// first one in row-major order, its flat index and its position `[l, row, k]`.
    #[error("element {index} ([l, row, k] = {at:?}) is {value}: NVFP4 has no NaN or infinity, refusing to quantize")]
    NonFinite { index: usize, at: [usize; 3], value: f32 },
    /// The CUDA driver library could not be loaded.
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// The driver is present but reports no GPU.
    #[error("no CUDA GPU found")]
    NoGpu,
    /// The NVRTC library could not be loaded.
    #[error("NVRTC not found: {0} (install the CUDA runtime compiler, e.g. the nvidia-cuda-nvrtc wheel, and put its lib folder on LD_LIBRARY_PATH)")]
    NoNvrtc(String),
    /// NVRTC rejected a kernel source.
    #[error("kernel `{name}` failed to compile:\n{log}")]
    Compile { name: String, log: String },
    /// A shape whose buffers would not fit: the bytes it needs and the bytes available (host
    /// memory or the GPU's free memory), checked before anything is allocated.
    #[error("{what} needs {needed} bytes, but only {available} bytes are available")]
    TooLarge { what: String, needed: u64, available: u64 },
    /// The device ran out of memory.
    #[error("out of device memory: {0}")]
    OutOfMemory(String),
    /// A CUDA call failed for another reason.
    #[error("CUDA error: {0}")]
    Cuda(String),
    /// The operation is valid but this backend does not implement it (yet).
    #[error("{backend} backend does not support {what}")]
    Unsupported { backend: String, what: String },
}

/// Shorthand used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
