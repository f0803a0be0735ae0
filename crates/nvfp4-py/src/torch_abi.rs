//! torch's stable C ABI (libtorch >= 2.10: the `aoti_torch_*` and `torch_*` functions of
//! libtorch_cpu and libtorch_cuda), looked up at run time in the libraries `import torch` already
//! loaded: what the boxed kernels of `torch_kernels` read their arguments with, allocate their
//! outputs with and raise errors through. Nothing links against torch; without it, or with an
//! older one, the operators keep their Python kernels (`nvfp4/torch.py`).
//!
//! The stack a boxed kernel receives (torch 2.10 and 2.11, `torch/csrc/shim_common.cpp`, which
//! converts with the version the kernel was registered for, 2.10 here): a `Tensor` is an owning
//! `AtenTensorHandle` (the kernel deletes it); an optional is 0 for None, else a pointer to a
//! heap cell (C++ `new`, freed with `operator delete`) holding the value; a float is its f64
//! bits; a `ScalarType` the shim's dtype code in the low 32 bits; a `str` an owning string
//! handle. Returns go to the first slots: a new owning handle each, which torch takes over.

use std::ffi::{c_char, c_void, CString};
use std::sync::OnceLock;

use libloading::os::unix::{Library, Symbol, RTLD_LAZY};

use crate::tensor::{Device, Dtype, Tensor};

/// One slot of a boxed kernel's stack.
pub(crate) type StableIValue = u64;
/// What torch calls: the stack, its argument count and its return count.
pub(crate) type BoxedKernel = unsafe extern "C-unwind" fn(*mut StableIValue, u64, u64);
type Ath = *mut c_void;
type Err = i32;

/// glibc's `RTLD_NOLOAD` (<dlfcn.h>): open only a library already loaded.
const RTLD_NOLOAD: std::ffi::c_int = 4;

/// torch 2.10.0 as the stable ABI numbers versions: the conventions above.
pub(crate) const ABI_2_10: u64 = (2 << 56) | (10 << 48);

/// The shim functions and codes the kernels use.
pub(crate) struct Shim {
    data_ptr: unsafe extern "C" fn(Ath, *mut *mut c_void) -> Err,
    is_defined: unsafe extern "C" fn(Ath, *mut bool) -> Err,
    item_f32: unsafe extern "C" fn(Ath, *mut f32) -> Err,
    dim: unsafe extern "C" fn(Ath, *mut i64) -> Err,
    sizes: unsafe extern "C" fn(Ath, *mut *mut i64) -> Err,
    strides: unsafe extern "C" fn(Ath, *mut *mut i64) -> Err,
    dtype: unsafe extern "C" fn(Ath, *mut i32) -> Err,
    device_type: unsafe extern "C" fn(Ath, *mut i32) -> Err,
    device_index: unsafe extern "C" fn(Ath, *mut i32) -> Err,
    empty_strided: unsafe extern "C" fn(i64, *const i64, *const i64, i32, i32, i32, *mut Ath) -> Err,
    zero: unsafe extern "C" fn(Ath) -> Err,
    delete_tensor: unsafe extern "C" fn(Ath) -> Err,
    string_length: unsafe extern "C" fn(*mut c_void, *mut usize) -> Err,
    string_c_str: unsafe extern "C" fn(*mut c_void, *mut *const c_char) -> Err,
    delete_string: unsafe extern "C" fn(*mut c_void) -> Err,
    check: unsafe extern "C-unwind" fn(bool, *const c_char, *const c_char, u32, *const c_char),
    /// C++ `operator delete(void*)`: frees an optional's heap cell.
    cell_delete: unsafe extern "C" fn(*mut c_void),
    /// `aoti_torch_get_current_cuda_stream` (libtorch_cuda; absent in a CPU-only torch).
    cuda_stream: Option<unsafe extern "C" fn(i32, *mut *mut c_void) -> Err>,
    library_init_impl: unsafe extern "C" fn(*const c_char, *const c_char, *const c_char, u32, *mut *mut c_void) -> Err,
    library_impl: unsafe extern "C" fn(*mut c_void, *const c_char, BoxedKernel, u64) -> Err,
    /// Dtype codes: `DTYPES`, then `OTHER_DTYPES`.
    dtypes: Vec<(i32, Dtype)>,
    cpu: i32,
    cuda: i32,
}

static SHIM: OnceLock<Shim> = OnceLock::new();

/// The element types the kernels read or write, by the shim function giving each one's code.
const DTYPES: [(&str, Dtype); 7] = [
    ("aoti_torch_dtype_uint8", Dtype::U8),
    ("aoti_torch_dtype_float8_e4m3fn", Dtype::E4m3),
    ("torch_dtype_float4_e2m1fn_x2", Dtype::E2m1x2),
    ("aoti_torch_dtype_int32", Dtype::I32),
    ("aoti_torch_dtype_float16", Dtype::F16),
    ("aoti_torch_dtype_bfloat16", Dtype::Bf16),
    ("aoti_torch_dtype_float32", Dtype::F32),
];

/// Element types the kernels do not take, named (as DLPack spells them) so that the operations
/// refuse them with their own messages ("offsets: must be int32, got int64").
const OTHER_DTYPES: [(&str, Dtype); 9] = [
    ("aoti_torch_dtype_int64", Dtype::Other(0, 64, 1)),
    ("aoti_torch_dtype_int16", Dtype::Other(0, 16, 1)),
    ("aoti_torch_dtype_int8", Dtype::Other(0, 8, 1)),
    ("aoti_torch_dtype_uint16", Dtype::Other(1, 16, 1)),
    ("aoti_torch_dtype_uint32", Dtype::Other(1, 32, 1)),
    ("aoti_torch_dtype_uint64", Dtype::Other(1, 64, 1)),
    ("aoti_torch_dtype_float64", Dtype::Other(2, 64, 1)),
    ("aoti_torch_dtype_bool", Dtype::Other(6, 8, 1)),
    ("aoti_torch_dtype_float8_e5m2", Dtype::Other(12, 8, 1)),
];

/// Finds the shim in the loaded libtorch (`cpu_lib`, and `cuda_lib` when torch has CUDA).
pub(crate) fn load(cpu_lib: &str, cuda_lib: Option<&str>) -> Result<&'static Shim, String> {
    if let Some(s) = SHIM.get() {
        return Ok(s);
    }
    // SAFETY: RTLD_NOLOAD opens only a library the process has loaded already (torch's own, by
    // its import), running no initializer; the handles are leaked so its symbols stay valid.
    let open = |path: &str| unsafe { Library::open(Some(path), RTLD_LAZY | RTLD_NOLOAD) }.map_err(|e| e.to_string());
    let cpu = Box::leak(Box::new(open(cpu_lib)?));
    let cuda = match cuda_lib {
        Some(p) => Some(&*Box::leak(Box::new(open(p)?))),
        None => None,
    };
    // SAFETY (every `get` below): each symbol is the libtorch C function of that name, whose C
    // signature (torch/csrc/inductor/aoti_torch/c/shim.h, torch/csrc/stable/c/shim.h of 2.10 and
    // 2.11) the field's type spells; `_ZdlPv` is libstdc++'s `operator delete(void*)`.
    unsafe fn get<T: Copy>(lib: &Library, name: &str) -> Result<T, String> {
        let sym: Symbol<T> = unsafe { lib.get(name.as_bytes()) }.map_err(|_| format!("libtorch has no {name}"))?;
        Ok(*sym)
    }
    let code = |name: &str| -> Result<i32, String> {
        // SAFETY: as above; the dtype and device-type functions take nothing and return a code.
        let f: unsafe extern "C" fn() -> i32 = unsafe { get(cpu, name)? };
        Ok(unsafe { f() })
    };
    let this = Box::leak(Box::new(Library::this()));
    let mut dtypes = Vec::new();
    for (name, d) in DTYPES.into_iter().chain(OTHER_DTYPES) {
        // float4_e2m1fn_x2 has a code from torch 2.11; before, such a tensor is refused by name.
        if let Ok(c) = code(name) {
            dtypes.push((c, d));
        }
    }
    let shim = unsafe {
        Shim {
            data_ptr: get(cpu, "aoti_torch_get_data_ptr")?,
            is_defined: get(cpu, "aoti_torch_is_defined")?,
            item_f32: get(cpu, "aoti_torch_item_float32")?,
            dim: get(cpu, "aoti_torch_get_dim")?,
            sizes: get(cpu, "aoti_torch_get_sizes")?,
            strides: get(cpu, "aoti_torch_get_strides")?,
            dtype: get(cpu, "aoti_torch_get_dtype")?,
            device_type: get(cpu, "aoti_torch_get_device_type")?,
            device_index: get(cpu, "aoti_torch_get_device_index")?,
            empty_strided: get(cpu, "aoti_torch_empty_strided")?,
            zero: get(cpu, "aoti_torch_zero_")?,
            delete_tensor: get(cpu, "aoti_torch_delete_tensor_object")?,
            string_length: get(cpu, "torch_string_length")?,
            string_c_str: get(cpu, "torch_string_c_str")?,
            delete_string: get(cpu, "torch_delete_string")?,
            check: get(cpu, "aoti_torch_check")?,
            // Where torch's `new` of the cell bound: the global scope (an LD_PRELOADed allocator
            // included) when libstdc++ is there, else through libtorch's handle (its dependencies).
            cell_delete: get(this, "_ZdlPv").or_else(|_| get(cpu, "_ZdlPv"))?,
            cuda_stream: match cuda {
                Some(l) => Some(get(l, "aoti_torch_get_current_cuda_stream")?),
                None => None,
            },
            library_init_impl: get(cpu, "aoti_torch_library_init_impl")?,
            library_impl: get(cpu, "torch_library_impl")?,
            dtypes,
            cpu: code("aoti_torch_device_type_cpu")?,
            cuda: code("aoti_torch_device_type_cuda")?,
        }
    };
    Ok(SHIM.get_or_init(|| shim))
}

/// The loaded shim (kernels are registered only after `load`).
pub(crate) fn shim() -> &'static Shim {
    SHIM.get().expect("torch kernels run only after the shim is loaded")
}

fn ok(e: Err, what: &str) -> Result<(), String> {
    if e == 0 {
        Ok(())
    } else {
        Err(format!("nvfp4: torch's {what} failed"))
    }
}

impl Shim {
    /// Registers `kernels` (operator name, kernel) of namespace `nvfp4` for dispatch key `key`
    /// ("CPU", "CUDA"), for the life of the process.
    pub(crate) fn register(&self, key: &str, kernels: &[(&str, BoxedKernel)]) -> Result<(), String> {
        let (ns, key_c, file) = (c"nvfp4", CString::new(key).map_err(|e| e.to_string())?, c"nvfp4/torch_kernels");
        let mut lib = std::ptr::null_mut();
        // SAFETY: valid C strings and an out-pointer to a local; the library object it creates
        // is never deleted (its registrations last as long as the process).
        ok(unsafe { (self.library_init_impl)(ns.as_ptr(), key_c.as_ptr(), file.as_ptr(), 0, &mut lib) }, "library")?;
        for &(name, kernel) in kernels {
            let n = CString::new(name).map_err(|e| e.to_string())?;
            // SAFETY: `lib` was just made; `kernel` follows the boxed-kernel convention above.
            ok(unsafe { (self.library_impl)(lib, n.as_ptr(), kernel, ABI_2_10) }, "operator registration")?;
        }
        Ok(())
    }

    /// Raises `msg` to the operator's caller as torch raises a failed check (a RuntimeError in
    /// Python). Call it with nothing left to clean up: it unwinds through the caller's frames.
    pub(crate) fn raise(&self, msg: &str) -> ! {
        let msg = CString::new(msg.replace('\0', " ")).unwrap_or_default();
        // SAFETY: valid C strings; with `false` the function throws a C++ exception, which the
        // C-unwind ABI lets unwind through this frame to torch's dispatcher.
        unsafe { (self.check)(false, c"nvfp4".as_ptr(), c"torch_kernels.rs".as_ptr(), 0, msg.as_ptr()) };
        unreachable!("aoti_torch_check(false) returned")
    }

    /// The shim's dtype code of `dtype`.
    fn code_of(&self, dtype: Dtype) -> Option<i32> {
        self.dtypes.iter().find(|(_, d)| *d == dtype).map(|(c, _)| *c)
    }

    /// The current CUDA stream of device `index`, as torch has it.
    pub(crate) fn current_stream(&self, index: usize) -> Result<u64, String> {
        let f = self.cuda_stream.ok_or("nvfp4: this torch has no CUDA")?;
        let mut s = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local.
        ok(unsafe { f(index as i32, &mut s) }, "current CUDA stream")?;
        Ok(s as u64)
    }

    /// A new dense tensor of `shape`, element type `dtype`, on `device`; zeroed when `zeroed`.
    pub(crate) fn empty(&self, shape: &[usize], dtype: Dtype, device: Device, zeroed: bool) -> Result<Handle, String> {
        let code = self.code_of(dtype).ok_or("nvfp4: no dtype code")?;
        let sizes: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        let mut strides = vec![1i64; sizes.len()];
        for i in (0..sizes.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * sizes[i + 1].max(1);
        }
        let (dt, di) = match device {
            Device::Cpu => (self.cpu, 0),
            Device::Cuda(i) => (self.cuda, i as i32),
        };
        let mut h = std::ptr::null_mut();
        // SAFETY: sizes and strides hold `len` values each; `h` an out-pointer to a local.
        let e =
            unsafe { (self.empty_strided)(sizes.len() as i64, sizes.as_ptr(), strides.as_ptr(), code, dt, di, &mut h) };
        if e != 0 {
            // torch's C ABI reports only the failure; its reason (such as running out of
            // memory) goes to torch's error log.
            return Err(format!(
                "RuntimeError: nvfp4: torch could not allocate the output {shape:?} on {device} (out of memory? \
                 torch's log above has the reason)"
            ));
        }
        let h = Handle(h);
        if zeroed {
            // SAFETY: a live handle just made.
            ok(unsafe { (self.zero)(h.0) }, "zero_")?;
        }
        Ok(h)
    }
}

/// An owned tensor handle: an argument, or an output until handed to torch.
pub(crate) struct Handle(Ath);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: an owning handle, deleted once (a released one is null).
        if !self.0.is_null() {
            let _ = unsafe { (shim().delete_tensor)(self.0) };
        }
    }
}

impl Handle {
    /// Hands the handle to torch (a return slot).
    pub(crate) fn release(mut self) -> StableIValue {
        std::mem::replace(&mut self.0, std::ptr::null_mut()) as StableIValue
    }

    /// Dimensions (0 for a scalar tensor).
    pub(crate) fn dim(&self) -> Result<usize, String> {
        let mut d = 0i64;
        // SAFETY: a live handle; an out-pointer to a local.
        ok(unsafe { (shim().dim)(self.0, &mut d) }, "dim")?;
        Ok(d as usize)
    }

    /// The one value of a float32 tensor, read on the host (a synchronization on a GPU).
    pub(crate) fn item_f32(&self) -> Result<f32, String> {
        let mut v = 0f32;
        // SAFETY: a live handle; an out-pointer to a local.
        ok(unsafe { (shim().item_f32)(self.0, &mut v) }, "item")?;
        Ok(v)
    }

    /// Whether it holds a tensor: torch passes None for a `Tensor` argument as an undefined one.
    pub(crate) fn defined(&self) -> bool {
        let mut d = false;
        // SAFETY: a live handle; an out-pointer to a local.
        unsafe { (shim().is_defined)(self.0, &mut d) == 0 && d }
    }

    /// Its description for the operations (checked dense and row-major), valid while `self` lives.
    pub(crate) fn describe(&self, name: &str) -> Result<Tensor, String> {
        let s = shim();
        if !self.defined() {
            return Err(format!("TypeError: {name}: expected a tensor, got None"));
        }
        let (mut dim, mut sizes, mut strides, mut code, mut dt, mut di, mut ptr) =
            (0i64, std::ptr::null_mut(), std::ptr::null_mut(), 0i32, 0i32, 0i32, std::ptr::null_mut());
        // SAFETY: a live handle; out-pointers to locals; sizes and strides point into the
        // tensor's own metadata, `dim` values each, alive while the handle is.
        unsafe {
            ok((s.dim)(self.0, &mut dim), "dim")?;
            ok((s.sizes)(self.0, &mut sizes), "sizes")?;
            ok((s.strides)(self.0, &mut strides), "strides")?;
            ok((s.dtype)(self.0, &mut code), "dtype")?;
            ok((s.device_type)(self.0, &mut dt), "device")?;
            ok((s.device_index)(self.0, &mut di), "device")?;
            ok((s.data_ptr)(self.0, &mut ptr), "data_ptr")?;
        }
        let n = dim as usize;
        let (sizes, strides) = if n == 0 {
            (&[][..], &[][..])
        } else {
            // SAFETY: as above.
            unsafe { (std::slice::from_raw_parts(sizes, n), std::slice::from_raw_parts(strides, n)) }
        };
        let device = if dt == s.cpu {
            Device::Cpu
        } else if dt == s.cuda && di >= 0 {
            Device::Cuda(di as usize)
        } else {
            return Err(format!("ValueError: {name}: tensors must be on the CPU or a CUDA device"));
        };
        let Some(dtype) = s.dtypes.iter().find(|(c, _)| *c == code).map(|(_, d)| *d) else {
            return Err(format!(
                "DtypeError: {name}: a tensor of an element type nvfp4 does not take (torch dtype code {code})"
            ));
        };
        if !sizes.contains(&0) {
            let mut want = 1i64;
            for (&d, &st) in sizes.iter().zip(strides).rev() {
                if d != 1 && st != want {
                    return Err(format!(
                        "ValueError: {name}: must be contiguous (row-major), has shape {sizes:?} and strides {strides:?}"
                    ));
                }
                want *= d;
            }
        }
        let shape = sizes.iter().map(|&d| d.max(0) as usize).collect();
        Ok(Tensor::held_by_caller(name, device, dtype, shape, ptr as u64))
    }
}

/// Reading a kernel's arguments: each slot is taken once (ownership moves to the result).
pub(crate) mod take {
    use super::*;

    pub(crate) fn tensor(v: StableIValue) -> Handle {
        Handle(v as Ath)
    }

    /// An optional's value: its heap cell's content, the cell freed.
    fn cell(v: StableIValue) -> Option<StableIValue> {
        if v == 0 {
            return None;
        }
        let p = v as *mut StableIValue;
        // SAFETY: a non-null optional slot points to a cell torch allocated with `new` for this
        // call and handed over; read once, freed once.
        let inner = unsafe { *p };
        unsafe { (shim().cell_delete)(p.cast()) };
        Some(inner)
    }

    /// An optional tensor; an undefined one (a C++ caller's None) is None.
    pub(crate) fn opt_tensor(v: StableIValue) -> Option<Handle> {
        cell(v).map(tensor).filter(Handle::defined)
    }

    pub(crate) fn opt_f64(v: StableIValue) -> Option<f64> {
        cell(v).map(f64::from_bits)
    }

    /// An optional `ScalarType`: the shim's dtype code.
    pub(crate) fn opt_dtype(v: StableIValue) -> Option<i32> {
        cell(v).map(|c| c as u32 as i32)
    }

    pub(crate) fn string(v: StableIValue) -> Result<String, String> {
        let (s, h) = (shim(), v as *mut c_void);
        let (mut len, mut data) = (0usize, std::ptr::null());
        // SAFETY: an owning string handle handed over for this call: read, then deleted once.
        let r = unsafe {
            let r = ok((s.string_length)(h, &mut len), "string").and(ok((s.string_c_str)(h, &mut data), "string"));
            let text =
                r.map(|_| String::from_utf8_lossy(std::slice::from_raw_parts(data.cast::<u8>(), len)).into_owned());
            let _ = (s.delete_string)(h);
            text
        };
        r
    }

    pub(crate) fn opt_string(v: StableIValue) -> Result<Option<String>, String> {
        cell(v).map(string).transpose()
    }
}

/// The shim's dtype code of `dtype`, to compare with an `out_dtype` argument.
pub(crate) fn dtype_code(dtype: Dtype) -> Option<i32> {
    shim().code_of(dtype)
}

/// The name torch gives a dtype code (for messages), when it is one of ours.
pub(crate) fn dtype_name(code: i32) -> String {
    shim().dtypes.iter().find(|(c, _)| *c == code).map_or(format!("dtype code {code}"), |(_, d)| d.to_string())
}
