//! The graph protocol of SPEC §7, what a decode step inside a CUDA graph sees: N launches
//! captured back to back in one CUDA graph over rotating input sets totalling more than 3x L2 (so
//! every launch reads its operands from DRAM), µs per launch = replay time / N, the median over
//! several replays. [`Rotation`] is the pure arithmetic of how many sets and launches; [`Graph`]
//! captures and times them.

use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};
use serde::Serialize;

use super::gpu::driver_err;
use super::stats::Samples;
use crate::{Error, Result};

/// Fewest launches in one graph (SPEC §7: N >= 20).
pub const MIN_GRAPH_LAUNCHES: usize = 20;
/// Input sets rotate over more than this many times the L2 size.
pub const ROTATION_L2_MULTIPLE: u64 = 3;
/// Most input sets of one row: tiny problems cannot fill 3x L2 with any sensible count (the row
/// then says its sets are L2-warm, [`Rotation::dram_cold`]).
pub const MAX_SETS: usize = 64;
/// Most bytes all input sets of one party (kernel or peer) may take: 8 GB keeps the largest rows
/// (8192³ GEMM, the grouped GEMM's f16 peer) far inside a 141 GB H200 or an 80 GB H100.
pub const MAX_SET_BYTES: u64 = 8_000_000_000;
/// Replays run before the timed ones.
pub const GRAPH_WARMUP: usize = 2;

/// How many input sets rotate and how many launches one graph holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Rotation {
    /// Distinct input sets, launched round-robin.
    pub sets: usize,
    /// Launches captured in the graph: a multiple of `sets`, at least [`MIN_GRAPH_LAUNCHES`].
    pub launches: usize,
    /// Bytes one set's launch reads.
    pub set_bytes: u64,
}

impl Rotation {
    /// The sets for inputs of `set_bytes` each on a device with `l2_bytes` of L2: enough that
    /// they total more than [`ROTATION_L2_MULTIPLE`] x L2, at least 2 (consecutive launches never
    /// read one set), at most [`MAX_SETS`] and [`MAX_SET_BYTES`] in all (but 2). The launch
    /// count is the smallest multiple of the set count reaching [`MIN_GRAPH_LAUNCHES`], so that
    /// a replay starts where the previous one left the rotation.
    pub fn new(set_bytes: u64, l2_bytes: usize) -> Self {
        let set_bytes = set_bytes.max(1);
        let wanted = (ROTATION_L2_MULTIPLE * l2_bytes as u64) / set_bytes + 1;
        let by_memory = MAX_SET_BYTES / set_bytes;
        let sets = (wanted.min(by_memory).min(MAX_SETS as u64) as usize).max(2);
        let launches = MIN_GRAPH_LAUNCHES.div_ceil(sets) * sets;
        Self { sets, launches, set_bytes }
    }

    /// True when the sets total more than [`ROTATION_L2_MULTIPLE`] x L2: every launch reads
    /// its inputs from DRAM.
    pub fn dram_cold(&self, l2_bytes: usize) -> bool {
        self.sets as u64 * self.set_bytes > ROTATION_L2_MULTIPLE * l2_bytes as u64
    }

    /// The set launch `i` of the graph reads.
    pub fn set_of(&self, launch: usize) -> usize {
        launch % self.sets
    }
}

/// What one graph-protocol measurement ran, reported per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GraphRun {
    /// Launches per graph (the time per launch is the replay time over this).
    pub launches: usize,
    /// Input sets rotated over.
    pub sets: usize,
    /// True when the sets total more than 3x L2.
    pub dram_cold: bool,
    /// True when launches after the first were chained with programmatic dependent launch.
    pub chained: bool,
}

impl GraphRun {
    /// The report of `rotation` on a device with `l2_bytes` of L2.
    pub fn new(rotation: &Rotation, l2_bytes: usize, chained: bool) -> Self {
        Self { launches: rotation.launches, sets: rotation.sets, dram_cold: rotation.dram_cold(l2_bytes), chained }
    }
}

/// A captured, instantiated graph of `launches` launches on one stream.
pub struct Graph {
    graph: CudaGraph,
    stream: Arc<CudaStream>,
    launches: usize,
}

impl Graph {
    /// Captures `enqueue(0..launches)` on `stream` (each call enqueues launch i there and nothing
    /// else: no allocation, no synchronisation) and instantiates the graph. A failing call ends
    /// the capture and is returned.
    pub fn capture(
        stream: &Arc<CudaStream>,
        launches: usize,
        mut enqueue: impl FnMut(usize) -> Result<()>,
    ) -> Result<Self> {
        if launches == 0 {
            return Err(Error::Invalid("a graph needs at least one launch".into()));
        }
        stream.synchronize().map_err(driver_err("synchronising before a capture"))?;
        // Thread-local: other threads (the CPU references' pool) are not restricted meanwhile.
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver_err("beginning a stream capture"))?;
        let enqueued = (0..launches).try_for_each(&mut enqueue);
        let ended = stream.end_capture(CUgraphInstantiate_flags(0));
        enqueued?;
        let graph = ended
            .map_err(driver_err("ending a stream capture"))?
            .ok_or_else(|| Error::Cuda("the stream capture produced no graph".into()))?;
        graph.upload().map_err(driver_err("uploading a graph"))?;
        Ok(Self { graph, stream: stream.clone(), launches })
    }

    /// Enqueues one replay of every launch.
    pub fn replay(&self) -> Result<()> {
        self.graph.launch().map_err(driver_err("launching a graph"))
    }

    /// Launches per replay.
    pub fn launches(&self) -> usize {
        self.launches
    }

    /// `warmup` replays, then `replays` between CUDA events, all enqueued before one wait;
    /// returns µs per launch of each timed replay.
    pub fn time_us(&self, warmup: usize, replays: usize) -> Result<Samples> {
        if replays == 0 {
            return Err(Error::Invalid("at least one timed replay is needed".into()));
        }
        for _ in 0..warmup {
            self.replay()?;
        }
        let ctx = self.stream.context();
        let event = || ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver_err("creating an event"));
        let events = (0..replays).map(|_| Ok((event()?, event()?))).collect::<Result<Vec<_>>>()?;
        for (start, end) in &events {
            start.record(&self.stream).map_err(driver_err("recording an event"))?;
            self.replay()?;
            end.record(&self.stream).map_err(driver_err("recording an event"))?;
        }
        self.stream.synchronize().map_err(driver_err("synchronising after the timed replays"))?;
        let per_launch = self.launches as f64;
        let us = events
            .iter()
            .map(|(s, e)| {
                s.elapsed_ms(e).map(|ms| f64::from(ms) * 1e3 / per_launch).map_err(driver_err("reading an event pair"))
            })
            .collect::<Result<Vec<f64>>>()?;
        Samples::new(us)
    }
}
