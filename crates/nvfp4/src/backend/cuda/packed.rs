//! A weight in the packed form of the W4A16 skeleton (format/w16_pack.rs) on the device, and how
//! a weight's view carries it: the skeleton's W4A16 kernels read the packed form when the view
//! has one for the activation's type, every other kernel the weight as it is.

use std::sync::Arc;

use cudarc::driver::CudaSlice;

use super::backend::CudaBackend;
use super::device::{to_i32, Keep, KeepBoth, Nvfp4View, Owned, PackedRef};
use super::kernels::pack::{PackW16Params, PACK, PACK_SYMBOL, PACK_THREADS, THREADS_PER_CHUNK};
use super::runtime::{LaunchShape, StreamHandle};
use crate::format::w16_pack::PACK_CHUNK;
use crate::format::{dual_packed_rows, pack_w16, packed_len, Nvfp4Meta, Nvfp4Tensor, PackAct};
use crate::{Error, Result};

/// A packed weight in device memory, for activations of one type.
pub struct DevicePacked {
    buf: Arc<Owned<CudaSlice<u8>>>,
    addr: u64,
    act: PackAct,
    meta: Nvfp4Meta,
    /// A dual GEMM's B1 and B2 packed together.
    pair: bool,
}

impl DevicePacked {
    /// True when it packs a dual GEMM's B1 and B2 together.
    pub fn is_pair(&self) -> bool {
        self.pair
    }
    /// The activation type its decode targets.
    pub fn act(&self) -> PackAct {
        self.act
    }
    /// The shape of the weight it packs.
    pub fn meta(&self) -> &Nvfp4Meta {
        &self.meta
    }
}

impl CudaBackend {
    /// Packs `t` on the host for activations of `act` and uploads the packed form.
    pub fn upload_packed(&self, t: &Nvfp4Tensor, act: PackAct) -> Result<DevicePacked> {
        let bytes = pack_w16(t, act)?;
        let gpu = self.gpu();
        gpu.check_fits::<u8>(bytes.len(), "a packed weight")?;
        let buf = gpu.upload(&bytes, "a packed weight")?;
        let addr = gpu.addr(&buf);
        Ok(DevicePacked { buf: Owned::new(gpu, buf), addr, act, meta: t.meta(), pair: false })
    }

    /// Packs the device weight `w` for activations of `act` on the device (the same bytes as
    /// [`pack_w16`]), on the backend's stream.
    pub fn pack(&self, w: &Nvfp4View, act: PackAct) -> Result<DevicePacked> {
        let len = packed_bytes(&[w])?;
        let gpu = self.gpu();
        gpu.check_fits::<u8>(len, "a packed weight")?;
        let buf = gpu.zeros::<u8>(len, "a packed weight")?;
        let addr = gpu.addr(&buf);
        // SAFETY: `buf` holds `len` bytes and outlives the launch (freed on this stream after it).
        unsafe { self.pack_into(&[w], act, addr, len, gpu.stream_handle())? };
        Ok(DevicePacked { buf: Owned::new(gpu, buf), addr, act, meta: w.meta, pair: false })
    }

    /// Enqueues on `stream` the packing of one weight, or of a dual GEMM's two (rows interleaved
    /// by 8, format/w16_pack.rs), into `len` bytes at `out`, which must be exactly
    /// [`packed_bytes`] of them.
    ///
    /// # Safety
    /// `out` must be device memory of this backend's context holding `len` bytes, 16-byte
    /// aligned, not read or written by anything else until the launch completes; the weights'
    /// memory must stay allocated until then.
    pub unsafe fn pack_into(
        &self,
        ws: &[&Nvfp4View],
        act: PackAct,
        out: u64,
        len: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        let need = packed_bytes(ws)?;
        if len != need || !out.is_multiple_of(16) {
            return Err(Error::Shape(format!(
                "a packed weight needs {need} bytes, 16-byte aligned (got {len} at {out:#x})"
            )));
        }
        let m = ws[0].meta;
        let packed_rows = if ws.len() == 2 { dual_packed_rows(m.rows) } else { m.rows };
        let chunks = need / PACK_CHUNK;
        let mut p = PackW16Params {
            out,
            chunks: chunks as i64,
            rows: to_i32(m.rows, "rows")?,
            packed_rows: to_i32(packed_rows, "packed rows")?,
            k: to_i32(m.k, "K")?,
            parts: ws.len() as i32,
            blocked: ws[0].blocked_flag(),
            bf16: i32::from(act == PackAct::Bf16),
            ..PackW16Params::default()
        };
        for (i, w) in ws.iter().enumerate() {
            p.values[i] = w.values;
            p.scales[i] = w.scales;
        }
        let blocks = (chunks * THREADS_PER_CHUNK).div_ceil(PACK_THREADS as usize);
        let blocks = u32::try_from(blocks).map_err(|_| Error::Invalid("a packed weight too large to launch".into()))?;
        let func = self.function(&PACK, PACK_SYMBOL)?;
        self.gpu().launch(stream, &func, LaunchShape::linear(blocks, PACK_THREADS, 0), &p)
    }

    /// Packs a dual GEMM's operands `b1`, `b2` (one shape and layout) on the device.
    pub fn pack_dual(&self, b1: &Nvfp4View, b2: &Nvfp4View, act: PackAct) -> Result<DevicePacked> {
        let len = packed_bytes(&[b1, b2])?;
        let gpu = self.gpu();
        gpu.check_fits::<u8>(len, "a packed weight pair")?;
        let buf = gpu.zeros::<u8>(len, "a packed weight pair")?;
        let addr = gpu.addr(&buf);
        // SAFETY: as in `pack`.
        unsafe { self.pack_into(&[b1, b2], act, addr, len, gpu.stream_handle())? };
        Ok(DevicePacked { buf: Owned::new(gpu, buf), addr, act, meta: b1.meta, pair: true })
    }
}

impl CudaBackend {
    /// The bytes of a packed weight (tests: against the host's packing).
    pub fn download_packed(&self, p: &DevicePacked) -> Result<Vec<u8>> {
        self.gpu().download(&p.buf)
    }
}

/// Bytes of the packed form of one weight or of a dual GEMM's pair (one shape, one scale
/// layout); a typed error for anything else.
pub fn packed_bytes(ws: &[&Nvfp4View]) -> Result<usize> {
    let rows = match ws {
        [w] => w.meta.rows,
        [a, b]
            if (a.meta.l, a.meta.rows, a.meta.k, a.meta.layout) == (b.meta.l, b.meta.rows, b.meta.k, b.meta.layout) =>
        {
            dual_packed_rows(a.meta.rows)
        }
        _ => return Err(Error::Shape("one weight, or two of one shape and scale layout, are packed".into())),
    };
    let m = ws[0].meta;
    packed_len(m.l, rows, m.k).ok_or_else(|| Error::Invalid("packed weight size overflows".into()))
}

impl Nvfp4View {
    /// The same weight with its packed form `p` attached (it must pack a weight of this shape;
    /// one packed form per view: a second replaces the first). A dual GEMM's pair
    /// ([`CudaBackend::pack_dual`]) is attached to both operands' views.
    pub fn with_packed(self, p: &DevicePacked) -> Result<Self> {
        let (a, b) = (&self.meta, &p.meta);
        if (a.l, a.rows, a.k) != (b.l, b.rows, b.k) {
            return Err(Error::Shape(format!(
                "a packed weight [{}, {}, {}] attached to a weight [{}, {}, {}]",
                b.l, b.rows, b.k, a.l, a.rows, a.k
            )));
        }
        let mine: Keep = p.buf.clone();
        let keep = Some(match self.keep() {
            Some(k) => Arc::new(KeepBoth(k, mine)) as Keep,
            None => mine,
        });
        Ok(self.with_packed_parts(Some(PackedRef { addr: p.addr, act: p.act, pair: p.pair }), keep))
    }

    /// The same weight with the packed form at `addr` attached (a dual GEMM's `pair`, attached
    /// to both operands' views), for activations of `act`.
    ///
    /// # Safety
    /// `addr` must be device memory of the view's context holding [`packed_bytes`] of this
    /// weight (or of the pair) written by [`CudaBackend::pack_into`] for `act`, 16-byte aligned,
    /// allocated until every launch bound to the view has completed.
    pub unsafe fn with_packed_raw(self, addr: u64, act: PackAct, pair: bool) -> Result<Self> {
        if !addr.is_multiple_of(16) {
            return Err(Error::Invalid("a packed weight must be 16-byte aligned".into()));
        }
        let keep = self.keep();
        Ok(self.with_packed_parts(Some(PackedRef { addr, act, pair }), keep))
    }

    /// The packed form it carries for activations of `act`, if any (one operand's).
    pub(crate) fn packed_for(&self, act: PackAct) -> Option<u64> {
        self.packed.filter(|r| r.act == act && !r.pair).map(|r| r.addr)
    }

    /// The packed form of this dual GEMM operand and `other` together, for activations of `act`.
    pub(crate) fn packed_pair_for(&self, other: &Nvfp4View, act: PackAct) -> Option<u64> {
        self.packed.filter(|r| r.act == act && r.pair && other.packed == Some(*r)).map(|r| r.addr)
    }
}
