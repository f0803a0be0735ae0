//! `nvfp4 bench` as a library (SPEC §7): time every kernel with the L2 cold per sample, CUDA
//! events, warm-up and the median over at least 20 samples; measure the copy bandwidth and the
//! FP16 tensor rate in the same run; compare with the speed of light and with a cuBLASLt FP16
//! peer on pre-dequantized operands; never time a kernel that failed its check.
//!
//! Layers: [`stats`] and [`report`] are pure (tested without a GPU); [`timer`], [`ceilings`] and
//! the [`Peer`] run on the device; [`lt`] (cuBLASLt's raw API) and `gpu` (library probes) hold
//! the module's only `unsafe` code, each block with a `SAFETY` note; [`run`] ties them together.

pub mod ceilings;
mod gpu;
pub mod lt;
mod peer;
pub mod report;
mod runner;
pub mod stats;
pub mod timer;

pub use ceilings::{tbps, tflops, Ceilings};
pub use gpu::{cublaslt_present, driver_present, open_stream};
pub use lt::Lt;
pub use peer::{check_peer, dequantize_f16, Peer, PeerAgreement, PEER_ATOL, PEER_RTOL};
pub use report::{fail_verdict, geomeans, iso8601_utc, Geomean, Measurement, Report, Row, PASS};
pub use runner::{check_mode, run, Options, ShapeSet, DEFAULT_SAMPLES, DEFAULT_WARMUP, MIN_SAMPLES, SEED};
pub use stats::{geomean, Samples};
pub use timer::Timer;
