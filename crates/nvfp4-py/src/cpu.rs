//! The CPU side of the binding: an operation run on the exact reference in its activation's form
//! (SPEC §8), the same for every operation: the host copy of the activation, the operation built
//! from it (and checked), then the backend's W4A4 or W4A16 method without the GIL.

/// Runs an operation on the CPU backend and gives its output (an `nvfp4::OutTensor`) in `$dtype`.
///
/// `on_cpu!(g, &a, |ah| Gemm::new(ah, bh, alpha), gemm_as / gemm16_as, dtype)` (`g` a
/// `&impl Detach`: where the reference runs): `$make` builds
/// the operation from the host activation `$h` (an NVFP4 tensor, or a 16-bit one); the first
/// method runs the NVFP4 form, the second the dense one. With a last argument `f` (a function of
/// the built operation, such as `MoeGemm::routed_tokens`), `f(&op)` is read before the operation
/// runs and the result is `(f(&op), output)`.
macro_rules! on_cpu {
    ($py:expr, $act:expr, |$h:ident| $make:expr, $nvfp4:ident / $dense:ident, $dtype:expr $(, $with:expr)?) => {{
        use $crate::error::IntoPy as _;
        use ::nvfp4::Backend as _;
        let dtype = $dtype;
        match $crate::act::to_host($act)? {
            ::nvfp4::ops::Act::Nvfp4($h) => {
                let p = $make.py()?;
                ($($with(&p),)? $crate::gil::Detach::run($py, move || ::nvfp4::CpuBackend.$nvfp4(&p, dtype)).py()?)
            }
            ::nvfp4::ops::Act::Dense($h) => {
                let p = $make.py()?;
                ($($with(&p),)? $crate::gil::Detach::run($py, move || ::nvfp4::CpuBackend.$dense(&p, dtype)).py()?)
            }
        }
    }};
}

pub(crate) use on_cpu;
