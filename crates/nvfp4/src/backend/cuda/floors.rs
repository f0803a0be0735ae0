//! The floor kernels on the device (kernels/floors.cu): an empty launch and pure streaming reads
//! of a buffer, what the benchmark measures a row's launch floor and read ceiling with (SPEC §7).

use std::fmt;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice};

use super::backend::CudaBackend;
use super::kernels::floors::{
    FloorReadParams, EMPTY_SYMBOL, FLOORS, READ_CONTIGUOUS8_SYMBOL, READ_STRIDED4_SYMBOL, READ_STRIDED8_SYMBOL,
};
use super::kernels::pdl_ready;
use super::runtime::{Gpu, LaunchOptions, LaunchShape};
use crate::{Error, Result};

/// Which streaming-read kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadKernel {
    /// Grid-strided 16-byte words, 4 loads in flight per thread.
    Strided4,
    /// Grid-strided, 8 loads in flight.
    Strided8,
    /// One contiguous range per CTA, 8 loads in flight.
    Contiguous8,
}

impl ReadKernel {
    const ALL: [ReadKernel; 3] = [ReadKernel::Strided4, ReadKernel::Strided8, ReadKernel::Contiguous8];

    fn index(self) -> usize {
        self as usize
    }

    fn symbol(self) -> &'static str {
        match self {
            ReadKernel::Strided4 => READ_STRIDED4_SYMBOL,
            ReadKernel::Strided8 => READ_STRIDED8_SYMBOL,
            ReadKernel::Contiguous8 => READ_CONTIGUOUS8_SYMBOL,
        }
    }
}

/// A read kernel and its grid: `ctas_per_sm` CTAs of `threads` threads per SM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadSetting {
    /// The kernel.
    pub kernel: ReadKernel,
    /// CTAs per SM (the grid is this times the SM count).
    pub ctas_per_sm: u32,
    /// Threads per CTA: a multiple of 32, at most 1024.
    pub threads: u32,
}

impl fmt::Display for ReadSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = match self.kernel {
            ReadKernel::Strided4 => "strided x4",
            ReadKernel::Strided8 => "strided x8",
            ReadKernel::Contiguous8 => "contiguous x8",
        };
        write!(f, "{k}, {}/SM x {}", self.ctas_per_sm, self.threads)
    }
}

/// Bytes laid out for a streaming read: `words` 16-byte words, filled with a non-zero pattern.
pub struct ReadSource {
    buf: CudaSlice<u8>,
    words: u64,
}

impl ReadSource {
    /// Bytes read by one pass (the requested size rounded up to 16).
    pub fn bytes(&self) -> u64 {
        16 * self.words
    }
}

/// Where a read writes its per-CTA sums: one per launch that may run at the same time as another.
pub struct ReadSums(CudaSlice<u32>);

impl ReadSums {
    /// CTAs whose sums it holds.
    pub(crate) fn ctas(&self) -> usize {
        self.0.len()
    }
}

/// The parameters of one read of all of `src`, its sums into `sums`.
pub(crate) fn read_params(gpu: &Gpu, src: &ReadSource, sums: &ReadSums) -> FloorReadParams {
    FloorReadParams { src: gpu.addr(&src.buf), words: src.words, out: gpu.addr(&sums.0) }
}

/// True for blocks the read kernels take: whole warps (every lane of a warp must agree on their
/// unrolled loop), at most 1024 threads.
pub(crate) fn whole_warps(threads: u32) -> bool {
    (32..=1024).contains(&threads) && threads.is_multiple_of(32)
}

/// The floor kernels, loaded, on the backend's device and stream.
pub struct Floors {
    gpu: Arc<Gpu>,
    empty: CudaFunction,
    // Indexed by `ReadKernel::index`.
    reads: [CudaFunction; 3],
}

/// The largest grid a [`ReadSetting`] may ask for, in CTAs per SM.
pub const MAX_READ_CTAS_PER_SM: u32 = 8;

impl CudaBackend {
    /// Loads the floor kernels (compiling them on first use).
    pub fn floors(&self) -> Result<Floors> {
        let [s4, s8, c8] = ReadKernel::ALL.map(|k| self.function(&FLOORS, k.symbol()));
        let reads = [s4?, s8?, c8?];
        Ok(Floors { gpu: self.gpu().clone(), empty: self.function(&FLOORS, EMPTY_SYMBOL)?, reads })
    }
}

impl Floors {
    /// A source of `bytes` (rounded up to 16) on the device, filled on the stream.
    pub fn source(&self, bytes: usize) -> Result<ReadSource> {
        let words = bytes.div_ceil(16).max(1);
        let buf = self.gpu.zeros::<u8>(16 * words, "a streaming-read source")?;
        self.gpu.memset_u32(self.gpu.addr(&buf), 0x3C5A_A5C3, 4 * words, self.gpu.stream_handle())?;
        Ok(ReadSource { buf, words: words as u64 })
    }

    /// Room for the sums of one read of any setting.
    pub fn sums(&self) -> Result<ReadSums> {
        let n = (MAX_READ_CTAS_PER_SM * self.gpu.info().sms) as usize;
        Ok(ReadSums(self.gpu.zeros::<u32>(n, "a streaming read's sums")?))
    }

    /// Enqueues the empty kernel (one CTA of 32 threads); `chain`: as a programmatic dependent
    /// of the previous kernel on the stream.
    pub fn launch_empty(&self, chain: bool) -> Result<()> {
        let options = LaunchOptions { dependent: chain && pdl_ready(EMPTY_SYMBOL), cluster_x: 0 };
        let params = FloorReadParams::default();
        self.gpu.launch(self.gpu.stream_handle(), &self.empty, LaunchShape::linear(1, 32, 0).with(options), &params)
    }

    /// Enqueues one read of all of `src` with `setting`, its sums into `sums`; `chain` as in
    /// [`Floors::launch_empty`]. `src` and `sums` must stay alive until the read has run (the
    /// caller synchronises the stream, or keeps them as long as a graph that holds the launch).
    pub fn launch_read(&self, setting: ReadSetting, src: &ReadSource, sums: &ReadSums, chain: bool) -> Result<()> {
        if setting.ctas_per_sm == 0 || setting.ctas_per_sm > MAX_READ_CTAS_PER_SM || !whole_warps(setting.threads) {
            return Err(Error::Invalid(format!("streaming read grid {setting}")));
        }
        let func = &self.reads[setting.kernel.index()];
        let params = read_params(&self.gpu, src, sums);
        let options = LaunchOptions { dependent: chain && pdl_ready(setting.kernel.symbol()), cluster_x: 0 };
        let grid = setting.ctas_per_sm * self.gpu.info().sms;
        self.gpu.launch(
            self.gpu.stream_handle(),
            func,
            LaunchShape::linear(grid, setting.threads, 0).with(options),
            &params,
        )
    }
}
