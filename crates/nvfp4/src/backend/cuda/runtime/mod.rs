//! The thin unsafe layer of the CUDA backend, one concern per file:
//! - `driver`: driver discovery, initialisation and the device count, the driver's errors;
//! - `context`: [`Gpu`], one device's primary context and the backend's stream on it, and the
//!   scopes that make the context current on a thread ([`ContextScope`]);
//! - `memory`: size-checked allocation, copies and fills of device memory;
//! - `fences`: [`StreamFences`], ordering frees after launches on other streams;
//! - `stream`: [`StreamHandle`], the stream a launch is enqueued on;
//! - `launch`: [`LaunchShape`], [`LaunchOptions`] and raw launches with one parameter struct;
//! - `params`: [`KernelParams`] and the `kernel_struct!` macro that lays out kernel parameter
//!   structs for Rust and CUDA from one field list;
//! - `tma`: TMA descriptors;
//! - `nvrtc`: NVRTC discovery and compilation to a CUBIN.
//!
//! Everything `unsafe` in the backend lives here, one `// SAFETY:` note per block; the rest of
//! the backend (and the CLI and the tests) use only the safe functions these files export, all
//! re-exported below. This module depends on nothing else in the backend.

mod context;
mod driver;
mod fences;
mod launch;
mod memory;
mod nvrtc;
mod params;
mod stream;
mod tma;

pub use context::ContextScope;
pub(crate) use context::Gpu;
pub(crate) use driver::{cuda_err, device_count};
pub(crate) use fences::{Capture, StreamFences};
pub use launch::{LaunchOptions, LaunchShape};
pub(crate) use nvrtc::{nvrtc_compile, nvrtc_version};
pub(crate) use params::{kernel_struct, KernelParams};
pub use stream::StreamHandle;
pub(crate) use tma::{tma_map, TmaMap};
