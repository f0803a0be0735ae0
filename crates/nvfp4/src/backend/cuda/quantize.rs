//! The GPU quantizer: dense f32/f16/bf16 `[L, rows, K]` in device memory to NVFP4 values, scales
//! (plain or blocked) and the global scale, on a given stream, bit-identical to
//! [`format::quantize_nan_blocks`](crate::format::quantize_nan_blocks) (kernels/quantize.cu says
//! how): a block holding a NaN or an infinity gets the E4M3 NaN scale, since a launch cannot
//! refuse its input without a host synchronization. The opt-in check ([`verify`]) pays that
//! synchronization to refuse such input as the CPU quantizer does.

use cudarc::driver::CudaFunction;

use super::device::{Nvfp4View, Workspace, WorkspaceNeeds};
use super::runtime::{Capture, Gpu, LaunchOptions, LaunchShape, StreamHandle};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use crate::backend::cuda::kernels::quantize::{QuantizeParams, AMAX_UNROLL, DEQUANT_THREADS_PER_BLOCK, THREADS};
use crate::format::ScaleLayout;
use crate::{Error, Result};

/// The element type of a dense input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseType {
    /// f32.
    F32,
    /// IEEE f16.
    F16,
    /// bfloat16.
    Bf16,
}

impl DenseType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DenseType::F32 => 4,
            DenseType::F16 | DenseType::Bf16 => 2,
        }
    }
    /// The (amax, quantize) kernel symbols.
    pub(crate) fn symbols(self) -> (&'static str, &'static str) {
        match self {
            DenseType::F32 => ("quantize_amax_f32", "quantize_nvfp4_f32"),
            DenseType::F16 => ("quantize_amax_f16", "quantize_nvfp4_f16"),
            DenseType::Bf16 => ("quantize_amax_bf16", "quantize_nvfp4_bf16"),
        }
    }
    /// The dequantizing kernel's symbol.
    pub(crate) fn dequant_symbol(self) -> &'static str {
        match self {
            DenseType::F32 => "quantize_dequant_f32",
            DenseType::F16 => "quantize_dequant_f16",
            DenseType::Bf16 => "quantize_dequant_bf16",
        }
    }
    /// The type the dequantizing kernel writes for this input: f16 for f16, else bf16 (both hold
    /// every e2m1 * e4m3 product exactly).
    pub fn dequant_type(self) -> DenseType {
        match self {
            DenseType::F16 => DenseType::F16,
            DenseType::F32 | DenseType::Bf16 => DenseType::Bf16,
        }
    }
}

/// Device memory seen as a dense row-major `[L, rows, K]` tensor.
#[derive(Clone, Copy, Debug)]
pub struct DenseView {
    pub(crate) addr: u64,
    /// Element type.
    pub dtype: DenseType,
    /// `[L, rows, K]`.
    pub shape: [usize; 3],
}

impl DenseView {
    /// A view of dense device memory the caller owns.
    ///
    /// # Safety
    /// `addr` must be a device address of the backend's context holding `L * rows * K` elements
    /// of `dtype`, 16-byte aligned, allocated until the launches reading it have completed.
    pub unsafe fn from_raw(addr: u64, dtype: DenseType, shape: [usize; 3]) -> Result<Self> {
        crate::format::tensor::check_dims(shape[0], shape[1], shape[2])?;
        if !addr.is_multiple_of(16) {
            return Err(Error::Invalid("device operands must be 16-byte aligned".into()));
        }
        Ok(Self { addr, dtype, shape })
    }
}

/// One f32 in device memory (a global scale).
#[derive(Clone, Copy, Debug)]
pub struct ScalarView {
    pub(crate) addr: u64,
}

impl ScalarView {
    /// A view of one f32 of device memory the caller owns.
    ///
    /// # Safety
    /// `addr` must be a device address of the backend's context holding one f32, 4-byte aligned,
    /// allocated until the launches using it have completed.
    pub unsafe fn from_raw(addr: u64) -> Result<Self> {
        if !addr.is_multiple_of(4) {
            return Err(Error::Invalid("a device f32 must be 4-byte aligned".into()));
        }
        Ok(Self { addr })
    }
}

/// Where the quantizer takes the per-tensor global scale from.
#[derive(Clone, Copy, Debug)]
pub enum GlobalSource<'a> {
    /// ModelOpt: amax(x) / (6 * 448), computed on the device (an extra pass over x).
    Auto,
    /// A given value (finite, > 0).
    Value(f32),
    /// The f32 at this device address (e.g. a Linear's calibrated `input_scale`), read by the
    /// kernel: no host synchronization, so a captured graph can take a new value each replay.
    /// A value that is not finite and > 0 makes the global scale and every block scale NaN.
    Device(&'a ScalarView),
}

/// The quantizer's kernels of one input type: the amax pass and the pass that writes `QuantOut`
/// (the quantize or the dequantizing kernel).
pub(crate) struct QuantizeKernels {
    pub amax: CudaFunction,
    pub quantize: CudaFunction,
}

/// What the quantize pass writes.
#[derive(Clone, Copy)]
pub(crate) enum QuantOut<'a> {
    /// NVFP4 values and scales (`quantize_nvfp4_*`).
    Nvfp4(&'a Nvfp4View),
    /// The quantized values times their block scales, without the global scale, as 16-bit
    /// numbers of x's shape in [`DenseType::dequant_type`] (`quantize_dequant_*`).
    Dequant(&'a DenseView),
}

/// The most CTAs per SM the quantize pass is given (see [`ctas_per_sm`]).
const MAX_CTAS_PER_SM: u32 = 5;

/// CTAs of the quantize pass resident per SM: `NVFP4_QUANT_CTAS_PER_SM` when set (experiments),
/// else the driver's occupancy for the kernel (registers decide it), asked once per input type
/// and pass (`dequant`: the dequantizing kernel), at most [`MAX_CTAS_PER_SM`].
///
/// NOTE: measured on the H200 (bf16 8192x8192, cold): a grid of one tile per CTA ran 56.8 µs;
/// the pipelined kernel with 6 CTAs per SM (its occupancy) 52.3 µs, 4 per SM 53.5, 8 per SM
/// (two uneven waves) 60.4, 16 per SM 52.5. With the encoder's shifts as IMADs (branch
/// quant-bf16, NOTES.md) 5 per SM beat 6 (the occupancy at 40 registers): bf16 49.8-49.9
/// against 50.8 µs, f16 49.5-49.9 against 50.4-50.7 (`nvfp4 bench`: bf16 50.3 against 51.8).
/// The boundary-heavy bf16 row prefers 6 (61.6 against 63.5 µs).
fn ctas_per_sm(f: &CudaFunction, dtype: DenseType, dequant: bool) -> u32 {
    static FORCED: OnceLock<Option<u32>> = OnceLock::new();
    static FOUND: [AtomicU32; 6] = [const { AtomicU32::new(0) }; 6];
    let forced = FORCED.get_or_init(|| {
        std::env::var("NVFP4_QUANT_CTAS_PER_SM").ok().and_then(|v| v.parse().ok()).filter(|&n: &u32| n > 0)
    });
    if let Some(n) = *forced {
        return n;
    }
    let slot = &FOUND[dtype as usize + 3 * dequant as usize];
    match slot.load(Ordering::Relaxed) {
        0 => {
            let n = f
                .occupancy_max_active_blocks_per_multiprocessor(THREADS, 0, None)
                .unwrap_or(4)
                .clamp(1, MAX_CTAS_PER_SM);
            slot.store(n, Ordering::Relaxed);
            n
        }
        n => n,
    }
}

/// Workspace byte of the first-bad word (a u64, 8-byte aligned); the amax word is at 0.
const CHECK_WORD: usize = 8;

/// Scratch the quantizer needs: the amax word and the first-bad word (which every launch may
/// write: see [`launch`]).
pub(crate) fn needs() -> WorkspaceNeeds {
    WorkspaceNeeds { bytes: CHECK_WORD + 8, counters: 0 }
}

/// Enqueues the quantization of `x` into `out` (values and scales, in `out.meta.layout`; or the
/// dequantized values) and the global scale used into `global_out`, on `stream`. With `check`,
/// the first-bad word is armed first, for [`verify`], which must follow; a stream being captured
/// into a CUDA graph is refused then, before anything is enqueued (the check waits for the
/// stream). Without it the kernel's writes to that word (a block holding a NaN or an infinity
/// records its first such element unconditionally, which keeps the test off its hot path) are
/// never read. The dequantizing kernel is launched as a programmatic dependent (it waits before
/// it reads), so that it and the GEMM after it may start while the kernel before ends.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch(
    gpu: &Gpu,
    k: &QuantizeKernels,
    x: &DenseView,
    out: QuantOut<'_>,
    global: GlobalSource<'_>,
    global_out: &ScalarView,
    ws: &Workspace,
    stream: StreamHandle,
    check: bool,
) -> Result<()> {
    let [l, rows, cols] = x.shape;
    // `meta`: the NVFP4 output's; none for the dequantizing kernel.
    let (values, scales, dequant, meta) = match out {
        QuantOut::Nvfp4(o) => {
            let m = &o.meta;
            if (m.l, m.rows, m.k) != (l, rows, cols) {
                return Err(Error::Shape(format!(
                    "quantize: input [{l}, {rows}, {cols}] and output [{}, {}, {}] differ",
                    m.l, m.rows, m.k
                )));
            }
            (o.values, o.scales, 0, Some(m))
        }
        QuantOut::Dequant(d) => {
            if d.shape != x.shape || d.dtype != x.dtype.dequant_type() {
                return Err(Error::Shape(format!(
                    "quantize: input {:?} {:?} gives dequantized {:?} {:?}, not {:?} {:?}",
                    x.shape,
                    x.dtype,
                    x.shape,
                    x.dtype.dequant_type(),
                    d.shape,
                    d.dtype
                )));
            }
            (0, 0, d.addr, None)
        }
    };
    let blocks = l * rows * (cols / 16);
    let (mode, value, global_in) = match global {
        GlobalSource::Auto => (0, 0.0, 0),
        GlobalSource::Value(g) if g.is_finite() && g > 0.0 => (1, g, 0),
        GlobalSource::Value(g) => {
            return Err(Error::Invalid(format!("global scale must be finite and > 0, got {g}")));
        }
        GlobalSource::Device(s) => (2, 0.0, s.addr),
    };
    let amax = if mode == 0 { ws.at(0, 4)? } else { 0 };
    let first_bad = ws.at(CHECK_WORD, 8)?;
    if check && gpu.fences().capture(stream)? != Capture::None {
        return Err(Error::Invalid(
            "quantize: the finiteness check waits for the stream, which a CUDA graph capture on it forbids".into(),
        ));
    }
    let dequantizing = meta.is_none();
    let blocked = meta.is_some_and(|m| m.layout == ScaleLayout::Blocked);
    let params = QuantizeParams {
        x: x.addr,
        values,
        scales,
        dequant,
        global_out: global_out.addr,
        global_in,
        amax,
        first_bad,
        blocks: blocks as i64,
        rows: rows as i64,
        sf_cols: (cols / 16) as i64,
        global_mode: mode,
        global_value: value,
        blocked: blocked as i32,
        reverse: (mode == 0) as i32,
    };
    // Tiles of THREADS blocks (the dequantizing kernel: THREADS quarter blocks); one wave of CTAs
    // strides over them (the kernel prefetches the next tile while it quantizes one, which a CTA
    // waiting for a later wave could not overlap).
    let per_block = if dequantizing { DEQUANT_THREADS_PER_BLOCK } else { 1 };
    let tiles = (blocks * per_block).div_ceil(THREADS as usize);
    let grid = tiles.min(ctas_per_sm(&k.quantize, x.dtype, dequantizing) as usize * gpu.info().sms as usize);
    let grid = u32::try_from(grid).map_err(|_| Error::Shape(format!("quantize: {blocks} blocks exceed one launch")))?;
    if let Some(m) = meta.filter(|m| blocked && m.scale_bytes() != blocks) {
        gpu.memset_zero(scales, m.scale_bytes(), stream)?; // padding entries are zero
    }
    if check {
        gpu.memset_u32(first_bad, u32::MAX, 2, stream)?;
    }
    if mode == 0 {
        gpu.memset_u32(amax, 0, 1, stream)?;
        // A grid-stride pass: enough CTAs to fill the GPU, none idle on a small input.
        let steps = blocks.div_ceil(THREADS as usize * AMAX_UNROLL);
        let amax_grid = (gpu.info().sms as usize * 8).min(steps) as u32;
        gpu.launch(stream, &k.amax, LaunchShape::linear(amax_grid, THREADS, 0), &params)?;
    }
    let shape = LaunchShape::linear(grid, THREADS, 0).with(LaunchOptions { dependent: dequantizing, cluster_x: 0 });
    gpu.launch(stream, &k.quantize, shape, &params)
}

/// After a [`launch`] with `check`: waits for `stream` and refuses what the launch could only
/// mark: a device global scale that is not finite and > 0 ([`Error::Invalid`]), then the first
/// NaN or infinity of `x` ([`Error::NonFinite`], as the CPU quantizer names it).
pub(crate) fn verify(
    gpu: &Gpu,
    x: &DenseView,
    global: GlobalSource<'_>,
    ws: &Workspace,
    stream: StreamHandle,
) -> Result<()> {
    let word = gpu.read_u32(ws.at(CHECK_WORD, 8)?, 2, stream)?;
    if let GlobalSource::Device(s) = global {
        let g = f32::from_bits(gpu.read_u32(s.addr, 1, stream)?[0]);
        if !(g.is_finite() && g > 0.0) {
            return Err(Error::Invalid(format!("the global scale on the device is {g}: it must be finite and > 0")));
        }
    }
    let first = u64::from(word[0]) | u64::from(word[1]) << 32;
    if first == u64::MAX {
        return Ok(());
    }
    let bad_word = || Error::Cuda(format!("quantize check: the device wrote {first:#x}, not an element"));
    let index = usize::try_from(first / 4).map_err(|_| bad_word())?;
    let value = match first % 4 {
        0 => f32::NAN,
        1 => f32::INFINITY,
        2 => f32::NEG_INFINITY,
        _ => return Err(bad_word()),
    };
    Err(crate::format::quant::non_finite(index, x.shape, value))
}
