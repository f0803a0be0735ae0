//! What the registry lists for each kernel file.

/// One `.cu` file: one NVRTC program, one CUBIN, the kernel symbols it defines.
#[derive(Debug)]
pub struct KernelModule {
    /// File name under `crates/nvfp4/kernels/`.
    pub file: &'static str,
    /// The source text, embedded at build time.
    pub source: &'static str,
    /// The `extern "C"` kernels it defines.
    pub symbols: &'static [&'static str],
}
