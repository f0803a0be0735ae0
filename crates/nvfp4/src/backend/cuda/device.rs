//! Operands that live on the GPU. An uploaded NVFP4 tensor ([`DeviceNvfp4`]) or 16-bit output
//! ([`DeviceF16`], f16 or bf16) owns its buffers; a view ([`Nvfp4View`], [`F16View`]) describes device memory
//! to the bind step: addresses, shape, scale layout, global scale. Views of owned tensors keep
//! their buffers alive for as long as a bound launch holds them, so weights uploaded once can be
//! bound and launched any number of times with no copy. [`upload`] is the only place host operand
//! data goes to the device.

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaSlice;

use super::runtime::{Gpu, StreamFences, StreamHandle};
pub use crate::format::Nvfp4Meta;
use crate::format::{Nvfp4Tensor, OutTensor, OutputDtype, PackAct, ScaleLayout};
use crate::ops::{Act, ActMeta, Activation, Alphas, Group, Offsets, Op, Operand, OutMeta, Output};
use crate::{Error, Result};

/// Device memory the backend owns (an operand's buffers, an output, a workspace, a launch's
/// descriptor table), shared by the views and bound launches that hold addresses into it. It is
/// freed, asynchronously on the backend's stream, when the last holder lets go, and never before
/// the launches on other streams that read it: each such launch notes its stream here
/// ([`Read::read_on`]), and the drop makes the backend's stream wait for those streams first
/// ([`StreamFences`]).
pub(crate) struct Owned<B> {
    buffers: B,
    read_on: Mutex<Vec<u64>>,
    fences: Arc<StreamFences>,
    /// Kept for the life of the process ([`Owned::keep_for_process`]): never freed, so its
    /// readers need not be noted.
    for_process: AtomicBool,
}

impl<B: Send + Sync + 'static> Owned<B> {
    /// `buffers`, allocated by `gpu` (on its stream), as shared owned memory.
    pub(crate) fn new(gpu: &Gpu, buffers: B) -> Arc<Self> {
        let fences = gpu.fences().clone();
        Arc::new(Self { buffers, read_on: Mutex::new(Vec::new()), fences, for_process: AtomicBool::new(false) })
    }

    /// Never frees the buffers (one reference is leaked, once): for memory a caller keeps anyway
    /// until the process ends, whose launches then skip the bookkeeping of their streams.
    pub(crate) fn keep_for_process(self: &Arc<Self>) {
        if !self.for_process.swap(true, Ordering::Relaxed) {
            std::mem::forget(self.clone());
        }
    }
}

impl<B> Deref for Owned<B> {
    type Target = B;
    fn deref(&self) -> &B {
        &self.buffers
    }
}

impl<B> Drop for Owned<B> {
    fn drop(&mut self) {
        let streams = self.read_on.get_mut().unwrap_or_else(|e| e.into_inner());
        if !streams.is_empty() {
            self.fences.order_frees_after(streams);
        }
        // The buffers drop after this, each freed on the backend's stream behind the waits.
    }
}

/// Owned memory as a launch sees it: something to note the launch's stream in.
pub(crate) trait Read: Send + Sync {
    /// A launch on `stream` (not the backend's own, not capturing) read this memory.
    fn read_on(&self, stream: StreamHandle);
    /// True when it is never freed: nothing to note.
    fn for_process(&self) -> bool;
}

impl<B: Send + Sync> Read for Owned<B> {
    fn for_process(&self) -> bool {
        self.for_process.load(Ordering::Relaxed)
    }
    fn read_on(&self, stream: StreamHandle) {
        let mut streams = self.read_on.lock().unwrap_or_else(|e| e.into_inner());
        if !streams.contains(&stream.as_raw()) {
            streams.push(stream.as_raw());
        }
    }
}

/// Something a bound launch keeps alive because its parameters hold addresses into it.
pub(crate) type Keep = Arc<dyn Read>;

/// Memory of two holders, kept alive together and noted read together.
pub(crate) struct KeepBoth(pub(crate) Keep, pub(crate) Keep);

impl Read for KeepBoth {
    fn read_on(&self, stream: StreamHandle) {
        self.0.read_on(stream);
        self.1.read_on(stream);
    }
    fn for_process(&self) -> bool {
        self.0.for_process() && self.1.for_process()
    }
}

/// An NVFP4 tensor in device memory: values `[L, rows, K/2]` u8 and scales (plain or blocked).
pub struct DeviceNvfp4 {
    /// Values and scales.
    buffers: Arc<Owned<(CudaSlice<u8>, CudaSlice<u8>)>>,
    addrs: (u64, u64),
    meta: Nvfp4Meta,
}

impl DeviceNvfp4 {
    /// Its shape, layout and global scale.
    pub fn meta(&self) -> &Nvfp4Meta {
        &self.meta
    }
    /// A view for binding, holding the buffers alive.
    pub fn view(&self) -> Nvfp4View {
        Nvfp4View {
            values: self.addrs.0,
            scales: self.addrs.1,
            meta: self.meta,
            packed: None,
            keep: Some(self.buffers.clone()),
        }
    }
}

/// Where a view's packed form is (backend/cuda/packed.rs): its address, the activation type it
/// decodes to, and whether it packs a dual GEMM's pair (attached to both operands' views).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PackedRef {
    pub addr: u64,
    pub act: PackAct,
    pub pair: bool,
}

/// Device memory seen as an NVFP4 tensor.
#[derive(Clone)]
pub struct Nvfp4View {
    pub(crate) values: u64,
    pub(crate) scales: u64,
    /// Shape, layout, global scale.
    pub meta: Nvfp4Meta,
    /// The same weight in the packed form of the W4A16 skeleton, when attached
    /// ([`Nvfp4View::with_packed`]).
    pub(crate) packed: Option<PackedRef>,
    keep: Option<Keep>,
}

impl std::fmt::Debug for Nvfp4View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Nvfp4View({:#x}, {:#x}, {:?})", self.values, self.scales, self.meta)
    }
}

impl Nvfp4View {
    /// 1 when its scales are in the blocked layout, 0 for plain: the flag of kernel parameters.
    pub(crate) fn blocked_flag(&self) -> i32 {
        i32::from(self.meta.layout == ScaleLayout::Blocked)
    }
    /// A view of device memory the caller owns (e.g. a framework's tensors).
    ///
    /// # Safety
    /// `values` and `scales` must be device addresses of this backend's context holding
    /// `meta.value_bytes()` and `meta.scale_bytes()` bytes, 16-byte aligned, and must stay
    /// allocated until every launch bound to this view has completed.
    pub unsafe fn from_raw(values: u64, scales: u64, meta: Nvfp4Meta) -> Result<Self> {
        crate::format::tensor::check_dims(meta.l, meta.rows, meta.k)?;
        if !values.is_multiple_of(16) || !scales.is_multiple_of(16) {
            return Err(Error::Invalid("device operands must be 16-byte aligned".into()));
        }
        Ok(Self { values, scales, meta, packed: None, keep: None })
    }
    /// What keeps its memory alive, if it is ours.
    pub(crate) fn keep(&self) -> Option<Keep> {
        self.keep.clone()
    }
    /// The same view with another packed form and keeper (backend/cuda/packed.rs).
    pub(crate) fn with_packed_parts(self, packed: Option<PackedRef>, keep: Option<Keep>) -> Self {
        Self { packed, keep, ..self }
    }
    /// The same tensor with its packed values read from `out`'s memory instead, which must hold
    /// exactly as many bytes: one launch's output consumed as the next one's operand.
    pub(crate) fn with_values_from(self, out: &F16View) -> Result<Self> {
        let bytes = out.shape.iter().try_fold(2usize, |n, &d| n.checked_mul(d));
        if bytes != Some(self.meta.value_bytes()) {
            return Err(Error::Shape(format!(
                "an output {:?} does not hold the {} B of packed values of {:?}",
                out.shape,
                self.meta.value_bytes(),
                self.meta
            )));
        }
        let keep = match (self.keep, out.keep()) {
            (Some(a), Some(b)) => Some(Arc::new(KeepBoth(a, b)) as Keep),
            (a, b) => a.or(b),
        };
        Ok(Self { values: out.addr, keep, ..self })
    }
}

/// A 16-bit float tensor `[L, rows, cols]` (f16, or bf16 by its dtype) in device memory: an
/// operation's output.
pub struct DeviceF16 {
    buf: Arc<Owned<CudaSlice<u16>>>,
    addr: u64,
    shape: [usize; 3],
    dtype: OutputDtype,
}

impl DeviceF16 {
    /// `[L, rows, cols]`.
    pub fn shape(&self) -> [usize; 3] {
        self.shape
    }
    /// Its element type.
    pub fn dtype(&self) -> OutputDtype {
        self.dtype
    }
    /// A view for binding, holding the buffer alive.
    pub fn view(&self) -> F16View {
        F16View { addr: self.addr, shape: self.shape, dtype: self.dtype, keep: Some(self.buf.clone()) }
    }
}

/// Device memory seen as a 16-bit float `[L, rows, cols]` tensor, row-major: an operation's
/// output, f16 unless [`F16View::with_dtype`] says bf16 (the kernels round once to it).
#[derive(Clone)]
pub struct F16View {
    pub(crate) addr: u64,
    /// `[L, rows, cols]`.
    pub shape: [usize; 3],
    /// The element type the operation writes.
    pub dtype: OutputDtype,
    keep: Option<Keep>,
}

impl F16View {
    /// The same memory written as `dtype` (both types are 2 bytes per element).
    pub fn with_dtype(self, dtype: OutputDtype) -> Self {
        Self { dtype, ..self }
    }

    /// A view of an f16 `[L, rows, cols]` output the caller owns (e.g. a framework's tensor); a
    /// bf16 one is this view [`with_dtype`](F16View::with_dtype) bf16.
    ///
    /// # Safety
    /// `addr` must be a device address of this backend's context holding `L * rows * cols` 16-bit elements,
    /// 16-byte aligned, that stays allocated until every launch bound to this view has completed
    /// and that nothing else reads or writes while those launches run.
    pub unsafe fn from_raw(addr: u64, shape: [usize; 3]) -> Result<Self> {
        if shape.contains(&0) {
            return Err(Error::Shape(format!("an f16 output {shape:?} has a zero dimension")));
        }
        if !addr.is_multiple_of(16) {
            return Err(Error::Invalid("device operands must be 16-byte aligned".into()));
        }
        Ok(Self { addr, shape, dtype: OutputDtype::F16, keep: None })
    }
    /// What keeps its memory alive, if it is ours.
    pub(crate) fn keep(&self) -> Option<Keep> {
        self.keep.clone()
    }
    /// 1 when the kernels write bf16, 0 for f16: the flag of their parameters.
    pub(crate) fn bf16_flag(&self) -> i32 {
        i32::from(self.dtype == OutputDtype::Bf16)
    }
}

/// The factor of the product of `a` and `b`: the optional alpha times both global scales, in
/// f32 and in this order (the CPU reference's), widened to f64 for the epilogues.
pub(crate) fn product_alpha(alpha: Option<f32>, a: &Nvfp4View, b: &Nvfp4View) -> f64 {
    (alpha.unwrap_or(1.0) * a.meta.global_scale * b.meta.global_scale) as f64
}

/// `x` as a kernel's i32 index or size, or a typed error naming it.
pub(crate) fn to_i32(x: usize, what: &str) -> Result<i32> {
    i32::try_from(x).map_err(|_| Error::Invalid(format!("{what} = {x} exceeds the kernel's 32-bit indexing")))
}

/// Uploads a host NVFP4 tensor: the one path from host operand data to the device. Sizes are
/// checked against the GPU's free memory first.
pub(crate) fn upload(gpu: &Gpu, t: &Nvfp4Tensor) -> Result<DeviceNvfp4> {
    let meta = t.meta();
    gpu.check_fits::<u8>(t.nbytes(), &format!("an NVFP4 tensor [{}, {}, {}]", meta.l, meta.rows, meta.k))?;
    let values = gpu.upload(t.values(), "packed values")?;
    let scales = gpu.upload(t.scales(), "scales")?;
    let addrs = (gpu.addr(&values), gpu.addr(&scales));
    Ok(DeviceNvfp4 { buffers: Owned::new(gpu, (values, scales)), addrs, meta })
}

/// Uploads a host 16-bit tensor (a W4A16 activation), size-checked.
pub(crate) fn upload_dense(gpu: &Gpu, t: &OutTensor) -> Result<DeviceF16> {
    let what = format!("a {} tensor {:?}", t.dtype(), t.shape());
    gpu.check_fits::<u16>(t.bits().len(), &what)?;
    let buf = gpu.upload(t.bits(), &what)?;
    let addr = gpu.addr(&buf);
    Ok(DeviceF16 { buf: Owned::new(gpu, buf), addr, shape: t.shape(), dtype: t.dtype() })
}

/// A zeroed output `[L, rows, cols]` of `dtype`, size-checked.
pub(crate) fn alloc_out(gpu: &Gpu, shape: [usize; 3], dtype: OutputDtype) -> Result<DeviceF16> {
    let [l, rows, cols] = shape;
    let n = l.checked_mul(rows).and_then(|x| x.checked_mul(cols)).ok_or_else(|| Error::TooLarge {
        what: format!("a {dtype} output {shape:?}"),
        needed: u64::MAX,
        available: 0,
    })?;
    let buf = gpu.zeros::<u16>(n, &format!("a {dtype} output {shape:?}"))?;
    let addr = gpu.addr(&buf);
    Ok(DeviceF16 { buf: Owned::new(gpu, buf), addr, shape, dtype })
}

/// Enqueues a fill of an output with a 16-bit pattern (its type's NaN to poison it).
pub(crate) fn fill_f16(gpu: &Gpu, t: &DeviceF16, bits: u16) -> Result<()> {
    gpu.fill_u16(&t.buf, bits)
}

/// A device activation: an NVFP4 view (W4A4) or a dense 16-bit `[L, rows, K]` view (W4A16; an
/// [`F16View`] of either 16-bit type, the same kind of view as an output).
pub type ActView<'a> = Act<&'a Nvfp4View, &'a F16View>;

/// One operation on device operands: views of the NVFP4 weights, the MoE offsets, the MoE
/// per-expert alphas, the outputs and the activation (see [`Op`] for each operation's operands).
pub type DeviceOp<'a> = Op<&'a Nvfp4View, &'a I32View, &'a F32View, &'a F16View, ActView<'a>>;

impl<'a> From<&'a Nvfp4View> for ActView<'a> {
    fn from(v: &'a Nvfp4View) -> Self {
        Act::Nvfp4(v)
    }
}
impl<'a> From<&'a F16View> for ActView<'a> {
    fn from(v: &'a F16View) -> Self {
        Act::Dense(v)
    }
}

/// A GEMM on device operands, one group of a grouped launch: `c = A·Bᵀ` with an optional alpha
/// (A `[1, M, K]`, B `[1, N, K]`, c `[1, M, N]`).
pub type GemmViews<'a> = Group<&'a Nvfp4View, &'a F16View, ActView<'a>>;

impl Operand for Nvfp4View {
    fn meta(&self) -> Nvfp4Meta {
        self.meta
    }
}

impl Offsets for I32View {
    fn count(&self) -> usize {
        self.len
    }
}

impl Alphas for F32View {
    fn count(&self) -> usize {
        self.len
    }
}

impl Activation for Nvfp4View {
    fn act_meta(&self) -> ActMeta {
        Act::Nvfp4(self.meta)
    }
}

impl Activation for F16View {
    fn act_meta(&self) -> ActMeta {
        Act::Dense(OutMeta { shape: self.shape, dtype: self.dtype })
    }
}

impl Output for F16View {
    fn out_meta(&self) -> Option<OutMeta> {
        Some(OutMeta { shape: self.shape, dtype: self.dtype })
    }
}

/// A 4-byte element of a [`ValuesView`] (its name in messages).
pub trait Value: cudarc::driver::DeviceRepr + Copy + Send + Sync + 'static {
    /// `i32`, `f32`.
    const NAME: &'static str;
}
impl Value for i32 {
    const NAME: &'static str = "i32";
}
impl Value for f32 {
    const NAME: &'static str = "f32";
}

/// Device memory seen as `len` values of one type: [`I32View`] (a MoE launch's expert offsets)
/// or [`F32View`] (its per-expert alphas), read only by the kernels.
pub struct ValuesView<T> {
    pub(crate) addr: u64,
    /// Number of values.
    pub len: usize,
    keep: Option<Keep>,
    kind: std::marker::PhantomData<T>,
}

/// `len` i32 values on the device (a MoE launch's expert offsets).
pub type I32View = ValuesView<i32>;
/// `len` f32 values on the device (a MoE launch's per-expert alphas).
pub type F32View = ValuesView<f32>;

impl<T> Clone for ValuesView<T> {
    fn clone(&self) -> Self {
        Self { addr: self.addr, len: self.len, keep: self.keep.clone(), kind: self.kind }
    }
}

impl<T: Value> ValuesView<T> {
    /// A view of device memory the caller owns.
    ///
    /// # Safety
    /// `addr` must be a device address of this backend's context holding `len` values of `T`,
    /// 4-byte aligned, allocated until every launch bound to this view has completed.
    pub unsafe fn from_raw(addr: u64, len: usize) -> Result<Self> {
        if !addr.is_multiple_of(4) {
            return Err(Error::Invalid(format!("device {} values must be 4-byte aligned", T::NAME)));
        }
        Ok(Self { addr, len, keep: None, kind: std::marker::PhantomData })
    }
    /// What keeps its memory alive, if it is ours.
    pub(crate) fn keep(&self) -> Option<Keep> {
        self.keep.clone()
    }
}

/// Copies i32 or f32 values to the device.
pub(crate) fn upload_values<T: Value>(gpu: &Gpu, values: &[T]) -> Result<ValuesView<T>> {
    let buf = gpu.upload(values, &format!("{} values", T::NAME))?;
    let addr = gpu.addr(&buf);
    Ok(ValuesView { addr, len: values.len(), keep: Some(Owned::new(gpu, buf)), kind: std::marker::PhantomData })
}

/// Waits for the stream and copies an output back.
pub(crate) fn download(gpu: &Gpu, t: &DeviceF16) -> Result<OutTensor> {
    gpu.sync()?;
    let mut bits = gpu.download(&t.buf)?;
    let [l, rows, cols] = t.shape;
    bits.truncate(l * rows * cols);
    OutTensor::new(t.dtype, t.shape, bits)
}

/// What a launch needs besides its operands: scratch bytes (decoded X, split-K partials) and
/// arrival counters. Counters live in their own buffer, zeroed when allocated and left at zero by
/// every kernel that uses them, so launches of different plans can share one workspace: scratch
/// that one plan wrote is never another plan's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkspaceNeeds {
    /// Scratch bytes.
    pub bytes: usize,
    /// u32 arrival counters.
    pub counters: usize,
}

/// Scratch device memory and arrival counters of launches on one stream; a clone is another
/// handle to the same memory.
#[derive(Clone)]
pub struct Workspace {
    /// Scratch and counters.
    buffers: Arc<Owned<(CudaSlice<u8>, CudaSlice<u32>)>>,
    addrs: (u64, u64),
    size: WorkspaceNeeds,
}

impl Workspace {
    /// Zeroed scratch and counters of at least these sizes, ready when this returns (so that
    /// launches on any stream of the context may use them: [`Gpu::zeros`]).
    pub(crate) fn new(gpu: &Gpu, size: WorkspaceNeeds) -> Result<Self> {
        let scratch = gpu.zeros::<u8>(size.bytes, "the launch workspace")?;
        let counters = gpu.zeros::<u32>(size.counters, "the launch's arrival counters")?;
        let addrs = (gpu.addr(&scratch), gpu.addr(&counters));
        Ok(Self { buffers: Owned::new(gpu, (scratch, counters)), addrs, size })
    }
    /// Its sizes.
    pub fn size(&self) -> WorkspaceNeeds {
        self.size
    }
    /// Whether it holds `needs`.
    pub fn holds(&self, needs: WorkspaceNeeds) -> bool {
        self.size.bytes >= needs.bytes && self.size.counters >= needs.counters
    }
    /// The address of scratch byte `offset`, after checking that `len` bytes fit there.
    pub(crate) fn at(&self, offset: usize, len: usize) -> Result<u64> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size.bytes => Ok(self.addrs.0 + offset as u64),
            _ => Err(Error::Invalid(format!("workspace of {} B too small for {len} B at {offset}", self.size.bytes))),
        }
    }
    /// The address of the first of `n` zeroed counters.
    pub(crate) fn counters(&self, n: usize) -> Result<u64> {
        if n > self.size.counters {
            return Err(Error::Invalid(format!("workspace holds {} counters, {n} wanted", self.size.counters)));
        }
        Ok(self.addrs.1)
    }
    /// What keeps it alive.
    pub(crate) fn keep(&self) -> Keep {
        self.buffers.clone()
    }
    /// Keeps it allocated until the process ends, whatever is dropped: for a caller that would
    /// keep it anyway (a framework binding whose CUDA graphs may hold its address), so that the
    /// launches reading it skip noting their streams.
    pub fn keep_for_process(&self) {
        self.buffers.keep_for_process();
    }
}

/// Carves scratch into aligned pieces: the running byte count of what a plan needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Carve(pub usize);

impl Carve {
    /// Reserves `bytes` (256-byte aligned) and returns their offset.
    pub fn take(&mut self, bytes: usize) -> usize {
        let at = self.0.next_multiple_of(256);
        self.0 = at + bytes;
        at
    }
}
