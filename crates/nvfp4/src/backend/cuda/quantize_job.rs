//! A quantization staged on the device for repeated launches: the host input uploaded once, the
//! outputs allocated; what the bench and the GPU tests run. (The Python package quantizes memory
//! its caller owns through [`CudaBackend::quantize_on`] instead.)

use cudarc::driver::CudaSlice;

use super::backend::CudaBackend;
use super::device::{Nvfp4Meta, Nvfp4View, Workspace};
use super::quantize::{DenseType, DenseView, GlobalSource, ScalarView};
use crate::format::{Nvfp4Tensor, ScaleLayout};
use crate::{Error, Result};

/// Dense host input: the element type, the elements' little-endian bytes and the shape
/// `[L, rows, K]`.
#[derive(Clone, Copy, Debug)]
pub struct DenseBytes<'a> {
    /// Element type.
    pub dtype: DenseType,
    /// `L * rows * K` elements, little-endian.
    pub bytes: &'a [u8],
    /// `[L, rows, K]`.
    pub shape: [usize; 3],
}

/// Where a job takes its global scale from (each of [`GlobalSource`]'s forms).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum JobGlobal {
    /// amax(x) / (6 * 448), computed on the device.
    Auto,
    /// A value passed in the launch parameters.
    Value(f32),
    /// A value uploaded once to a device f32 that the kernel reads.
    Device(f32),
}

/// f32 quiet NaN bits: what [`QuantizeJob::poison`] writes as the global scale.
const F32_NAN_BITS: u32 = 0x7FC0_0000;

/// One quantization on device buffers of its own, launched on the backend's stream.
pub struct QuantizeJob<'a> {
    backend: &'a CudaBackend,
    // Owned buffers; the views below hold their addresses.
    _x: CudaSlice<u8>,
    values: CudaSlice<u8>,
    // [scale_bytes rounded up to 4] u8, so that poisoning is one u32 fill.
    scales: CudaSlice<u8>,
    global_out: CudaSlice<f32>,
    _global_in: Option<CudaSlice<f32>>,
    dense: DenseView,
    out: Nvfp4View,
    gout: ScalarView,
    gin: Option<ScalarView>,
    global: JobGlobal,
    ws: Option<Workspace>,
    // The dequantizing pass's output ([L, rows, K] 16-bit) and its view, allocated by its first
    // launch.
    dequant: Option<(CudaSlice<u8>, DenseView)>,
}

impl CudaBackend {
    /// Uploads `x` and allocates the outputs of its quantization (scales in `layout`).
    pub fn prepare_quantize(
        &self,
        x: DenseBytes<'_>,
        global: JobGlobal,
        layout: ScaleLayout,
    ) -> Result<QuantizeJob<'_>> {
        let [l, rows, k] = x.shape;
        crate::format::tensor::check_dims(l, rows, k)?;
        let expected = l * rows * k * x.dtype.size();
        if x.bytes.len() != expected {
            return Err(Error::BufferSize {
                what: format!("dense {:?} input [{l}, {rows}, {k}] (bytes)", x.dtype),
                expected,
                got: x.bytes.len(),
            });
        }
        let gpu = self.gpu();
        let meta = Nvfp4Meta { l, rows, k, layout, global_scale: 1.0 };
        let xbuf = gpu.upload(x.bytes, "the quantizer's input")?;
        let values = gpu.zeros::<u8>(meta.value_bytes(), "packed values")?;
        let scales = gpu.zeros::<u8>(meta.scale_bytes().next_multiple_of(4), "scales")?;
        let global_out = gpu.zeros::<f32>(1, "the global scale")?;
        let global_in = match global {
            JobGlobal::Device(g) => Some(gpu.upload(&[g], "the given global scale")?),
            _ => None,
        };
        // SAFETY: every address is of a buffer of this backend's context allocated above with the
        // sizes the views describe (cudarc allocations are 256-byte aligned); the job owns the
        // buffers and frees them only when dropped, after its launches (ordered on the stream).
        let (dense, out, gout, gin) = unsafe {
            (
                DenseView::from_raw(gpu.addr(&xbuf), x.dtype, x.shape)?,
                Nvfp4View::from_raw(gpu.addr(&values), gpu.addr(&scales), meta)?,
                ScalarView::from_raw(gpu.addr(&global_out))?,
                match &global_in {
                    Some(b) => Some(ScalarView::from_raw(gpu.addr(b))?),
                    None => None,
                },
            )
        };
        Ok(QuantizeJob {
            backend: self,
            _x: xbuf,
            values,
            scales,
            global_out,
            _global_in: global_in,
            dense,
            out,
            gout,
            gin,
            global,
            ws: None,
            dequant: None,
        })
    }
}

/// The launch's global source for a job's [`JobGlobal`] (`gin`: its uploaded device value).
fn source(global: JobGlobal, gin: &Option<ScalarView>) -> Result<GlobalSource<'_>> {
    Ok(match (global, gin) {
        (JobGlobal::Auto, _) => GlobalSource::Auto,
        (JobGlobal::Value(g), _) => GlobalSource::Value(g),
        (JobGlobal::Device(_), Some(s)) => GlobalSource::Device(s),
        (JobGlobal::Device(_), None) => return Err(Error::Invalid("device global scale not uploaded".into())),
    })
}

impl QuantizeJob<'_> {
    /// Enqueues the quantization on the backend's stream (the first launch also sizes the
    /// workspace, which waits for the stream).
    pub fn launch(&mut self) -> Result<()> {
        self.run(false)
    }

    /// [`QuantizeJob::launch`] with the opt-in check ([`CudaBackend::quantize_checked_on`]):
    /// waits for the stream and refuses a NaN or an infinity in the input.
    pub fn launch_checked(&mut self) -> Result<()> {
        self.run(true)
    }

    /// Enqueues the dequantizing pass ([`CudaBackend::quantize_dequant_on`]) into a buffer of
    /// the job's own (allocated by the first call) instead of the quantized values and scales.
    pub fn launch_dequant(&mut self) -> Result<()> {
        if self.dequant.is_none() {
            let gpu = self.backend.gpu();
            let ty = self.dense.dtype.dequant_type();
            let [l, rows, k] = self.dense.shape;
            let buf = gpu.zeros::<u8>(l * rows * k * ty.size(), "dequantized values")?;
            // Poisoned from the start, as `poison` leaves it for later launches.
            gpu.memset_u32(gpu.addr(&buf), u32::MAX, buf.len() / 4, gpu.stream_handle())?;
            // SAFETY: a buffer of this backend's context of the size the view describes, owned
            // by the job until it drops, after its launches (ordered on the stream).
            let view = unsafe { DenseView::from_raw(gpu.addr(&buf), ty, self.dense.shape)? };
            self.dequant = Some((buf, view));
        }
        let source = source(self.global, &self.gin)?;
        let stream = self.backend.gpu().stream_handle();
        let (b, ws) = (self.backend, &mut self.ws);
        let out = &self.dequant.as_ref().expect("allocated above").1;
        b.quantize_dequant_on(&self.dense, out, source, &self.gout, ws, stream)
    }

    /// Waits for the stream and copies the dequantizing pass's output back: its little-endian
    /// 16-bit elements (in [`DenseType::dequant_type`]; empty before its first launch) and the
    /// global scale it used.
    pub fn dequant_output(&self) -> Result<(Vec<u8>, f32)> {
        let gpu = self.backend.gpu();
        gpu.sync()?;
        let g = gpu.download(&self.global_out)?.first().copied().unwrap_or(f32::NAN);
        match &self.dequant {
            Some((buf, _)) => Ok((gpu.download(buf)?, g)),
            None => Ok((Vec::new(), g)),
        }
    }

    fn run(&mut self, check: bool) -> Result<()> {
        let source = source(self.global, &self.gin)?;
        let stream = self.backend.gpu().stream_handle();
        let (b, ws) = (self.backend, &mut self.ws);
        if check {
            b.quantize_checked_on(&self.dense, &self.out, source, &self.gout, ws, stream)
        } else {
            b.quantize_on(&self.dense, &self.out, source, &self.gout, ws, stream)
        }
    }

    /// Enqueues a fill of every output byte with 0xFF and of the global scale with NaN, so that
    /// anything a launch leaves unwritten shows in [`QuantizeJob::output`].
    pub fn poison(&self) -> Result<()> {
        let gpu = self.backend.gpu();
        let stream = gpu.stream_handle();
        gpu.memset_u32(gpu.addr(&self.values), u32::MAX, self.values.len() / 4, stream)?;
        gpu.memset_u32(gpu.addr(&self.scales), u32::MAX, self.scales.len() / 4, stream)?;
        if let Some((buf, _)) = &self.dequant {
            gpu.memset_u32(gpu.addr(buf), u32::MAX, buf.len() / 4, stream)?;
        }
        gpu.memset_u32(gpu.addr(&self.global_out), F32_NAN_BITS, 1, stream)
    }

    /// Waits for the stream and copies the result back (global scale included).
    pub fn output(&self) -> Result<Nvfp4Tensor> {
        let gpu = self.backend.gpu();
        gpu.sync()?;
        let m = &self.out.meta;
        let values = gpu.download(&self.values)?;
        let mut scales = gpu.download(&self.scales)?;
        scales.truncate(m.scale_bytes());
        let g = gpu.download(&self.global_out)?;
        let t = Nvfp4Tensor::new(m.l, m.rows, m.k, values, scales, m.layout)?;
        Ok(t.with_global_scale(g.first().copied().unwrap_or(f32::NAN)))
    }

    /// What one launch enqueues, for reports.
    pub fn describe(&self) -> String {
        let [l, rows, k] = self.dense.shape;
        let blocks = l * rows * k / 16;
        let launches = match self.global {
            JobGlobal::Auto => "memset + amax pass + quantize pass",
            _ => "quantize pass",
        };
        format!(
            "{:?} [{l}, {rows}, {k}], {blocks} blocks, {:?} scales: {launches}",
            self.dense.dtype, self.out.meta.layout
        )
    }
}
