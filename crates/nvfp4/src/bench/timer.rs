//! The timing protocol of SPEC §7: warm-up launches, then per sample an L2 flush outside the timed
//! region, a CUDA event, the work, a CUDA event; one synchronisation at the end.
//!
//! NOTE: measured on the H100 (2026-11-22), this protocol reproduces HOPPER.md's L2-flushed cuBLAS
//! figures (made with PyTorch) within 2%, e.g. GEMV 7168x16384 101.9 µs against 100.4 µs.

use std::cell::RefCell;
use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};

use super::gpu::{driver_err, l2_bytes};
use super::stats::Samples;
use crate::{Error, Result};

/// The flush buffer is this many times the L2 size (SPEC §7 asks for more than 2x).
const FLUSH_L2_MULTIPLE: usize = 4;

/// Times work enqueued on one stream with the L2 cold for every sample.
pub struct Timer {
    stream: Arc<CudaStream>,
    // [FLUSH_L2_MULTIPLE * L2] u8, zero-filled before every sample to evict the operands.
    flush: RefCell<CudaSlice<u8>>,
    l2_bytes: usize,
    // (start, end) per sample, created on first need and reused by later measurements.
    events: RefCell<Vec<(CudaEvent, CudaEvent)>>,
}

impl Timer {
    /// Allocates the flush buffer, sized from the device's L2 attribute.
    pub fn new(stream: Arc<CudaStream>) -> Result<Self> {
        let l2 = l2_bytes(&stream)?;
        let flush =
            stream.alloc_zeros::<u8>(FLUSH_L2_MULTIPLE * l2).map_err(driver_err("allocating the L2 flush buffer"))?;
        Ok(Self { stream, flush: RefCell::new(flush), l2_bytes: l2, events: RefCell::new(Vec::new()) })
    }

    /// The stream everything is timed on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device's L2 size in bytes.
    pub fn l2_bytes(&self) -> usize {
        self.l2_bytes
    }

    /// Bytes written by each flush.
    pub fn flush_bytes(&self) -> usize {
        FLUSH_L2_MULTIPLE * self.l2_bytes
    }

    /// Enqueues a write over the whole flush buffer, which evicts whatever the L2 held.
    pub fn flush_l2(&self) -> Result<()> {
        let mut buf = self.flush.borrow_mut();
        self.stream.memset_zeros(&mut *buf).map_err(driver_err("flushing the L2"))
    }

    /// Runs `f` `warmup` times, then `samples` times between CUDA events, each preceded by an L2
    /// flush that the events do not cover. `f` must only enqueue work on [`Timer::stream`]. The
    /// host enqueues every sample before it waits once, so the flush (tens of µs) hides launch
    /// latency and the events measure the work itself.
    pub fn time_us(&self, mut f: impl FnMut() -> Result<()>, warmup: usize, samples: usize) -> Result<Samples> {
        if samples == 0 {
            return Err(Error::Invalid("at least one timed sample is needed".into()));
        }
        for _ in 0..warmup {
            f()?;
        }
        self.stream.synchronize().map_err(driver_err("synchronising after warm-up"))?;
        let ctx = self.stream.context();
        let event = || ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver_err("creating an event"));
        let mut events = self.events.borrow_mut();
        while events.len() < samples {
            events.push((event()?, event()?));
        }
        let events = &events[..samples];
        for (start, end) in events {
            self.flush_l2()?;
            start.record(&self.stream).map_err(driver_err("recording an event"))?;
            f()?;
            end.record(&self.stream).map_err(driver_err("recording an event"))?;
        }
        self.stream.synchronize().map_err(driver_err("synchronising after the timed samples"))?;
        let us = events
            .iter()
            .map(|(s, e)| s.elapsed_ms(e).map(|ms| f64::from(ms) * 1e3).map_err(driver_err("reading an event pair")))
            .collect::<Result<Vec<f64>>>()?;
        Samples::new(us)
    }
}
