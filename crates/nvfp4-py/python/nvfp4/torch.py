"""PyTorch integration: ``torch.ops.nvfp4.*`` custom ops (with fake implementations, so they
trace under ``torch.compile`` and replay in CUDA graphs) and ``Linear``, an NVFP4 linear layer
built from a ModelOpt or compressed-tensors checkpoint.

The ops are registered with ``torch.library.Library`` define/impl (cheaper per call than
``@torch.library.custom_op``): ``nvfp4::gemm``, ``nvfp4::gemv``, ``nvfp4::dual_gemm``,
``nvfp4::grouped_gemm``, ``nvfp4::grouped_gemm_moe`` (the MoE form: tokens, stacked expert
weights, int32 offsets; its ``alpha`` one float, a list of E floats or a float32 tensor [E] of
per-expert alphas on the operands' device: three overloads, ``.default``, ``.list`` and
``.Tensor``), ``nvfp4::quantize``, ``nvfp4::quantize_dequant`` (x's quantization as 16-bit
numbers e2m1 * e4m3, and its global scale). The activation's scales are optional (``None``: a dense
float16/bfloat16 activation, W4A16, whose dtype the result takes unless ``out_dtype`` is given):
``sfa`` of gemm, dual_gemm and grouped_gemm_moe, each group's of grouped_gemm, and the GEMV
vector's ``sfb``. ``gemm`` and ``grouped_gemm_moe`` take the weight's packed form as ``packed=``
(W4A16 on CUDA: ``nvfp4.pack``).

Kernels: where torch has the stable C ABI (torch >= 2.10 on Linux), every operator but
``grouped_gemm`` and ``grouped_gemm_moe.list`` runs on a native boxed kernel of the extension
(``NATIVE_KERNELS`` names them; ``NVFP4_TORCH_NATIVE_KERNELS=0`` turns them off): an eager call
goes from torch's dispatcher to the operation without a Python frame (about half the host time
of the Python kernels). A refused call raises RuntimeError, torch's type for an operator's
refusal, whose message starts with the operation's own type (``ValueError: gemm: ...``); the
functions of ``nvfp4`` raise their own types, and so do `Linear` and `MoE` for what they check
themselves (input dtype and width); what only the operation refuses reaches them as RuntimeError.
"""

import os
import sys
import warnings

import torch

import nvfp4 as _nv
from nvfp4.packed_forms import PackedForms, w4a4_on_w4a16

_lib = torch.library.Library("nvfp4", "DEF")
# out_dtype: float16 (None) or bfloat16, rounded once; layout: the scales' layout where their shape
# reads both ways (last, so that calls passing the others by position keep working).
# The activation's scales (sfa; the GEMV vector's sfb) are optional: None marks a dense 16-bit
# activation (W4A16).
_OUT = "ScalarType? out_dtype=None, str? layout=None"
# packed: W4A16 on CUDA, the weight's packed form for the activation's dtype (``nvfp4.pack``).
_lib.define(
    f"gemm(Tensor a, Tensor? sfa, Tensor b, Tensor sfb, float? alpha=None, {_OUT}, Tensor? packed=None) -> Tensor"
)
_lib.define(f"gemv(Tensor a, Tensor sfa, Tensor b, Tensor? sfb, float? alpha=None, {_OUT}) -> Tensor")
_lib.define(
    "dual_gemm(Tensor a, Tensor? sfa, Tensor b1, Tensor sfb1, Tensor b2, Tensor sfb2, float? alpha=None, "
    f"{_OUT}) -> Tensor"
)
_lib.define(
    f"grouped_gemm(Tensor[] a, Tensor?[] sfa, Tensor[] b, Tensor[] sfb, float[]? alpha=None, {_OUT}) -> Tensor[]"
)
# The MoE form's alpha: one float (the default overload), a float32 tensor [E] of per-expert
# alphas (.Tensor: read by the kernel, graph-safe) or a list of E floats (.list). The packet tries
# the overloads in the order defined, so .Tensor comes first: a one-element tensor would also
# parse as a float, through a host synchronization. A float alpha through the packet then pays a
# failed match against .Tensor first (torch builds and catches a schema error: 12-24 µs of host
# time per call on an H100 host); callers that know their alpha's form name the overload (`MoE`
# does).
_MOE = (
    "grouped_gemm_moe{}(Tensor a, Tensor? sfa, Tensor b, Tensor sfb, Tensor offsets, {}, {}, Tensor? packed=None) "
    "-> Tensor"
)
_lib.define(_MOE.format(".Tensor", "Tensor alpha", _OUT))
_lib.define(_MOE.format("", "float? alpha=None", _OUT))
_lib.define(_MOE.format(".list", "float[] alpha", _OUT))
_lib.define("quantize(Tensor x, float? global_scale=None, str layout='plain') -> (Tensor, Tensor, Tensor)")
# x quantized, written back as e2m1 * e4m3 (bfloat16; float16 for float16 x), and the global scale:
# what a W4A4 Linear feeds the W4A16 kernels (its alpha = the global scale * the weight's).
_lib.define("quantize_dequant(Tensor x, float? global_scale=None) -> (Tensor, Tensor)")


def _out(a, n, out_dtype=None, dense=None):
    """The output of the fake implementations: a's leading dimensions and n columns, in
    ``out_dtype``, else the dense activation's dtype (W4A16), else float16; as the real
    operations allocate it."""
    lead = (a.shape[0], a.shape[1]) if a.dim() == 3 else (a.shape[0],)
    if out_dtype is None:
        out_dtype = getattr(torch, _nv._default_dtype(dense))
    return a.new_empty(lead + (n,), dtype=out_dtype)


# The CPU and CUDA kernels of the ops (what the dispatcher calls at every eager call): for torch
# tensors of the usual ranks they allocate the output and call the native function once, without
# going through the generic ``nvfp4.gemm``-style wrappers (which also take NumPy arrays and old
# torch, and so convert dtypes to names and back, re-read shapes and add a call layer). Anything
# else (a wrong rank, an out_dtype other than float16/bfloat16, torch without the DLPack C
# exchange API) takes the generic wrapper, which raises its own messages: same results, same
# errors. The native functions check everything again; the shortcuts only skip Python work.
_native = _nv._nvfp4
_DIRECT = not _nv._LEGACY_TORCH
_HALF = (torch.float16, torch.bfloat16)
_RANKS = (2, 3)


def _out_lead(a, b):
    """The output's leading dimensions, as ``nvfp4.gemm`` shapes them: [M] when both operands are
    2-D, else [L, M]."""
    if a.dim() == 2 and b.dim() == 2:
        return (a.shape[0],)
    return (a.shape[0] if a.dim() == 3 else 1, a.shape[-2])


def _gemm(a, sfa, b, sfb, alpha=None, out_dtype=None, layout=None, packed=None):
    dt = out_dtype if out_dtype is not None else (a.dtype if sfa is None and a.dtype in _HALF else torch.float16)
    if _DIRECT and dt in _HALF and a.dim() in _RANKS and b.dim() in _RANKS:
        out = a.new_empty(_out_lead(a, b) + (b.shape[-2],), dtype=dt)
        if packed is None:
            _native.gemm(a, sfa, b, sfb, out, alpha, layout, None)
        else:
            _native.gemm(a, sfa, b, sfb, out, alpha, layout, None, packed)
        return out
    return _nv.gemm(a, sfa, b, sfb, alpha=alpha, out_dtype=out_dtype, layout=layout, packed=packed)


def _gemv(a, sfa, b, sfb, alpha=None, out_dtype=None, layout=None):
    dt = out_dtype if out_dtype is not None else (b.dtype if sfb is None and b.dtype in _HALF else torch.float16)
    if _DIRECT and dt in _HALF and a.dim() in _RANKS and b.dim() in _RANKS:
        out = a.new_empty(_out_lead(a, b) + (1,), dtype=dt)
        _native.gemv(a, sfa, b, sfb, out, alpha, layout, None)
        return out
    return _nv.gemv(a, sfa, b, sfb, alpha=alpha, out_dtype=out_dtype, layout=layout)


def _dual(a, sfa, b1, sfb1, b2, sfb2, alpha=None, out_dtype=None, layout=None):
    dt = out_dtype if out_dtype is not None else (a.dtype if sfa is None and a.dtype in _HALF else torch.float16)
    if _DIRECT and dt in _HALF and a.dim() in _RANKS and b1.dim() in _RANKS:
        out = a.new_empty(_out_lead(a, b1) + (b1.shape[-2],), dtype=dt)
        _native.dual_gemm(a, sfa, b1, sfb1, b2, sfb2, out, alpha, layout, None)
        return out
    return _nv.dual_gemm(a, sfa, b1, sfb1, b2, sfb2, alpha=alpha, out_dtype=out_dtype, layout=layout)


def _grouped(a, sfa, b, sfb, alpha=None, out_dtype=None, layout=None):
    return _nv.grouped_gemm(list(zip(a, sfa, b, sfb)), alpha=alpha, out_dtype=out_dtype, layout=layout)


def _grouped_moe(a, sfa, b, sfb, offsets, alpha=None, out_dtype=None, layout=None, packed=None):
    return _nv.grouped_gemm(
        (a, sfa, b, sfb), offsets=offsets, alpha=alpha, out_dtype=out_dtype, layout=layout, packed=packed
    )


def _quantize(x, global_scale=None, layout="plain"):
    if _DIRECT and layout == "plain" and x.dim() in _RANKS:
        lead, k = tuple(x.shape[:-1]), x.shape[-1]
        values = x.new_empty(lead + (k // 2,), dtype=torch.uint8)
        scales = x.new_empty(lead + (k // 16,), dtype=torch.uint8)
        glob = x.new_empty((1,), dtype=torch.float32)
        _native.quantize(x, values, scales, glob, global_scale, layout, None, False)
        return values, scales.view(torch.float8_e4m3fn), glob
    return _nv.quantize(x, global_scale, layout)


def _dequant_dtype(x):
    return torch.float16 if x.dtype == torch.float16 else torch.bfloat16


def _quantize_dequant(x, global_scale=None):
    out = x.new_empty(x.shape, dtype=_dequant_dtype(x))
    glob = x.new_empty((1,), dtype=torch.float32)
    _native.quantize_dequant(x, out, glob, global_scale, _nv._stream(x))
    return out, glob


def _native_kernels():
    """Registers the native boxed kernels (``_nvfp4.register_torch_kernels``: torch's stable C
    ABI, libtorch >= 2.10 on Linux) for the CPU and CUDA keys of the operators they serve, and
    returns those operators' names; () where they cannot be used (an older torch, another OS, or
    ``NVFP4_TORCH_NATIVE_KERNELS=0``), and the Python kernels below serve every operator.

    Why: an eager call through a Python kernel pays the dispatcher's trip back into Python, a
    Python-level output allocation and the DLPack exchange (25.6 µs per ``torch.ops.nvfp4.gemm``
    on an H100 host where torch's own one-kernel ``add_`` takes 10.6). The native kernels run the
    same checked operations; their errors reach Python as RuntimeError (torch's type for an
    operator's refusal) with the operation's message, its own type named first."""
    if _nv._LEGACY_TORCH or os.environ.get("NVFP4_TORCH_NATIVE_KERNELS", "1") == "0":
        return ()
    if not sys.platform.startswith("linux") or tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 10):
        return ()
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    cpu, cuda = os.path.join(lib, "libtorch_cpu.so"), os.path.join(lib, "libtorch_cuda.so")
    try:
        return tuple(_native.register_torch_kernels(cpu, cuda if os.path.exists(cuda) else None))
    except Exception as e:  # a torch whose shim lacks a function: the Python kernels serve
        warnings.warn(f"nvfp4: native torch kernels unavailable ({e}); using the Python kernels", stacklevel=2)
        return ()


NATIVE_KERNELS = _native_kernels()

for _name, _fn in (
    ("gemm", _gemm),
    ("gemv", _gemv),
    ("dual_gemm", _dual),
    ("grouped_gemm", _grouped),
    ("grouped_gemm_moe", _grouped_moe),
    ("grouped_gemm_moe.Tensor", _grouped_moe),
    ("grouped_gemm_moe.list", _grouped_moe),
    ("quantize", _quantize),
    ("quantize_dequant", _quantize_dequant),
):
    if _name not in NATIVE_KERNELS:
        _lib.impl(_name, _fn, "CPU")
        _lib.impl(_name, _fn, "CUDA")


_ops = torch.ops.nvfp4  # looked up once, not at every Linear call


@torch.library.register_fake("nvfp4::gemm")
def _gemm_fake(a, sfa, b, sfb, alpha=None, out_dtype=None, layout=None, packed=None):
    return _out(a, b.shape[-2], out_dtype, _nv._dense(a, sfa))


@torch.library.register_fake("nvfp4::gemv")
def _gemv_fake(a, sfa, b, sfb, alpha=None, out_dtype=None, layout=None):
    return _out(a, 1, out_dtype, _nv._dense(b, sfb))


@torch.library.register_fake("nvfp4::dual_gemm")
def _dual_fake(a, sfa, b1, sfb1, b2, sfb2, alpha=None, out_dtype=None, layout=None):
    return _out(a, b1.shape[-2], out_dtype, _nv._dense(a, sfa))


@torch.library.register_fake("nvfp4::grouped_gemm")
def _grouped_fake(a, sfa, b, sfb, alpha=None, out_dtype=None, layout=None):
    dense = _nv._dense(a[0], sfa[0]) if len(a) and len(sfa) else None
    return [_out(x, y.shape[-2], out_dtype, dense) for x, y in zip(a, b)]


@torch.library.register_fake("nvfp4::grouped_gemm_moe")
@torch.library.register_fake("nvfp4::grouped_gemm_moe.Tensor")
@torch.library.register_fake("nvfp4::grouped_gemm_moe.list")
def _grouped_moe_fake(a, sfa, b, sfb, offsets, alpha=None, out_dtype=None, layout=None, packed=None):
    return _out(a, b.shape[-2], out_dtype, _nv._dense(a, sfa))


@torch.library.register_fake("nvfp4::quantize")
def _quantize_fake(x, global_scale=None, layout="plain"):
    lead, k = tuple(x.shape[:-1]), x.shape[-1]
    values = x.new_empty(lead + (k // 2,), dtype=torch.uint8)
    if layout == "plain":
        sshape = lead + (k // 16,)
    else:  # always 4-D, as nvfp4.quantize returns them
        rows = x.shape[-2]
        sshape = (x.shape[0] if x.dim() == 3 else 1, -(-rows // 128), -(-(k // 16) // 4), 512)
    scales = x.new_empty(sshape, dtype=torch.float8_e4m3fn)
    return values, scales, x.new_empty((1,), dtype=torch.float32)


@torch.library.register_fake("nvfp4::quantize_dequant")
def _quantize_dequant_fake(x, global_scale=None):
    return x.new_empty(x.shape, dtype=_dequant_dtype(x)), x.new_empty((1,), dtype=torch.float32)


def dequantize(values, scales, global_scale=1.0, dtype=torch.float32, layout=None):
    """NVFP4 back to dense ``dtype``: e2m1 * e4m3 * global (exact in float32), shaped like the
    values with K for K/2. Scales plain or blocked, told from their shape by the operations' rule
    (``layout=`` where a shape reads both ways, or to force one)."""
    v = values.view(torch.uint8)
    found = _nv._nvfp4.scale_layout(tuple(v.shape), tuple(scales.shape), layout)
    sc = scales.view(torch.uint8)
    if found == "blocked":
        sc = _unblock(sc, v.shape)
    lut = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], device=values.device)
    codes = torch.stack([v & 15, v >> 4], dim=-1).flatten(-2).long()
    x = lut[codes]
    s = sc.reshape(v.shape[:-1] + (v.shape[-1] // 8,)).view(torch.float8_e4m3fn).float()
    g = global_scale if not torch.is_tensor(global_scale) else global_scale.float()
    return (x * s.repeat_interleave(16, dim=-1) * g).to(dtype)


def _unblock(blocked, values_shape):
    """Blocked scales (any of their shapes) as plain [L, rows, K/16] bytes: SPEC §2's offset of
    each (batch, row, scale column), gathered."""
    rows, cols = values_shape[-2], values_shape[-1] // 8
    l_ = values_shape[0] if len(values_shape) == 3 else 1
    r, c = -(-rows // 128), -(-cols // 4)
    dev = blocked.device
    b = torch.arange(l_, device=dev)[:, None, None]
    i = torch.arange(rows, device=dev)[None, :, None]
    j = torch.arange(cols, device=dev)[None, None, :]
    off = b * (r * c * 512) + (i // 128) * (c * 512) + (j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4
    return blocked.reshape(-1)[off]


MODES = ("w4a16", "w4a4")


class Linear(PackedForms):
    """y = x @ W^T (+ bias) with an NVFP4 weight W [N, K] (values, E4M3 scales and the global
    scale ``weight_global``), in one of two modes:

    - ``mode="w4a16"`` (the default): x stays float16 or bfloat16 and multiplies the NVFP4 weight
      directly (SPEC §8): float32 accumulation, alpha = ``weight_global``, one rounding to
      ``out_dtype``, by default x's dtype. The checkpoint's ``input_scale`` is kept but unused.
      Any other input dtype is a ``DtypeError``. Graph-capturable, no host synchronization.
    - ``mode="w4a4"``: x (float32, float16 or bfloat16) is quantized to NVFP4 on its device with
      the checkpoint's activation global scale ``input_scale`` (ModelOpt; the inverse of
      compressed-tensors' ``input_global_scale``), then the NVFP4 x NVFP4 GEMM runs with alpha =
      input_scale * weight_global: what a Blackwell GPU computes for the same checkpoint. Without
      an ``input_scale`` the activation scale is the per-call amax (a host synchronization: not
      capturable in a CUDA graph). ``out_dtype`` defaults to float16. On CUDA the quantized x
      reaches the GEMM written back as 16-bit numbers (e2m1 * e4m3 is exact in bfloat16 and
      float16) and the W4A16 kernels run it on the packed weight: the same products, summed in
      float32.

    Which to pick: on Hopper, ``"w4a16"``. It is the accurate one: the NVFP4 weight is its only
    quantization, so it equals the float64 product of x and the dequantized weight rounded once
    to the output (bfloat16: 0.17% relative norm, that rounding alone), whereas W4A4 also rounds
    every activation to 4 bits (9.5% relative norm for Gaussian activations with a per-tensor
    amax scale, more where a calibrated ``input_scale`` clips inputs unlike its calibration
    data; measured on the down_proj of a ModelOpt export, 256x512 bfloat16 inputs). Hopper has
    no FP4 tensor cores, so W4A4 gains no arithmetic speed there, and W4A16 needs neither an
    ``input_scale`` nor a quantize launch. Pick ``"w4a4"`` to reproduce what a Blackwell GPU
    serves for a ModelOpt (or compressed-tensors W4A4) checkpoint with activation quantization,
    for example to compare outputs with a Blackwell deployment or to evaluate the model as
    calibrated for it.

    The GEMM rounds once to ``out_dtype`` when it is float16 or bfloat16 (the bias, if any, is
    then added in that type); any other ``out_dtype`` is the rounded result cast (float16 for
    W4A4, x's dtype for W4A16).
    """

    def __init__(
        self, weight, weight_scale, weight_global, input_scale=None, bias=None, out_dtype=None, mode="w4a16"
    ):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f'mode must be "w4a16" or "w4a4", got {mode!r}')
        n, half = weight.shape
        if weight_scale.shape != (n, 2 * half // 16):
            raise ValueError(f"weight_scale must be [{n}, {2 * half // 16}] (plain), got {list(weight_scale.shape)}")
        self.in_features, self.out_features = 2 * half, n
        self.mode = mode
        self.register_buffer("weight", weight.view(torch.uint8).contiguous())
        self.register_buffer("weight_scale", weight_scale.view(torch.uint8).contiguous())
        self.weight_global = float(weight_global)
        self.input_scale = None if input_scale is None else float(input_scale)
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
        self.out_dtype = out_dtype
        # self._packed (PackedForms): activation dtype -> the weight's packed form (W4A16 on CUDA)

    def pack(self, dtype=torch.bfloat16):
        """Packs the weight (CUDA) for W4A16 with ``dtype`` activations (``nvfp4.pack``; W4A4
        runs on the same kernels with bfloat16 activations, float16 for float16 input): the
        GEMM kernels then read each thread's tensor-core fragment in one load (same results,
        faster; 1.125x the values' bytes beside the weight, which one-row and odd-K calls still
        read). Forward packs on its first CUDA call outside graph capture and compilation; call
        this after loading to have it packed before a capture. Moving the layer or loading a
        state dict drops the packed form; after writing the weight in place, call this again (it
        always packs the weight as it is now)."""
        if not self.weight.is_cuda:
            return None
        p = _nv.pack(self.weight, self.weight_scale, dtype=dtype)
        self._packed[dtype] = p
        return p

    def _packed_for(self, x):
        """The packed weight for x's dtype: packed now when allowed (x on the weight's device; not
        while a CUDA graph captures or torch.compile traces: the packing allocates and launches)."""
        if not x.is_cuda:
            return None
        p = self._packed.get(x.dtype)
        if p is not None and p.device == x.device:
            return p
        if not self._may_pack_for(self.weight, x):
            return None
        return self.pack(x.dtype)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, mode={self.mode!r}"

    @classmethod
    def from_state_dict(cls, sd, prefix="", bias=None, **kw):
        """From tensors named like a checkpoint: ModelOpt (``weight``, ``weight_scale``,
        ``weight_scale_2``, ``input_scale``) or compressed-tensors (``weight_packed``,
        ``weight_scale``, ``weight_global_scale``, ``input_global_scale``: inverses), and
        ``bias`` if present. ``mode`` and ``out_dtype`` go to the constructor."""
        p = prefix
        if p + "weight_packed" in sd:
            w, s = sd[p + "weight_packed"], sd[p + "weight_scale"]
            g = 1.0 / float(sd[p + "weight_global_scale"])
            i = sd.get(p + "input_global_scale")
            i = None if i is None else 1.0 / float(i)
        elif p + "weight" in sd:
            w, s, g = sd[p + "weight"], sd[p + "weight_scale"], float(sd[p + "weight_scale_2"])
            i = sd.get(p + "input_scale")
            i = None if i is None else float(i)
        else:
            raise ValueError(f"no `{p}weight` (ModelOpt) or `{p}weight_packed` (compressed-tensors) in the state dict")
        return cls(w, s, g, input_scale=i, bias=bias if bias is not None else sd.get(p + "bias"), **kw)

    @classmethod
    def from_safetensors(cls, path, prefix="", device="cuda", **kw):
        """From a safetensors file, read by the library's checkpoint readers (either convention),
        with the layer's ``bias`` if the file has one (``bias=`` overrides it). ``mode`` and
        ``out_dtype`` go to the constructor."""
        values, scales, n, k, g, i, _conv, b = _nv._nvfp4.load_linear(str(path), prefix)
        w = torch.frombuffer(bytearray(values), dtype=torch.uint8).view(n, k // 2).to(device)
        s = torch.frombuffer(bytearray(scales), dtype=torch.uint8).view(n, k // 16).to(device)
        if b is not None and "bias" not in kw:
            data, dtype = b
            kw["bias"] = torch.frombuffer(bytearray(data), dtype=getattr(torch, dtype)).to(device)
        return cls(w, s, g, input_scale=i, **kw)

    def forward(self, x):
        if x.shape[-1] != self.in_features:
            # Checked here, as a ValueError: the native operator kernels raise RuntimeError.
            raise ValueError(
                f"Linear: the input's last dimension is {x.shape[-1]}, the layer's in_features {self.in_features} "
                "(reduction lengths differ)"
            )
        flat = x.dim() == 2
        x2 = x if flat else x.reshape(-1, x.shape[-1])
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        rounded = self.out_dtype in (torch.float16, torch.bfloat16)
        if self.mode == "w4a16":
            if x.dtype not in (torch.float16, torch.bfloat16):
                raise _nv.DtypeError(
                    f"Linear(mode='w4a16') takes float16 or bfloat16 input, got {x.dtype}: convert it "
                    "(x.to(torch.bfloat16)), or use mode='w4a4', which quantizes any float input"
                )
            kernel_dtype = self.out_dtype if rounded else x.dtype
            packed = self._packed_for(x2)
            y = _ops.gemm(x2, None, self.weight, self.weight_scale, self.weight_global, kernel_dtype, packed=packed)
        elif x2.is_cuda and w4a4_on_w4a16(x2.shape[0]):
            # x's quantization written back as e2m1 * e4m3 (exact in 16 bits), then the W4A16
            # GEMM on the packed weight with alpha = both global scales: the W4A4 product
            # (SPEC §3, §8) on the faster kernels; the dequantizing pass is chained to the GEMM.
            xq, g = _ops.quantize_dequant(x2, self.input_scale)
            gx = self.input_scale if self.input_scale is not None else float(g.item())
            kernel_dtype = self.out_dtype if rounded else torch.float16
            packed = self._packed_for(xq)
            y = _ops.gemm(xq, None, self.weight, self.weight_scale, gx * self.weight_global, kernel_dtype, packed=packed)
        else:
            if self.input_scale is not None:
                q, s, _ = _ops.quantize(x2, self.input_scale)
                alpha = self.input_scale * self.weight_global
            else:
                q, s, g = _ops.quantize(x2)
                alpha = float(g.item()) * self.weight_global
            kernel_dtype = self.out_dtype if rounded else torch.float16
            y = _ops.gemm(q, s, self.weight, self.weight_scale, alpha, kernel_dtype)
        if not flat:
            y = y.reshape(x.shape[:-1] + (self.out_features,))
        if self.bias is not None:
            y = y + self.bias
        want = self.out_dtype if self.out_dtype is not None else kernel_dtype
        return y if y.dtype == want else y.to(want)


from .moe import MoE  # noqa: E402, F401  (the routed experts layer, over the ops registered above)
from .moe_ep import ExpertParallelMoE  # noqa: E402, F401  (MoE's experts split over a process group)
