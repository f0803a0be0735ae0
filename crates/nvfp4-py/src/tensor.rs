//! Tensors from Python through DLPack, zero-copy (dlpark: the C Exchange API where the producer
//! has it, as torch >= 2.10 does, else `__dlpack__`), checked for device, dtype, shape and
//! contiguity before anything runs.

use std::ffi::c_void;

use dlpark::ffi::{DLDataTypeCode, DLDevice, DLDeviceType};
use dlpark::python::consumer::stream::{self, DlpackStream, StreamArg};
use dlpark::python::{ImportRequest, ImportedDlpack};
use dlpark::DlpackFlags;
use pyo3::prelude::*;

use crate::error::{kind, value, PyResult};

/// Where a tensor lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// Host memory: the CPU backend.
    Cpu,
    /// A CUDA device by ordinal.
    Cuda(usize),
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// The element types the binding reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    /// uint8: packed E2M1 pairs or E4M3 bytes.
    U8,
    /// float8_e4m3fn.
    E4m3,
    /// float16.
    F16,
    /// bfloat16.
    Bf16,
    /// float32.
    F32,
    /// Anything else, by its DLPack (code, bits, lanes).
    Other(u8, u8, u16),
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dtype::U8 => f.write_str("uint8"),
            Dtype::E4m3 => f.write_str("float8_e4m3fn"),
            Dtype::F16 => f.write_str("float16"),
            Dtype::Bf16 => f.write_str("bfloat16"),
            Dtype::F32 => f.write_str("float32"),
            Dtype::Other(c, b, l) => write!(f, "DLPack dtype (code {c}, {b} bits, {l} lanes)"),
        }
    }
}

fn dtype_of(code: DLDataTypeCode, bits: u8, lanes: u16) -> Dtype {
    match (code, bits, lanes) {
        (DLDataTypeCode::UINT, 8, 1) => Dtype::U8,
        (DLDataTypeCode::FLOAT8_E4M3FN, 8, 1) => Dtype::E4m3,
        (DLDataTypeCode::FLOAT, 16, 1) => Dtype::F16,
        (DLDataTypeCode::BFLOAT, 16, 1) => Dtype::Bf16,
        (DLDataTypeCode::FLOAT, 32, 1) => Dtype::F32,
        (c, b, l) => Dtype::Other(c.0, b, l),
    }
}

/// The caller's CUDA stream as the DLPack consumer stream: a producer whose work stream is this
/// one needs no synchronization; any other is asked (through `__dlpack__(stream=...)`) to order
/// its work before this stream.
struct CallerStream(u64);

// SAFETY: the handle is the producer framework's current stream of the tensor's device, passed
// in by the Python layer for this call, alive for its duration.
unsafe impl DlpackStream for CallerStream {
    fn as_python_arg(&self, _py: Python<'_>, _device: DLDevice) -> pyo3::PyResult<StreamArg> {
        Ok(stream::cuda(self.0 as usize as *mut c_void))
    }
    unsafe fn wait_for_producer(&self, _device: DLDevice, producer: *mut c_void) -> pyo3::PyResult<bool> {
        Ok(producer as usize as u64 == self.0)
    }
}

/// A tensor borrowed from Python for the length of one call.
pub struct Tensor {
    /// The argument's name, for messages.
    pub name: String,
    pub device: Device,
    pub dtype: Dtype,
    /// Dimensions (elements).
    pub shape: Vec<usize>,
    /// Address of the first element.
    pub ptr: u64,
    read_only: bool,
    _owner: ImportedDlpack,
}

fn device_of(d: DLDevice, name: &str) -> PyResult<Device> {
    match d.device_type {
        DLDeviceType::CPU | DLDeviceType::CUDAHOST => Ok(Device::Cpu),
        DLDeviceType::CUDA if d.device_id >= 0 => Ok(Device::Cuda(d.device_id as usize)),
        t => Err(value(format!("{name}: tensors must be on the CPU or a CUDA device, got DLPack device type {}", t.0))),
    }
}

impl Tensor {
    /// Imports `obj` (anything that speaks DLPack). `expect`: the device every operand of the
    /// call must be on (checked before import); `stream`: the caller's current CUDA stream of
    /// that device (0 for the legacy default stream; ignored on the CPU).
    pub fn import(obj: &Bound<'_, PyAny>, name: &str, expect: Option<Device>, stream: u64) -> PyResult<Self> {
        let request = match ImportRequest::new(obj.as_borrowed()) {
            Ok(r) => r,
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyTypeError>(obj.py()) => {
                let ty = obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
                return Err(kind(format!("{name}: expected a tensor or array (DLPack), got {ty}")));
            }
            Err(e) => return Err(e),
        };
        let known = request.device().ok().map(|d| device_of(d, name)).transpose()?;
        if let (Some(got), Some(want)) = (known, expect) {
            if got != want {
                return Err(value(format!("{name} is on {got}, the operation's first tensor on {want}")));
            }
        }
        let device = known.or(expect).unwrap_or(Device::Cpu);
        let caller = CallerStream(stream);
        let imported = match device {
            Device::Cuda(_) => request.import(Some(&caller), None)?,
            Device::Cpu => request.import(None, None)?,
        };
        let t = imported.validate().map_err(|e| value(format!("{name}: {e}")))?;
        let device = device_of(t.device(), name)?;
        if let Some(want) = expect {
            if device != want {
                return Err(value(format!("{name} is on {device}, the operation's first tensor on {want}")));
            }
        }
        let dt = t.dtype();
        let dtype = dtype_of(dt.code, dt.bits, dt.lanes);
        let shape: Vec<usize> = t.shape().iter().map(|&d| d.max(0) as usize).collect();
        // Row-major and dense; a dimension of size 1 may carry any stride.
        if let Some(strides) = t.strides() {
            let mut want = 1i64;
            for (&d, &s) in t.shape().iter().zip(strides).rev() {
                if d != 1 && s != want {
                    return Err(value(format!(
                        "{name}: must be contiguous (row-major), has shape {:?} and strides {:?}",
                        t.shape(),
                        strides
                    )));
                }
                want *= d;
            }
        }
        let ptr = t.data_ptr() as usize as u64 + t.byte_offset();
        let read_only = imported.flags().contains(DlpackFlags::READ_ONLY);
        Ok(Self { name: name.to_string(), device, dtype, shape, ptr, read_only, _owner: imported })
    }

    /// Elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Refuses a tensor that may not be written (a read-only array).
    pub fn writable(&self) -> PyResult<()> {
        if self.read_only {
            return Err(value(format!("{}: the output is read-only", self.name)));
        }
        Ok(())
    }

    /// The bytes of a CPU tensor of `elem` bytes per element.
    pub fn host_bytes(&self, elem: usize) -> PyResult<&[u8]> {
        if self.device != Device::Cpu {
            return Err(value(format!("{}: not a CPU tensor", self.name)));
        }
        let n = self.numel() * elem;
        if n == 0 {
            return Ok(&[]);
        }
        // SAFETY: a CPU DLPack tensor checked dense and row-major above holds `numel` elements of
        // `elem` bytes from `ptr`; the producer keeps them alive while `_owner` (held by `self`,
        // which the returned borrow outlives not) is alive.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr as usize as *const u8, n) })
    }

    /// Writes `bytes` into a CPU output of `elem`-byte elements holding exactly that many bytes.
    pub fn write_host(&self, bytes: &[u8], elem: usize) -> PyResult<()> {
        self.writable()?;
        if self.device != Device::Cpu || self.numel() * elem != bytes.len() {
            return Err(value(format!("{}: not a CPU buffer of {} bytes", self.name, bytes.len())));
        }
        // SAFETY: as in `host_bytes`, the tensor holds at least `bytes.len()` bytes from `ptr`
        // (checked just above), and may be written (checked); `bytes` is our own memory, so the regions
        // do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr as usize as *mut u8, bytes.len()) };
        Ok(())
    }
}
