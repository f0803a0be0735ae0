//! `nvfp4._nvfp4`: the native module of the Python package `nvfp4`. Each function takes tensors
//! (anything that speaks DLPack: torch, numpy, ...) and writes into the output the Python layer
//! allocated; CUDA tensors run on the CUDA backend on the stream the Python layer read from torch
//! at this call, CPU tensors on the CPU backend. Errors are `ValueError` (shapes, arguments),
//! `DtypeError` (a tensor of the wrong element type: a `TypeError` and a `ValueError`),
//! `TypeError` (objects that are not tensors) and `RuntimeError` (CUDA, and host memory a CPU
//! operation would need but the host does not have).

mod act;
mod cpu;
mod cuda;
mod error;
mod gil;
mod moe;
mod moe_alpha;
mod operand;
mod ops;
mod pack;
mod quantize;
mod tensor;
mod torch_abi;
mod torch_kernels;
mod weights;

use pyo3::prelude::*;

/// Whether a CUDA driver and GPU are present.
#[pyfunction]
fn cuda_available() -> bool {
    nvfp4::backend::cuda::is_available()
}

#[pymodule]
fn _nvfp4(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("DtypeError", error::dtype_error_type(m.py())?)?;
    m.add_function(wrap_pyfunction!(ops::gemv, m)?)?;
    m.add_function(wrap_pyfunction!(ops::gemm, m)?)?;
    m.add_function(wrap_pyfunction!(ops::dual_gemm, m)?)?;
    m.add_function(wrap_pyfunction!(ops::grouped_gemm, m)?)?;
    m.add_function(wrap_pyfunction!(moe::grouped_gemm_moe, m)?)?;
    m.add_function(wrap_pyfunction!(quantize::quantize, m)?)?;
    m.add_function(wrap_pyfunction!(quantize::quantize_dequant, m)?)?;
    m.add_function(wrap_pyfunction!(weights::load_linear, m)?)?;
    m.add_function(wrap_pyfunction!(operand::scale_layout_of, m)?)?;
    m.add_function(wrap_pyfunction!(pack::packed_size, m)?)?;
    m.add_function(wrap_pyfunction!(pack::pack_into, m)?)?;
    m.add_function(wrap_pyfunction!(torch_kernels::register_torch_kernels, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_available, m)?)?;
    Ok(())
}
