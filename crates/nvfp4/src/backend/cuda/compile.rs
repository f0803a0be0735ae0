//! Kernel sources, NVRTC options, the on-disk CUBIN cache, and the ptxas resource report.
//!
//! The `.cu` files under `crates/nvfp4/kernels/` (listed by the registry, `kernels/`) are embedded
//! in the library and compiled at run time by NVRTC for the GPU's compute capability, straight to
//! a CUBIN. CUBINs are cached on disk under a key that hashes everything that could change the
//! machine code: source and headers (the generated one included), options, NVRTC version and
//! target architecture. A cache entry that is corrupt or fails to load
//! is rebuilt; a cache that cannot be written is skipped. Neither is ever an error.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cudarc::driver::CudaModule;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::kernels::{headers, KernelModule, GENERATED, MODULES};
use super::runtime::{nvrtc_compile, nvrtc_version, Gpu};
use crate::{Error, Result};

/// The architecture shipped kernels are built for by default (`nvfp4 kernels`).
pub const DEFAULT_ARCH: &str = "sm_90a";

/// The NVRTC target for a compute capability: `sm_90a` on Hopper (wgmma and setmaxnreg need the
/// `a` target), `sm_XY` elsewhere. The kernels need sm_89+ (`cvt.rn.f16x2.e4m3x2`).
pub fn arch_for(cc: (i32, i32)) -> Result<String> {
    match cc {
        (9, 0) => Ok("sm_90a".into()),
        (major, minor) if major * 10 + minor >= 89 => Ok(format!("sm_{major}{minor}")),
        (major, minor) => Err(Error::Unsupported {
            backend: "cuda".into(),
            what: format!("compute capability {major}.{minor} (the kernels need 8.9 or newer)"),
        }),
    }
}

/// NVRTC options for `arch` (e.g. `sm_90a`).
pub fn options(arch: &str, verbose: bool) -> Vec<String> {
    let mut o = vec![format!("--gpu-architecture={arch}"), "-std=c++17".into(), "-lineinfo".into()];
    if verbose {
        o.push("--ptxas-options=-v".into());
    }
    o
}

/// The CUBIN cache folder: `$NVFP4_CACHE_DIR`, else `$XDG_CACHE_HOME/nvfp4`, else
/// `~/.cache/nvfp4`; `None` when none of them is set.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("NVFP4_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("nvfp4")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("nvfp4")))
}

/// The text NVRTC compiles for a module: its source and every header, embedded in the library,
/// or read from `$NVFP4_KERNELS_DIR` when that is set (a development aid: kernel variants are
/// tried on a GPU machine without rebuilding the library; the generated header always comes from
/// the library, which owns the sizes it holds).
pub struct Sources {
    /// The module's file name.
    pub file: String,
    /// Its text.
    pub source: String,
    /// (include name, text) of every header.
    pub headers: Vec<(String, String)>,
}

impl Sources {
    /// The sources of `module`.
    pub fn of(module: &KernelModule) -> Result<Self> {
        let embedded = headers();
        let Some(dir) = std::env::var_os("NVFP4_KERNELS_DIR").filter(|d| !d.is_empty()).map(PathBuf::from) else {
            return Ok(Self {
                file: module.file.to_string(),
                source: module.source.to_string(),
                headers: embedded.iter().map(|(n, t)| (n.to_string(), t.to_string())).collect(),
            });
        };
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(|source| Error::Io { path, source })
        };
        let mut hs = Vec::with_capacity(embedded.len());
        for (name, text) in embedded {
            hs.push((name.to_string(), if name == GENERATED { text.to_string() } else { read(name)? }));
        }
        Ok(Self { file: module.file.to_string(), source: read(module.file)?, headers: hs })
    }
}

/// Hex SHA-256 over everything that determines the CUBIN.
pub fn cache_key(src: &Sources, arch: &str, options: &[String], nvrtc: (i32, i32)) -> String {
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(b"nvfp4-cubin-v2");
    field(src.file.as_bytes());
    field(src.source.as_bytes());
    for (name, text) in &src.headers {
        field(name.as_bytes());
        field(text.as_bytes());
    }
    for o in options {
        field(o.as_bytes());
    }
    field(format!("nvrtc {}.{}", nvrtc.0, nvrtc.1).as_bytes());
    field(arch.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Cache file format: magic, SHA-256 of the payload, payload (the CUBIN). The checksum catches
/// truncated or overwritten files before the driver ever sees them.
const MAGIC: &[u8; 8] = b"NVFP4CB1";

fn read_cached(path: &Path) -> Option<Vec<u8>> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.len() <= 40 || &bytes[..8] != MAGIC {
        return None;
    }
    let (sum, payload) = (&bytes[8..40], &bytes[40..]);
    (Sha256::digest(payload).as_slice() == sum).then(|| payload.to_vec())
}

/// Writes atomically: a unique temporary file in the same folder, then a rename.
fn write_cached(path: &Path, cubin: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let tmp = dir.join(format!(
        ".{}.{}.{nanos}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("cubin"),
        std::process::id()
    ));
    let mut data = Vec::with_capacity(40 + cubin.len());
    data.extend_from_slice(MAGIC);
    data.extend_from_slice(&Sha256::digest(cubin));
    data.extend_from_slice(cubin);
    std::fs::write(&tmp, &data)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Compiles `module` for `arch`. With `verbose`, the log carries ptxas's resource lines.
pub fn compile(module: &KernelModule, arch: &str, verbose: bool) -> Result<(Vec<u8>, String)> {
    compile_sources(&Sources::of(module)?, arch, verbose)
}

fn compile_sources(src: &Sources, arch: &str, verbose: bool) -> Result<(Vec<u8>, String)> {
    let headers: Vec<(&str, &str)> = src.headers.iter().map(|(n, t)| (n.as_str(), t.as_str())).collect();
    let out = nvrtc_compile(&src.file, &src.source, &headers, &options(arch, verbose))?;
    Ok((out.cubin, out.log))
}

/// `module`'s sources and the name of its CUBIN for `arch` in a cache folder: the one naming that
/// the loader and the filler share.
fn cache_entry(module: &KernelModule, arch: &str) -> Result<(Sources, String)> {
    let src = Sources::of(module)?;
    let key = cache_key(&src, arch, &options(arch, false), nvrtc_version()?);
    Ok((src, format!("{}-{key}.cubin", module.file.trim_end_matches(".cu"))))
}

/// Loads `module` for this GPU from the disk cache, compiling (and caching) it on a miss.
pub(crate) fn load(gpu: &Gpu, module: &KernelModule) -> Result<Arc<CudaModule>> {
    let arch = arch_for(gpu.info().compute_capability)?;
    let (src, name) = cache_entry(module, &arch)?;
    let path = cache_dir().map(|d| d.join(name));
    if let Some(cubin) = path.as_deref().and_then(read_cached) {
        if let Ok(m) = gpu.load_module(&cubin) {
            return Ok(m);
        }
        // An entry that passes its checksum but does not load (e.g. another driver wrote it):
        // fall through and rebuild it.
    }
    let (cubin, _log) = compile_sources(&src, &arch, false)?;
    let loaded = gpu.load_module(&cubin)?;
    if let Some(p) = &path {
        // Best effort: a read-only or full disk only costs a recompile next time.
        let _ = write_cached(p, &cubin);
    }
    Ok(loaded)
}

/// Fills the CUBIN cache ([`cache_dir`]) for `arch` with every module whose file name contains
/// `only` (at least one must), compiled as a launch compiles it, on up to `threads` threads; no
/// GPU needed. A first launch on a machine with the same NVRTC version (and the same cache
/// folder) then loads its CUBIN instead of compiling. Entries already valid are kept. Returns
/// (module file, whether it was compiled now) per module.
pub fn fill_cache(arch: &str, only: &str, threads: usize) -> Result<Vec<(&'static str, bool)>> {
    let Some(dir) = cache_dir() else {
        return Err(Error::Invalid("no CUBIN cache folder: set NVFP4_CACHE_DIR (or XDG_CACHE_HOME or HOME)".into()));
    };
    let modules: Vec<&KernelModule> = MODULES.iter().copied().filter(|m| m.file.contains(only)).collect();
    if modules.is_empty() {
        return Err(Error::Invalid(format!("no kernel file's name contains {only:?}")));
    }
    let next = AtomicUsize::new(0);
    let fill = |m: &KernelModule| -> Result<bool> {
        let (src, name) = cache_entry(m, arch)?;
        let path = dir.join(name);
        if read_cached(&path).is_some() {
            return Ok(false);
        }
        let (cubin, _log) = compile_sources(&src, arch, false)?;
        write_cached(&path, &cubin).map_err(|source| Error::Io { path, source })?;
        Ok(true)
    };
    // Each worker takes the next module until none is left.
    let work = || {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(m) = modules.get(i) else { return done };
            done.push(fill(m).map(|fresh| (i, fresh)));
        }
    };
    let results: Vec<Result<(usize, bool)>> = std::thread::scope(|s| {
        // A thread the system refuses is one worker fewer; with none, this thread does the work.
        let workers: Vec<_> = (0..threads.clamp(1, modules.len()))
            .filter_map(|_| std::thread::Builder::new().spawn_scoped(s, work).ok())
            .collect();
        if workers.is_empty() {
            return work();
        }
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|_| vec![Err(Error::Invalid("a compile thread panicked".into()))]))
            .collect()
    });
    let mut out = vec![None; modules.len()];
    for r in results {
        let (i, fresh) = r?;
        out[i] = Some((modules[i].file, fresh));
    }
    // Every module was taken by a worker that returned, or an error was returned above.
    Ok(out.into_iter().flatten().collect())
}

/// Resources of one compiled kernel, from ptxas's verbose report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KernelReport {
    /// Source file.
    pub file: String,
    /// Kernel symbol.
    pub symbol: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of register spill stores.
    pub spill_stores: u32,
    /// Bytes of register spill loads.
    pub spill_loads: u32,
    /// Bytes of stack frame (local memory).
    pub stack_bytes: u32,
    /// Bytes of static shared memory (dynamic shared memory is set per launch).
    pub smem_bytes: u32,
}

impl KernelReport {
    /// True when the kernel spills registers to local memory.
    pub fn spills(&self) -> bool {
        self.spill_stores > 0 || self.spill_loads > 0
    }
}

impl fmt::Display for KernelReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} registers, {} B spill stores, {} B spill loads, {} B stack, {} B smem",
            self.symbol, self.registers, self.spill_stores, self.spill_loads, self.stack_bytes, self.smem_bytes
        )
    }
}

/// The number before `unit` in `line` (`"... 72 registers"` -> 72).
fn number_before(line: &str, unit: &str) -> Option<u32> {
    let idx = line.find(unit)?;
    line[..idx].split(|c: char| !c.is_ascii_digit()).rfind(|s| !s.is_empty())?.parse().ok()
}

/// Parses a ptxas `-v` log into one report per entry function.
pub fn parse_ptxas_log(file: &str, log: &str) -> Vec<KernelReport> {
    let mut out: Vec<KernelReport> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let symbol = rest.split('\'').next().unwrap_or_default().to_string();
            out.push(KernelReport { file: file.to_string(), symbol, ..Default::default() });
            continue;
        }
        let Some(cur) = out.last_mut() else { continue };
        if line.contains("bytes stack frame") {
            cur.stack_bytes = number_before(line, " bytes stack frame").unwrap_or(0);
            cur.spill_stores = number_before(line, " bytes spill stores").unwrap_or(0);
            cur.spill_loads = number_before(line, " bytes spill loads").unwrap_or(0);
        } else if line.contains(" registers") {
            cur.registers = number_before(line, " registers").unwrap_or(0);
            cur.smem_bytes = number_before(line, " bytes smem").unwrap_or(0);
        }
    }
    out
}

/// Compiles every module for `arch` (no GPU needed) and reports each kernel's resources. A
/// kernel the module promises but ptxas did not report is an error.
pub fn kernel_reports(arch: &str) -> Result<Vec<KernelReport>> {
    kernel_reports_to(arch, None)
}

/// [`kernel_reports`], also writing each module's CUBIN as `<dir>/<file stem>.<arch>.cubin` when
/// `cubin_dir` is given (for SASS dumps with `cuobjdump -sass` or `nvdisasm`).
pub fn kernel_reports_to(arch: &str, cubin_dir: Option<&Path>) -> Result<Vec<KernelReport>> {
    kernel_reports_of(arch, cubin_dir, "")
}

/// [`kernel_reports_to`] for the modules whose file name contains `only` (every module for "").
pub fn kernel_reports_of(arch: &str, cubin_dir: Option<&Path>, only: &str) -> Result<Vec<KernelReport>> {
    let mut all = Vec::new();
    for module in MODULES.iter().filter(|m| m.file.contains(only)) {
        let (cubin, log) = compile(module, arch, true)?;
        if let Some(dir) = cubin_dir {
            let stem = module.file.trim_end_matches(".cu");
            let path = dir.join(format!("{stem}.{arch}.cubin"));
            std::fs::create_dir_all(dir).map_err(|e| Error::Io { path: dir.to_path_buf(), source: e })?;
            crate::io::write_bytes_atomically(&path, &cubin)?;
        }
        let reports = parse_ptxas_log(module.file, &log);
        for sym in module.symbols {
            if !reports.iter().any(|r| r.symbol == *sym) {
                return Err(Error::Compile {
                    name: module.file.to_string(),
                    log: format!("kernel `{sym}` missing from the ptxas report:\n{log}"),
                });
            }
        }
        all.extend(reports);
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::kernels::{fallback::FALLBACK, gemv::GEMV};

    const LOG: &str = "ptxas info    : 80 bytes gmem
ptxas info    : Compiling entry function 'gemv_nvfp4_sm90_plain' for 'sm_90a'
ptxas info    : Function properties for gemv_nvfp4_sm90_plain
ptxas         .     32 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 76 registers, used 1 barriers, 16 bytes smem
ptxas info    : Compile time = 68.347 ms
ptxas info    : Compiling entry function 'k2' for 'sm_90a'
ptxas info    : Function properties for k2
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 16 registers, used 0 barriers
";

    #[test]
    fn parses_ptxas_report() {
        let r = parse_ptxas_log("gemv.cu", LOG);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            KernelReport {
                file: "gemv.cu".into(),
                symbol: "gemv_nvfp4_sm90_plain".into(),
                registers: 76,
                spill_stores: 8,
                spill_loads: 4,
                stack_bytes: 32,
                smem_bytes: 16,
            }
        );
        assert!(r[0].spills());
        assert_eq!((r[1].symbol.as_str(), r[1].registers, r[1].smem_bytes), ("k2", 16, 0));
        assert!(!r[1].spills());
    }

    #[test]
    fn arch_rules() {
        assert_eq!(arch_for((9, 0)).unwrap(), "sm_90a");
        assert_eq!(arch_for((8, 9)).unwrap(), "sm_89");
        assert_eq!(arch_for((12, 0)).unwrap(), "sm_120");
        assert!(arch_for((8, 0)).is_err());
    }

    #[test]
    fn cache_key_depends_on_every_input() {
        let o = options("sm_90a", false);
        let (gemv, fallback) = (Sources::of(&GEMV).unwrap(), Sources::of(&FALLBACK).unwrap());
        let k = cache_key(&gemv, "sm_90a", &o, (13, 0));
        assert_eq!(k.len(), 64);
        assert_ne!(k, cache_key(&gemv, "sm_89", &o, (13, 0)));
        assert_ne!(k, cache_key(&gemv, "sm_90a", &o, (13, 1)));
        assert_ne!(k, cache_key(&fallback, "sm_90a", &o, (13, 0)));
        assert_ne!(k, cache_key(&gemv, "sm_90a", &options("sm_90a", true), (13, 0)));
        let mut edited = Sources::of(&GEMV).unwrap();
        edited.headers[0].1.push(' ');
        assert_ne!(k, cache_key(&edited, "sm_90a", &o, (13, 0)));
    }

    #[test]
    fn cache_roundtrip_and_corruption() {
        let dir = std::env::temp_dir().join(format!("nvfp4-cache-test-{}", std::process::id()));
        let path = dir.join("x.cubin");
        write_cached(&path, b"not really a cubin").unwrap();
        assert_eq!(read_cached(&path).as_deref(), Some(&b"not really a cubin"[..]));
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(read_cached(&path), None);
        std::fs::write(&path, b"short").unwrap();
        assert_eq!(read_cached(&path), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
