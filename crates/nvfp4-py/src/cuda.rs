//! The CUDA side of the binding: one backend per device (its primary context, the one PyTorch
//! uses), opened on first use, and per (device, stream) a workspace that launches reuse. Every
//! workspace is kept for the life of the process (`Workspace::keep_for_process`), one that had to
//! grow too: a captured CUDA graph may still hold its address; and then launches need not note
//! which stream read it. Each stream also keeps the last
//! operations it bound, by everything their parameters hold (addresses, shapes, layouts,
//! alpha): a call with the same tensors launches again without planning and binding. When that
//! cache is cleared, an operation dropped frees its own memory (descriptor tables) only after
//! its launches on the stream have run (`BoundOp`); one that a CUDA graph captured is retired
//! instead, like a workspace, since the graph may replay it at any time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use nvfp4::backend::cuda::{BoundOp, CudaBackend, Overrides, StreamHandle, Workspace};

use crate::error::{IntoPy, PyResult};

/// A device's backend and the workspaces of the streams that ran on it.
struct DeviceState {
    backend: CudaBackend,
    pools: Mutex<HashMap<u64, Pool>>,
}

#[derive(Default)]
struct Pool {
    current: Option<Workspace>,
    bound: HashMap<Vec<u64>, BoundOp>,
    /// Operations evicted from `bound` that a CUDA graph captured.
    captured: Vec<BoundOp>,
}

/// Bound operations kept per stream (cleared when full).
const BOUND_CACHE: usize = 256;

fn state(ordinal: usize) -> PyResult<Arc<DeviceState>> {
    static STATES: OnceLock<Mutex<HashMap<usize, Arc<DeviceState>>>> = OnceLock::new();
    let mut map = STATES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = map.get(&ordinal) {
        return Ok(s.clone());
    }
    // The overrides (`NVFP4_*_SM90`, `NVFP4_PRINT_CONFIG`) are read once, when a device is first
    // used.
    let backend = CudaBackend::on_device(ordinal).py()?.with_overrides(Overrides::from_env());
    let s = Arc::new(DeviceState { backend, pools: Mutex::default() });
    map.insert(ordinal, s.clone());
    Ok(s)
}

/// Runs `f` with device `ordinal`'s backend current on this thread (the previous context is
/// restored after), the workspace of `stream`, and the stream as a launch target.
pub fn with_device<R>(
    ordinal: usize,
    stream: u64,
    f: impl FnOnce(&CudaBackend, &mut Option<Workspace>, StreamHandle) -> nvfp4::Result<R>,
) -> PyResult<R> {
    let st = state(ordinal)?;
    let _scope = st.backend.enter().py()?;
    let mut pools = st.pools.lock().unwrap_or_else(|e| e.into_inner());
    let pool = pools.entry(stream).or_default();
    // SAFETY: `stream` is the caller framework's current stream of device `ordinal`, read by the
    // Python layer for this call (0: the legacy default stream), alive while this call enqueues.
    let handle = unsafe { StreamHandle::from_raw(stream) };
    let r = f(&st.backend, &mut pool.current, handle);
    pool.current.iter().for_each(Workspace::keep_for_process);
    r.py()
}

/// Profiling aid: with `NVFP4_PY_NO_LAUNCH=1` (read once per process), [`launch_cached`] does
/// everything but the driver's kernel launches, so `scripts/host_cost.py` can tell the binding's
/// own host cost from the launches'. The outputs are then never written.
fn launches_enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var_os("NVFP4_PY_NO_LAUNCH").is_none_or(|v| v != "1"))
}

/// One launch of `op` on the caller's stream: chained (a programmatic dependent of the kernel
/// before it, SPEC §7's graph protocol: it may start its setup and its first weight prefetches
/// while that kernel ends) where its first kernel reads nothing before its wait, whatever the
/// previous kernel is; a plain launch otherwise.
fn launch(op: &BoundOp, stream: StreamHandle) -> nvfp4::Result<()> {
    if op.chains_safely() {
        op.launch_chained_on(stream)
    } else {
        op.launch_on(stream)
    }
}

/// Launches the operation described by `key` on `stream` of device `ordinal`: the one bound by
/// an earlier call with the same key, or `bind` now (then kept).
pub fn launch_cached(
    ordinal: usize,
    stream: u64,
    key: Vec<u64>,
    bind: impl FnOnce(&CudaBackend, &mut Option<Workspace>) -> nvfp4::Result<BoundOp>,
) -> PyResult<()> {
    let st = state(ordinal)?;
    let _scope = st.backend.enter().py()?;
    let mut pools = st.pools.lock().unwrap_or_else(|e| e.into_inner());
    let pool = pools.entry(stream).or_default();
    // SAFETY: as in `with_device`.
    let handle = unsafe { StreamHandle::from_raw(stream) };
    let enabled = launches_enabled();
    if let Some(op) = pool.bound.get(&key) {
        return if enabled { launch(op, handle).py() } else { Ok(()) };
    }
    let op = bind(&st.backend, &mut pool.current);
    pool.current.iter().for_each(Workspace::keep_for_process);
    let op = op.py()?;
    if enabled {
        launch(&op, handle).py()?;
    }
    if pool.bound.len() >= BOUND_CACHE {
        let captured: Vec<BoundOp> = pool.bound.drain().map(|(_, op)| op).filter(BoundOp::captured).collect();
        pool.captured.extend(captured);
    }
    pool.bound.insert(key, op);
    Ok(())
}
