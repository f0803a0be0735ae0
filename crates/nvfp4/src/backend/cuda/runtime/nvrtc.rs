//! NVRTC: whether it loads, its version, and compiling a source with its headers to a CUBIN.

use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::OnceLock;

use cudarc::nvrtc::sys as nsys;

use crate::{Error, Result};

/// True when the NVRTC library can be loaded.
pub(crate) fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library under its usual names; nothing is called.
    unsafe { nsys::is_culib_present() }
}

fn nvrtc_check(r: nsys::nvrtcResult, what: &str) -> Result<()> {
    if r == nsys::nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    // SAFETY: nvrtcGetErrorString returns a pointer to a static NUL-terminated string.
    let msg = unsafe { CStr::from_ptr(nsys::nvrtcGetErrorString(r)) }.to_string_lossy().into_owned();
    Err(Error::Cuda(format!("{what}: {msg}")))
}

fn require_nvrtc() -> Result<()> {
    if nvrtc_present() {
        Ok(())
    } else {
        Err(Error::NoNvrtc("libnvrtc.so could not be loaded".into()))
    }
}

/// The NVRTC version as (major, minor).
pub(crate) fn nvrtc_version() -> Result<(i32, i32)> {
    static VERSION: OnceLock<(i32, i32)> = OnceLock::new();
    if let Some(v) = VERSION.get() {
        return Ok(*v);
    }
    require_nvrtc()?;
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through valid pointers; the library is loadable.
    nvrtc_check(unsafe { nsys::nvrtcVersion(&mut major, &mut minor) }, "nvrtcVersion")?;
    Ok(*VERSION.get_or_init(|| (major, minor)))
}

/// What one NVRTC compilation produced.
pub(crate) struct NvrtcOutput {
    pub cubin: Vec<u8>,
    pub log: String,
}

/// Owns an nvrtcProgram and destroys it on every path.
struct Program(nsys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: self.0 came from a successful nvrtcCreateProgram and is destroyed once.
        unsafe { nsys::nvrtcDestroyProgram(&mut self.0) };
    }
}

impl Program {
    fn log(&self) -> Result<String> {
        let mut size = 0usize;
        // SAFETY: valid program; writes one usize.
        nvrtc_check(unsafe { nsys::nvrtcGetProgramLogSize(self.0, &mut size) }, "nvrtcGetProgramLogSize")?;
        let mut buf = vec![0u8; size.max(1)];
        // SAFETY: `buf` holds the `size` bytes NVRTC said the log needs.
        nvrtc_check(
            unsafe { nsys::nvrtcGetProgramLog(self.0, buf.as_mut_ptr() as *mut c_char) },
            "nvrtcGetProgramLog",
        )?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).trim_end().to_string())
    }

    fn cubin(&self) -> Result<Vec<u8>> {
        let mut size = 0usize;
        // SAFETY: valid, compiled program; writes one usize.
        nvrtc_check(unsafe { nsys::nvrtcGetCUBINSize(self.0, &mut size) }, "nvrtcGetCUBINSize")?;
        if size == 0 {
            return Err(Error::Cuda("NVRTC produced no CUBIN (was a real sm_XX architecture given?)".into()));
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds the `size` bytes NVRTC said the CUBIN needs.
        nvrtc_check(unsafe { nsys::nvrtcGetCUBIN(self.0, buf.as_mut_ptr() as *mut c_char) }, "nvrtcGetCUBIN")?;
        Ok(buf)
    }
}

fn cstring(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Invalid(format!("{what} contains a NUL byte")))
}

/// Compiles `source` (file name `name`, `#include`-able `headers` as (name, text)) with
/// `options` straight to a CUBIN. A rejected source is `Error::Compile` with NVRTC's log.
pub(crate) fn nvrtc_compile(
    name: &str,
    source: &str,
    headers: &[(&str, &str)],
    options: &[String],
) -> Result<NvrtcOutput> {
    require_nvrtc()?;
    let c_src = cstring(source, name)?;
    let c_name = cstring(name, "kernel name")?;
    let h_src: Vec<CString> = headers.iter().map(|(n, s)| cstring(s, n)).collect::<Result<_>>()?;
    let h_names: Vec<CString> = headers.iter().map(|(n, _)| cstring(n, "header name")).collect::<Result<_>>()?;
    let h_src_ptrs: Vec<*const c_char> = h_src.iter().map(|s| s.as_ptr()).collect();
    let h_name_ptrs: Vec<*const c_char> = h_names.iter().map(|s| s.as_ptr()).collect();
    let c_opts: Vec<CString> = options.iter().map(|o| cstring(o, "option")).collect::<Result<_>>()?;
    let opt_ptrs: Vec<*const c_char> = c_opts.iter().map(|s| s.as_ptr()).collect();

    let mut raw: nsys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer refers to a NUL-terminated string alive until the end of this
    // function, which outlives the program (dropped before them, declared after them).
    nvrtc_check(
        unsafe {
            nsys::nvrtcCreateProgram(
                &mut raw,
                c_src.as_ptr(),
                c_name.as_ptr(),
                headers.len() as c_int,
                h_src_ptrs.as_ptr(),
                h_name_ptrs.as_ptr(),
            )
        },
        "nvrtcCreateProgram",
    )?;
    let prog = Program(raw);
    // SAFETY: valid program; `opt_ptrs` holds options.len() valid C strings.
    let r = unsafe { nsys::nvrtcCompileProgram(prog.0, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
    let log = prog.log()?;
    if r != nsys::nvrtcResult::NVRTC_SUCCESS {
        if log.contains("libnvrtc-builtins") {
            return Err(Error::NoNvrtc(log));
        }
        return Err(Error::Compile { name: name.to_string(), log });
    }
    Ok(NvrtcOutput { cubin: prog.cubin()?, log })
}
