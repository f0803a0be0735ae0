//! Tensors from Python through DLPack, zero-copy (dlpark): a borrowed view through the DLPack C
//! Exchange API where the producer has one (torch >= 2.10: the fast path of an eager call), else
//! the ordered import (the exchange API's owning export or `__dlpack__`); checked for device,
//! dtype, shape and contiguity before anything runs.

use std::ffi::c_void;

use dlpark::ffi::{DLDataTypeCode, DLDevice, DLDeviceType};
use dlpark::python::consumer::exchange::ExchangeApi;
use dlpark::python::consumer::stream::{self, DlpackStream, StreamArg};
use dlpark::python::{ImportRequest, ImportedDlpack};
use dlpark::tensor::TensorRef;
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
    /// float4_e2m1fn_x2 (DLPack: E2M1, 4 bits, 2 lanes): one byte of two packed E2M1.
    E2m1x2,
    /// int32.
    I32,
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
            Dtype::E2m1x2 => f.write_str("float4_e2m1fn_x2"),
            Dtype::I32 => f.write_str("int32"),
            Dtype::F16 => f.write_str("float16"),
            Dtype::Bf16 => f.write_str("bfloat16"),
            Dtype::F32 => f.write_str("float32"),
            Dtype::Other(c, b, l) => other_dtype_name(*c, *b, *l, f),
        }
    }
}

/// The name of a DLPack type the binding does not take, as NumPy and torch spell it (`float64`,
/// `int64`, `bool`, `complex64`, `float8_e5m2`; `_x{lanes}` for vector types), so a message
/// says what the caller passed; DLPack's numbers only for a code DLPack does not define.
fn other_dtype_name(code: u8, bits: u8, lanes: u16, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    let family = match DLDataTypeCode(code) {
        DLDataTypeCode::INT => "int",
        DLDataTypeCode::UINT => "uint",
        DLDataTypeCode::FLOAT => "float",
        DLDataTypeCode::BFLOAT => "bfloat",
        DLDataTypeCode::COMPLEX => "complex",
        DLDataTypeCode::BOOL => "bool",
        DLDataTypeCode::OPAQUEHANDLE => "opaque handle",
        DLDataTypeCode::FLOAT8_E3M4 => "float8_e3m4",
        DLDataTypeCode::FLOAT8_E4M3 => "float8_e4m3",
        DLDataTypeCode::FLOAT8_E4M3B11FNUZ => "float8_e4m3b11fnuz",
        DLDataTypeCode::FLOAT8_E4M3FN => "float8_e4m3fn",
        DLDataTypeCode::FLOAT8_E4M3FNUZ => "float8_e4m3fnuz",
        DLDataTypeCode::FLOAT8_E5M2 => "float8_e5m2",
        DLDataTypeCode::FLOAT8_E5M2FNUZ => "float8_e5m2fnuz",
        DLDataTypeCode::FLOAT8_E8M0FNU => "float8_e8m0fnu",
        DLDataTypeCode::FLOAT6_E2M3FN => "float6_e2m3fn",
        DLDataTypeCode::FLOAT6_E3M2FN => "float6_e3m2fn",
        DLDataTypeCode::FLOAT4_E2M1FN => "float4_e2m1fn",
        _ => return write!(f, "an unknown DLPack type (code {code}, {bits} bits, {lanes} lanes)"),
    };
    // The bit width is part of the name for the families that come in several widths.
    let sized = matches!(
        DLDataTypeCode(code),
        DLDataTypeCode::INT
            | DLDataTypeCode::UINT
            | DLDataTypeCode::FLOAT
            | DLDataTypeCode::BFLOAT
            | DLDataTypeCode::COMPLEX
    );
    f.write_str(family)?;
    if sized {
        write!(f, "{bits}")?;
    }
    if lanes != 1 {
        write!(f, "_x{lanes}")?;
    }
    Ok(())
}

fn dtype_of(code: DLDataTypeCode, bits: u8, lanes: u16) -> Dtype {
    match (code, bits, lanes) {
        (DLDataTypeCode::UINT, 8, 1) => Dtype::U8,
        (DLDataTypeCode::FLOAT8_E4M3FN, 8, 1) => Dtype::E4m3,
        (DLDataTypeCode::FLOAT4_E2M1FN, 4, 2) => Dtype::E2m1x2,
        (DLDataTypeCode::INT, 32, 1) => Dtype::I32,
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

/// What keeps an imported tensor's memory alive for the call.
enum Owner {
    /// A managed DLPack tensor (`__dlpack__`, or the C Exchange API's owning export).
    Managed { _tensor: ImportedDlpack },
    /// The Python object itself, read through a borrowed C Exchange view: the producer owns
    /// the memory while the object is alive, and the call holds a reference to it.
    Object { _object: Py<PyAny> },
    /// Nothing: the caller holds the tensor for longer than this description lives (a torch
    /// operator's boxed kernel holding its arguments' handles: `torch_kernels`).
    Caller,
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
    _owner: Owner,
}

fn device_of(d: DLDevice, name: &str) -> PyResult<Device> {
    match d.device_type {
        DLDeviceType::CPU | DLDeviceType::CUDAHOST => Ok(Device::Cpu),
        DLDeviceType::CUDA if d.device_id >= 0 => Ok(Device::Cuda(d.device_id as usize)),
        t => Err(value(format!("{name}: tensors must be on the CPU or a CUDA device, got DLPack device type {}", t.0))),
    }
}

/// Device, dtype, shape and first-element address of a DLPack descriptor, checked row-major
/// and dense (a dimension of size 1 may carry any stride).
fn describe(t: &TensorRef<'_>, name: &str) -> PyResult<(Device, Dtype, Vec<usize>, u64)> {
    let device = device_of(t.device(), name)?;
    let dt = t.dtype();
    let dtype = dtype_of(dt.code, dt.bits, dt.lanes);
    let shape: Vec<usize> = t.shape().iter().map(|&d| d.max(0) as usize).collect();
    // A tensor without elements has no layout to check (producers give it any strides); the
    // operations refuse it by its zero dimension, which is what is wrong with it.
    let empty = shape.contains(&0);
    if let (Some(strides), false) = (t.strides(), empty) {
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
    Ok((device, dtype, shape, t.data_ptr() as usize as u64 + t.byte_offset()))
}

/// The imports of one call. The first tensor fixes the device, and (when it is a CUDA tensor)
/// the stream unless the caller gave one: the producer's current work stream through the DLPack
/// C Exchange API (torch >= 2.10), else the legacy default stream. Every other tensor must be
/// on the same device.
///
/// Producers with the C Exchange API are read through its borrowed view (no allocation, no
/// Python call: the fast path of an eager call), as long as their work stream is the call's;
/// everything else through dlpark's ordered import (`__dlpack__(stream=...)`, which makes the
/// producer order its work before the call's stream).
#[derive(Default)]
pub struct Importer {
    device: Option<Device>,
    stream: Option<u64>,
    /// The C Exchange API of the last type seen (by type address; types outlive the call's
    /// arguments), or `None` for a type without one.
    api: Option<(usize, Option<ExchangeApi>)>,
}

impl Importer {
    /// An importer; `stream`: the caller's CUDA stream, or `None` to take the producer's.
    pub fn new(stream: Option<u64>) -> Self {
        Self { stream, ..Self::default() }
    }

    /// The call's device (the CPU when no tensor came in).
    pub fn device(&self) -> Device {
        self.device.unwrap_or(Device::Cpu)
    }

    /// The call's CUDA stream (0: the legacy default stream).
    pub fn stream(&self) -> u64 {
        self.stream.unwrap_or(0)
    }

    /// Imports `obj` (anything that speaks DLPack) as argument `name`.
    pub fn tensor(&mut self, obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Tensor> {
        let t = match self.view(obj, name)? {
            Some(t) => t,
            None => self.import(obj, name)?,
        };
        if let Some(want) = self.device {
            if t.device != want {
                return Err(value(format!("{name} is on {}, the operation's first tensor on {want}", t.device)));
            }
        }
        self.device = Some(t.device);
        Ok(t)
    }

    /// The borrowed C Exchange view of `obj`, or `None` when its type has no exchange API or
    /// its producer works on another stream than the call's.
    fn view(&mut self, obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<Tensor>> {
        let ty = obj.get_type().as_ptr() as usize;
        if self.api.as_ref().map(|(t, _)| *t) != Some(ty) {
            self.api = Some((ty, ExchangeApi::from_object(obj.as_borrowed())?));
        }
        let Some((_, Some(api))) = &self.api else { return Ok(None) };
        // A producer without the optional view function (or one that refuses this object) is
        // imported the general way, which reports its errors.
        let Ok(seen) = api.with_tensor_view_no_sync(obj.as_borrowed(), |dl, producer| {
            // SAFETY: the producer's descriptor, its shape and strides stay readable and
            // unchanged during this callback, which is all `t` lives for.
            let t = unsafe { TensorRef::from_raw(dl) }.map_err(|e| value(format!("{name}: {e}")))?;
            Ok::<_, PyErr>((describe(&t, name)?, producer as usize as u64))
        }) else {
            return Ok(None);
        };
        let ((device, dtype, shape, ptr), producer) = seen?;
        // The first CUDA tensor's producer stream becomes the call's (unless the caller gave
        // one); a tensor whose producer works on another stream takes the ordered import.
        if matches!(device, Device::Cuda(_)) && *self.stream.get_or_insert(producer) != producer {
            return Ok(None);
        }
        let owner = Owner::Object { _object: obj.clone().unbind() };
        Ok(Some(Tensor { name: name.to_string(), device, dtype, shape, ptr, read_only: false, _owner: owner }))
    }

    /// The general import (dlpark: the C Exchange API's owning export or `__dlpack__`),
    /// ordered before the call's stream.
    fn import(&mut self, obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Tensor> {
        let expect = self.device;
        // Objects without DLPack (found at discovery, or at import for those without a device
        // query) are named in the message.
        let named = |e: PyErr| {
            if e.is_instance_of::<pyo3::exceptions::PyTypeError>(obj.py()) {
                let ty = obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
                return kind(format!("{name}: expected a tensor or array (DLPack), got {ty}"));
            }
            if e.is_instance_of::<pyo3::exceptions::PyBufferError>(obj.py()) {
                return unexportable(obj, name, &e);
            }
            e
        };
        let request = ImportRequest::new(obj.as_borrowed()).map_err(named)?;
        let known = request.device().ok().map(|d| device_of(d, name)).transpose()?;
        if let (Some(got), Some(want)) = (known, expect) {
            if got != want {
                return Err(value(format!("{name} is on {got}, the operation's first tensor on {want}")));
            }
        }
        let imported = match known.or(expect).unwrap_or(Device::Cpu) {
            Device::Cuda(_) => {
                let caller = CallerStream(*self.stream.get_or_insert(0));
                request.import(Some(&caller), None).map_err(named)?
            }
            Device::Cpu => request.import(None, None).map_err(named)?,
        };
        let t = imported.validate().map_err(|e| value(format!("{name}: {e}")))?;
        let (device, dtype, shape, ptr) = describe(&t, name)?;
        if let Device::Cuda(_) = device {
            self.stream.get_or_insert(0);
        }
        let read_only = imported.flags().contains(DlpackFlags::READ_ONLY);
        Ok(Tensor {
            name: name.to_string(),
            device,
            dtype,
            shape,
            ptr,
            read_only,
            _owner: Owner::Managed { _tensor: imported },
        })
    }
}

/// The `ValueError` for an object its producer refused to export (a `BufferError`): NumPy
/// refuses big-endian arrays, which the message then names with the conversion that fixes them.
fn unexportable(obj: &Bound<'_, PyAny>, name: &str, e: &PyErr) -> PyErr {
    let native = obj.getattr("dtype").and_then(|d| d.getattr("isnative")).and_then(|n| n.extract::<bool>());
    if let Ok(false) = native {
        return value(format!(
            "{name}: a big-endian (non-native byte order) array: DLPack takes native byte order only; \
             convert it with .astype(a.dtype.newbyteorder(\"=\"))"
        ));
    }
    value(format!("{name}: its producer refused to export it through DLPack: {e}"))
}

impl Tensor {
    /// A tensor its holder keeps alive and unchanged while this description lives: `ptr` to
    /// `shape`'s elements of `dtype`, dense and row-major (checked by the holder).
    pub fn held_by_caller(name: &str, device: Device, dtype: Dtype, shape: Vec<usize>, ptr: u64) -> Self {
        Tensor { name: name.to_string(), device, dtype, shape, ptr, read_only: false, _owner: Owner::Caller }
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

    /// Writes `bytes` over the start of a CPU output of `elem`-byte elements holding at least
    /// that many bytes, leaving the rest as it is.
    pub fn write_host_prefix(&self, bytes: &[u8], elem: usize) -> PyResult<()> {
        self.writable()?;
        if self.device != Device::Cpu || self.numel() * elem < bytes.len() {
            return Err(value(format!("{}: not a CPU buffer of at least {} bytes", self.name, bytes.len())));
        }
        // SAFETY: as in `write_host`: at least `bytes.len()` writable bytes from `ptr` (checked
        // just above), not overlapping our own `bytes`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr as usize as *mut u8, bytes.len()) };
        Ok(())
    }
}
