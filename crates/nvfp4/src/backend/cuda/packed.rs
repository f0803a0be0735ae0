//! A weight in the packed form of the W4A16 skeleton (format/w16_pack.rs) on the device, and how
//! a weight's view carries it: the skeleton's W4A16 kernels read the packed form when the view
//! has one for the activation's type, every other kernel the weight as it is.

use std::sync::Arc;

use cudarc::driver::CudaSlice;

use super::backend::CudaBackend;
use super::device::{Keep, KeepBoth, Nvfp4View, Owned};
use crate::format::{pack_w16, Nvfp4Meta, Nvfp4Tensor, PackAct};
use crate::{Error, Result};

/// A packed weight in device memory, for activations of one type.
pub struct DevicePacked {
    buf: Arc<Owned<CudaSlice<u8>>>,
    addr: u64,
    act: PackAct,
    meta: Nvfp4Meta,
}

impl DevicePacked {
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
        Ok(DevicePacked { buf: Owned::new(gpu, buf), addr, act, meta: t.meta() })
    }
}

impl Nvfp4View {
    /// The same weight with its packed form `p` attached (it must pack a weight of this shape;
    /// one packed form per view: a second replaces the first).
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
        Ok(self.with_packed_parts(Some((p.addr, p.act)), keep))
    }

    /// The packed form it carries for activations of `act`, if any.
    pub(crate) fn packed_for(&self, act: PackAct) -> Option<u64> {
        self.packed.filter(|&(_, a)| a == act).map(|(addr, _)| addr)
    }
}
