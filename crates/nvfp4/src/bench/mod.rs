//! `nvfp4 bench` as a library (SPEC §7): time every kernel under one of two protocols
//! ([`Protocol`]): cold (the L2 flushed per sample, CUDA events, warm-up, the median over at least
//! 20 samples) or graph (N launches in one CUDA graph over rotating input sets, µs per launch);
//! measure the copy bandwidth, the FP16 tensor rate and the launch floor in the same run, and a
//! read ceiling per row; compare with the speed of light and with a cuBLASLt FP16 peer on
//! pre-dequantized operands timed the same way; never time a kernel that failed its check.
//!
//! Layers: [`stats`], [`report`] and [`graph::Rotation`] are pure (tested without a GPU); [`timer`],
//! [`graph::Graph`], [`ceilings`], [`floors`] and the [`Peer`] run on the device; [`lt`] (cuBLASLt's raw API) and `gpu` (library probes) hold
//! the module's only `unsafe` code, each block with a `SAFETY` note; [`quantize`] adds the GPU
//! quantizer's rows (cold protocol); [`run`] ties them together.

pub mod ceilings;
pub mod floors;
mod gpu;
pub mod graph;
mod graph_rows;
mod kernel_check;
pub mod lt;
mod options;
mod peer;
mod protocol;
pub mod quantize;
pub mod report;
mod runner;
pub mod stats;
pub mod timer;

pub use ceilings::{tbps, tflops, Ceilings};
pub use floors::{input_bytes, LaunchFloor, ReadCeiling, READ_SETTINGS};
pub use gpu::{cublaslt_present, driver_present, l2_bytes, open_stream};
pub use graph::{Graph, GraphRun, Rotation, MIN_GRAPH_LAUNCHES};
pub use kernel_check::check_mode;
pub use lt::Lt;
pub use options::{Options, ShapeSet, DEFAULT_SAMPLES, DEFAULT_WARMUP, MIN_SAMPLES, SEED};
pub use peer::{check_peer, dequantize_f16, Peer, PeerAgreement, PEER_ATOL, PEER_RTOL};
pub use protocol::Protocol;
pub use report::{fail_verdict, geomeans, iso8601_utc, Geomean, Measurement, Report, Row, PASS};
pub use runner::run;
pub use stats::{geomean, Samples};
pub use timer::Timer;
