//! A row under the graph protocol: the kernel and the peer each launched N times in one CUDA
//! graph over rotating input sets, checked on the graph's own outputs before and after timing.
//!
//! Kernel: every set is a [`Prepared`] problem with operands of its own; every launch has outputs
//! and a workspace of its own ([`CudaBackend::replica`]), so launches that overlap under
//! programmatic dependent launch never write the same bytes. Peer: one [`Peer`] per set; its
//! cuBLASLt launches run one after the other on the stream, so sets may share outputs.

use super::graph::{Graph, GraphRun, Rotation, GRAPH_WARMUP};
use super::kernel_check::{check_failure, check_kernel, check_mode};
use super::lt::Lt;
use super::options::Options;
use super::peer::{check_peer, Peer, PeerAgreement};
use super::report::{fail_verdict, PASS};
use super::stats::Samples;
use super::timer::Timer;
use crate::backend::cuda::Prepared;
use crate::backend::CudaBackend;
use crate::check::{compare_outputs, Mode};
use crate::problem::{Output, Problem};
use crate::{Error, Result};

/// Poisons every launch's outputs, replays the graph once and compares each launch's output
/// with the reference: `Err` names the first launch that fails.
fn check_replay(graph: &Graph, launches: &mut [Prepared], reference: &Output, mode: Mode) -> Result<(), String> {
    for p in launches.iter_mut() {
        p.poison().map_err(|e| e.to_string())?;
    }
    graph.replay().map_err(|e| e.to_string())?;
    for (i, p) in launches.iter().enumerate() {
        let report = compare_outputs(&p.output().map_err(|e| e.to_string())?, reference, mode);
        if !report.passed() {
            return Err(format!("graph launch {i}: {}", check_failure(&report)));
        }
    }
    Ok(())
}

/// The kernel's launches: one [`Prepared`] per input set (the first checked alone before
/// anything else), then replicas up to the rotation's launch count.
fn stage(backend: &CudaBackend, problem: &Problem, rotation: &Rotation) -> Result<Vec<Prepared>> {
    let mut launches = Vec::with_capacity(rotation.launches);
    for _ in 0..rotation.sets {
        launches.push(backend.prepare(problem)?);
    }
    for i in rotation.sets..rotation.launches {
        let replica = backend.replica(&launches[rotation.set_of(i)])?;
        launches.push(replica);
    }
    Ok(launches)
}

/// Checks the kernel with one launch, stages the rotation, captures the graph (launches after
/// the first chained where the kernel supports it), checks a replay, times it and checks again.
/// Returns the samples (µs per launch) only if every check passed, the verdict, the launch
/// configuration and the graph run.
pub(super) fn bench_kernel(
    backend: &CudaBackend,
    problem: &Problem,
    reference: &Output,
    set_bytes: u64,
    timer: &Timer,
    opts: &Options,
) -> (Option<Samples>, String, String, Option<GraphRun>) {
    let mut first = match backend.prepare(problem) {
        Ok(p) => p,
        Err(e) => return (None, fail_verdict(e), String::new(), None),
    };
    let config = first.describe();
    let mode = check_mode(problem.kind());
    if let Err(e) = check_kernel(&mut first, reference, mode) {
        return (None, fail_verdict(e), config, None);
    }
    drop(first);
    let rotation = Rotation::new(set_bytes, timer.l2_bytes());
    let mut launches = match stage(backend, problem, &rotation) {
        Ok(l) => l,
        Err(e) => return (None, fail_verdict(format!("staging the graph's input sets: {e}")), config, None),
    };
    let chained = launches[0].chains();
    let run = GraphRun::new(&rotation, timer.l2_bytes(), chained);
    let graph = Graph::capture(timer.stream(), rotation.launches, |i| {
        if chained && i > 0 {
            launches[i].launch_chained()
        } else {
            launches[i].launch()
        }
    });
    let graph = match graph {
        Ok(g) => g,
        Err(e) => return (None, fail_verdict(format!("capturing the graph: {e}")), config, Some(run)),
    };
    if let Err(e) = check_replay(&graph, &mut launches, reference, mode) {
        return (None, fail_verdict(e), config, Some(run));
    }
    let samples = match graph.time_us(GRAPH_WARMUP, opts.samples) {
        Ok(s) => s,
        Err(e) => return (None, fail_verdict(format!("while timing: {e}")), config, Some(run)),
    };
    if let Err(e) = check_replay(&graph, &mut launches, reference, mode) {
        return (None, fail_verdict(format!("after timing: {e}")), config, Some(run));
    }
    (Some(samples), PASS.to_string(), config, Some(run))
}

/// The peer under the graph protocol: the first set checked with one launch, one peer per set
/// (the layout the first chose), N launches in one graph, every set's output checked after the
/// timed replays.
pub(super) fn bench_peer(
    lt: &Lt,
    problem: &Problem,
    reference: &Output,
    timer: &Timer,
    opts: &Options,
) -> Result<(Samples, String, PeerAgreement, GraphRun)> {
    let mut first = Peer::new(lt, problem)?;
    first.pick_fastest(timer)?;
    first.launch()?;
    let agreement = check_peer(&first.output()?, reference).map_err(Error::Invalid)?;
    let rotation = Rotation::new(first.operand_bytes(), timer.l2_bytes());
    let mut peers = vec![first];
    for _ in 1..rotation.sets {
        let mut p = Peer::new(lt, problem)?;
        p.follow(&peers[0]);
        peers.push(p);
    }
    let graph = Graph::capture(timer.stream(), rotation.launches, |i| peers[rotation.set_of(i)].launch())?;
    let samples = graph.time_us(GRAPH_WARMUP, opts.samples)?;
    for (i, p) in peers.iter().enumerate() {
        check_peer(&p.output()?, reference).map_err(|e| Error::Invalid(format!("graph set {i}: {e}")))?;
    }
    Ok((samples, peers[0].describe(), agreement, GraphRun::new(&rotation, timer.l2_bytes(), false)))
}
