//! The floors of SPEC §7, measured in the same run as the kernels: the launch floor (an empty
//! kernel) under each protocol, and a row's read ceiling: a pure streaming read of exactly the
//! row's input bytes (no decode), the best of a few grid settings, under the row's protocol.

use serde::Serialize;

use super::graph::{Graph, GraphRun, Rotation, GRAPH_WARMUP, MIN_GRAPH_LAUNCHES};
use super::protocol::Protocol;
use super::stats::Samples;
use super::timer::Timer;
use crate::backend::cuda::{Floors, ReadKernel, ReadSetting, ReadSums};
use crate::problem::{Output, Problem};
use crate::Result;

/// The grid settings a read ceiling tries (the best median counts). NOTE: on the H100 a sweep of
/// 32 settings (`dev_gemv_diag fixed-cost`) found 2 CTAs of 256 threads per SM with 4 evict-first
/// loads in flight the fastest for 66 MB; the others cover more loads in flight and bigger CTAs.
pub const READ_SETTINGS: [ReadSetting; 4] = [
    ReadSetting { kernel: ReadKernel::Strided4, ctas_per_sm: 2, threads: 256 },
    ReadSetting { kernel: ReadKernel::Strided8, ctas_per_sm: 2, threads: 256 },
    ReadSetting { kernel: ReadKernel::Strided4, ctas_per_sm: 1, threads: 1024 },
    ReadSetting { kernel: ReadKernel::Contiguous8, ctas_per_sm: 4, threads: 256 },
];

/// Bytes a row's kernel reads: every input byte once (packed values and scales, as
/// [`Problem::bytes`] counts them), without the output it writes.
pub fn input_bytes(problem: &Problem, reference: &Output) -> u64 {
    let out: u64 = reference.tensors().iter().map(|t| 2 * t.data().len() as u64).sum();
    problem.bytes().saturating_sub(out)
}

/// The launch floor: the median µs of an empty kernel under each protocol.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LaunchFloor {
    /// Cold protocol: L2 flushed, CUDA events around the one launch.
    pub cold_us: f64,
    /// Graph protocol, launches chained with programmatic dependent launch.
    pub graph_us: f64,
    /// Graph protocol, plain launches (what a kernel that is not PDL-ready pays).
    pub graph_unchained_us: f64,
}

/// Measures [`LaunchFloor`] (graphs of [`MIN_GRAPH_LAUNCHES`] launches).
pub fn launch_floor(floors: &Floors, timer: &Timer, warmup: usize, samples: usize) -> Result<LaunchFloor> {
    let cold = timer.time_us(|| floors.launch_empty(false), warmup, samples)?;
    let graph = |chain: bool| -> Result<Samples> {
        let g = Graph::capture(timer.stream(), MIN_GRAPH_LAUNCHES, |i| floors.launch_empty(chain && i > 0))?;
        g.time_us(GRAPH_WARMUP, samples)
    };
    Ok(LaunchFloor {
        cold_us: cold.median(),
        graph_us: graph(true)?.median(),
        graph_unchained_us: graph(false)?.median(),
    })
}

/// A row's read ceiling: the best setting's samples and its description, with the graph run
/// under the graph protocol.
pub struct ReadCeiling {
    /// The fastest setting's samples (µs per read).
    pub samples: Samples,
    /// Which setting that was.
    pub config: String,
    /// The rotation, under the graph protocol.
    pub graph: Option<GraphRun>,
}

/// Times a pure read of `bytes` under `protocol` with every [`READ_SETTINGS`] entry; keeps the
/// fastest median. Cold: one source, L2 flushed before each sample. Graph: sources rotating over
/// more than 3x L2, chained launches, each with sums of its own.
pub fn read_ceiling(
    floors: &Floors,
    timer: &Timer,
    bytes: u64,
    protocol: Protocol,
    warmup: usize,
    samples: usize,
) -> Result<ReadCeiling> {
    let mut best: Option<(Samples, ReadSetting)> = None;
    let mut keep = |s: Samples, setting: ReadSetting| {
        if best.as_ref().is_none_or(|(b, _)| s.median() < b.median()) {
            best = Some((s, setting));
        }
    };
    let bytes_usize = usize::try_from(bytes).unwrap_or(usize::MAX);
    let mut graph = None;
    match protocol {
        Protocol::Cold => {
            let (src, sums) = (floors.source(bytes_usize)?, floors.sums()?);
            for setting in READ_SETTINGS {
                keep(timer.time_us(|| floors.launch_read(setting, &src, &sums, false), warmup, samples)?, setting);
            }
        }
        Protocol::Graph => {
            let rotation = Rotation::new(bytes, timer.l2_bytes());
            let sources = (0..rotation.sets).map(|_| floors.source(bytes_usize)).collect::<Result<Vec<_>>>()?;
            let sums = (0..rotation.launches).map(|_| floors.sums()).collect::<Result<Vec<ReadSums>>>()?;
            for setting in READ_SETTINGS {
                let g = Graph::capture(timer.stream(), rotation.launches, |i| {
                    floors.launch_read(setting, &sources[rotation.set_of(i)], &sums[i], i > 0)
                })?;
                keep(g.time_us(GRAPH_WARMUP, samples)?, setting);
            }
            graph = Some(GraphRun::new(&rotation, timer.l2_bytes(), true));
        }
    }
    let (samples, setting) = best.ok_or_else(|| crate::Error::Invalid("no read setting was timed".into()))?;
    Ok(ReadCeiling { samples, config: setting.to_string(), graph })
}
