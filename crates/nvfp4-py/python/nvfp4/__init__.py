"""nvfp4: exact NVFP4 matrix kernels for NVIDIA Hopper, on PyTorch and NumPy tensors.

Every operation takes NVFP4 operands as (packed values, scales): values uint8 (or
torch.float4_e2m1fn_x2) of shape [rows, K/2] or [L, rows, K/2], two E2M1 per byte with the even k
in the low nibble; scales float8_e4m3fn (or uint8), one E4M3 per 16 values along K.

Two modes (SPEC §8). W4A4: the activation is NVFP4 too, as above (what a Blackwell GPU computes
for a checkpoint with activation quantization). W4A16: the activation is a dense float16 or
bfloat16 tensor [rows, K] or [L, rows, K], passed with ``None`` for its scales, and the weights
stay NVFP4; the result is in the activation's dtype unless ``out_dtype``/``out`` say otherwise:

    gemm(x, None, w, sfw, alpha=g)                 # x [M, K] or [L, M, K] -> [.., M, N]
    gemv(w, sfw, x, None, alpha=g)                 # the vector x [1, K] or [L, 1, K] -> [.., M, 1]
    dual_gemm(x, None, w1, s1, w2, s2, alpha=g)    # silu(x @ w1^T) * (x @ w2^T)
    grouped_gemm([(x0, None, w0, s0), ...], alpha=[g0, ...])   # every group one mode
    grouped_gemm((x, None, w, sfw), offsets=offs, alpha=g)     # MoE: x [T, K], w [E, N, K/2]
    grouped_gemm((x, None, w, sfw), offsets=offs, alpha=g_e)   # g_e: one per expert, float32 [E]

The activation is the GEMM's ``a`` (each group's, the MoE tokens) and the GEMV's vector ``b``
(whose matrix ``a`` is the weight). In W4A16 ``alpha`` is the weight's global scale alone
(ModelOpt ``weight_scale_2``; 1 / compressed-tensors ``weight_global_scale``): a dense
activation has none. Products accumulate in float32 and round once to the output.

Scale shapes (R = ceil(rows/128), C = ceil(K/64)): plain scales have the values' shape with K/16
in place of K/2 ([rows, K/16] or [L, rows, K/16]); blocked scales (SPEC §2's 128x4 tiles) are
[L, R, C, 512], or [R, C, 512] when L = 1. A 1-D tensor is plain when it holds L*rows*K/16 bytes
and blocked when it holds L*R*C*512. Where one shape reads both ways (1-D when rows is a multiple of
128 and K of 64; [1, 128, 512] for values [1, 128, 4096]) the operation refuses to guess: pass
``layout="plain"`` or ``layout="blocked"``, which also forces a layout wherever it is given.
``quantize(x, layout="blocked")`` returns the 4-D form, which reads back as blocked.

No operation takes global scales: pass ``alpha=global_a * global_b`` (the global scales
``quantize`` returns, or a checkpoint's ``weight_scale_2`` times ``input_scale``); without it the
result is the product of the unscaled E2M1 x E4M3 values.

CUDA tensors run on the GPU, zero-copy, on the current torch stream of their device (read at every
call, so the operations work under ``torch.cuda.stream`` and CUDA graph capture); CPU tensors
(torch or NumPy) run on the exact CPU reference. Results are float16, or bfloat16 with
``out_dtype=torch.bfloat16`` (or ``"bfloat16"``, or a bfloat16 ``out=``), rounded once from the
accumulator; ``alpha`` multiplies before that rounding. ``out=`` writes into an existing tensor.
NumPy has no bfloat16: a bfloat16 result of NumPy operands is a CPU torch tensor (torch needed).

NumPy has no bfloat16 either: a bfloat16 activation is a torch tensor (CPU or CUDA); a float16
one may be a NumPy array.

Errors: ``ValueError`` (shapes, layouts, arrays DLPack cannot carry such as big-endian ones),
``DtypeError`` (a tensor of an element type its argument does not take, such as a float32
activation with ``None`` scales; a subclass of both ``TypeError`` and ``ValueError``),
``TypeError`` (not a tensor), ``RuntimeError`` (CUDA, and a CPU operation whose working memory the
host does not have, refused before anything is allocated).
"""

from . import _nvfp4
from ._nvfp4 import DtypeError, __version__, cuda_available

__all__ = ["gemv", "gemm", "dual_gemm", "grouped_gemm", "quantize", "cuda_available", "DtypeError", "__version__"]

try:  # torch is optional: NumPy arrays work without it.
    import torch as _torch
except ImportError:  # pragma: no cover
    _torch = None

# torch >= 2.10 hands its tensors (FP4/FP8 dtypes included) and its current stream to the native
# module through the DLPack C Exchange API: nothing to do here per call (the host cost of an eager
# call). Older torch: FP4/FP8 tensors as uint8 views, and the stream read here.
_LEGACY_TORCH = _torch is not None and not hasattr(_torch.Tensor, "__dlpack_c_exchange_api__")
_BYTE_VIEWS = ()
if _torch is not None:
    _BYTE_VIEWS = tuple(
        getattr(_torch, n) for n in ("float4_e2m1fn_x2", "float8_e4m3fn") if hasattr(_torch, n)
    )
    _raw_stream = getattr(_torch._C, "_cuda_getCurrentRawStream", None)


def _is_torch(t):
    return _torch is not None and isinstance(t, _torch.Tensor)


def _bytes(t):
    """torch's FP4/FP8 dtypes as uint8 (same bytes): older torch does not export them."""
    if _is_torch(t) and t.dtype in _BYTE_VIEWS:
        return t.view(_torch.uint8)
    return t


if _LEGACY_TORCH:

    def _args(*ts):
        """The tensors as the native module takes them."""
        return tuple(_bytes(t) for t in ts)

    def _stream(t):
        """The current torch stream of t's device as a raw CUstream (0 for CPU tensors)."""
        if _is_torch(t) and t.is_cuda:
            idx = t.device.index
            if _raw_stream is not None:
                return _raw_stream(idx)
            return _torch.cuda.current_stream(idx).cuda_stream
        return 0

else:

    def _args(*ts):
        """The tensors as the native module takes them: as they are."""
        return ts

    def _stream(t):
        """None: the native module takes the producer's current stream (C Exchange API), or the
        legacy default stream for producers without one."""
        return None


def _shape(t, name):
    try:
        return tuple(t.shape)
    except AttributeError:
        raise TypeError(f"{name}: expected a tensor or array, got {type(t).__name__}") from None


def _rows(t, name, dense=False):
    s = _shape(t, name)
    if len(s) not in (2, 3):
        what = "a dense activation must be [rows, K]" if dense else "packed values must be [rows, K/2]"
        raise ValueError(f"{name}: {what} or [L, rows, {'K' if dense else 'K/2'}], got shape {list(s)}")
    return s


def _empty(like, shape, dtype="float16"):
    if _is_torch(like):
        return _torch.empty(shape, dtype=getattr(_torch, dtype), device=like.device)
    if dtype == "bfloat16":
        if _torch is None:
            raise ValueError("out_dtype=bfloat16 with NumPy operands needs torch (NumPy has no bfloat16)")
        return _torch.empty(shape, dtype=_torch.bfloat16)
    import numpy as np

    return np.empty(shape, dtype=dtype)


def _zeros(like, shape, dtype="float16"):
    out = _empty(like, shape, dtype)
    out[...] = 0
    return out


def _out_shape(a, b, n, dense_a=False, dense_b=False):
    sa, sb = _rows(a, "a", dense_a), _rows(b, "b", dense_b)
    if len(sa) == 2 and len(sb) == 2:
        return (sa[0], n)
    return (sa[0] if len(sa) == 3 else 1, sa[-2], n)


def _dtype_name(d):
    """float16/bfloat16/... from a torch dtype, a NumPy dtype or a name."""
    if isinstance(d, str):
        return {"half": "float16", "bf16": "bfloat16"}.get(d, d)
    if _torch is not None and isinstance(d, _torch.dtype):
        return str(d).replace("torch.", "")
    try:
        import numpy as np

        return np.dtype(d).name
    except (ImportError, TypeError):
        return str(d)


def _default_dtype(dense):
    """The output type when none is named: a dense activation's own (W4A16), float16 for an NVFP4
    one (``dense`` None). A dense activation of another dtype gets float16 here and a
    ``DtypeError`` from the operation."""
    if dense is None:
        return "float16"
    name = _dtype_name(getattr(dense, "dtype", None))
    return name if name in ("float16", "bfloat16") else "float16"


def _out_dtype(out_dtype, out, dense=None):
    """The output type: ``out_dtype`` (float16 or bfloat16; default float16, or the dtype of the
    dense activation ``dense``), which a given ``out`` (one tensor or a list) must have."""
    name = _default_dtype(dense) if out_dtype is None else _dtype_name(out_dtype)
    if name not in ("float16", "bfloat16"):
        raise ValueError(f"out_dtype must be float16 or bfloat16, got {out_dtype}")
    if out is not None and out_dtype is not None:
        outs = out if isinstance(out, (list, tuple)) else [out]
        have = [_dtype_name(getattr(o, "dtype", None)) for o in outs]
        if any(h != name for h in have):
            raise ValueError(f"out_dtype is {name} but out= holds {', '.join(have)}")
    return name


def _dense(x, scales):
    """x when it is a dense activation (its scales None: W4A16), else None."""
    return x if scales is None else None


def gemm(a, sfa, b, sfb, *, alpha=None, layout=None, out=None, out_dtype=None, packed=None):
    """c[l, m, n] = alpha * sum_k A[l, m, k] * B[l, n, k] (A @ B^T, B rows are N like a Linear
    weight). A is the activation: NVFP4 (a, sfa), or dense float16/bfloat16 [M, K] or [L, M, K]
    with ``sfa=None`` (W4A16; the result then defaults to A's dtype). ``alpha``: the product of
    the operands' global scales (W4A16: the weight's). ``packed``: W4A16 on CUDA, B's packed form
    for A's dtype (``pack``), which the kernels then read instead (same results)."""
    dense = _dense(a, sfa)
    dtype = _out_dtype(out_dtype, out, dense)
    if out is None:
        out = _empty(a, _out_shape(a, b, _rows(b, "b")[-2], dense_a=dense is not None), dtype)
    if packed is None:
        _nvfp4.gemm(*_args(a, sfa, b, sfb), out, alpha, layout, _stream(a))
    else:
        _nvfp4.gemm(*_args(a, sfa, b, sfb), out, alpha, layout, _stream(a), packed)
    return out


def pack(b, sfb, *, dtype, b2=None, sfb2=None, layout=None):
    """The packed form of a CUDA NVFP4 weight (b, sfb) [N, K/2] or [L, N, K/2] for W4A16 with
    activations of ``dtype`` (torch.bfloat16 or torch.float16): a uint8 tensor on b's device
    that ``gemm``, ``grouped_gemm(offsets=)`` and, for a pair (b, sfb) and (b2, sfb2) packed
    together, ``dual_gemm`` take as ``packed=``. Each kernel thread then reads its tensor-core
    fragment in one load and decodes it in a few instructions (the same results, faster). Pack
    once, at load: the weights do not change. The packed form takes 1.125x the bytes of the
    values (their scales included), beside the weight itself, which the kernels that do not
    read the packed form (one activation row, K not a multiple of 32) still use."""
    if _torch is None or not _is_torch(b) or not b.is_cuda:
        raise ValueError("pack: the weight must be a CUDA torch tensor")
    name = str(dtype).replace("torch.", "")
    s = _rows(b, "b")
    l, rows, k = (1,) + s if len(s) == 2 else s
    k = 2 * k
    out = _torch.empty(_nvfp4.packed_size(l, rows, k, b2 is not None), dtype=_torch.uint8, device=b.device)
    if b2 is None:
        _nvfp4.pack_into(*_args(b, sfb), out, name, None, None, layout, _stream(b))
    else:
        _nvfp4.pack_into(*_args(b, sfb), out, name, *_args(b2, sfb2), layout, _stream(b))
    return out


def gemv(a, sfa, b, sfb, *, alpha=None, layout=None, out=None, out_dtype=None):
    """Batched GEMV: c[l, m] = alpha * sum_k A[l, m, k] * B[l, k]; A [L, M, K/2] the NVFP4
    matrix (the weight), b the vector [L, 1, K/2] (or [1, K/2]); output [L, M, 1]. The vector is
    the activation: NVFP4 (b, sfb), or dense float16/bfloat16 [L, 1, K] (or [1, K]) with
    ``sfb=None`` (W4A16; the result then defaults to b's dtype). ``alpha``: the product of the
    global scales (W4A16: the matrix's)."""
    dense = _dense(b, sfb)
    dtype = _out_dtype(out_dtype, out, dense)
    if out is None:
        out = _empty(a, _out_shape(a, b, 1, dense_b=dense is not None), dtype)
    _nvfp4.gemv(*_args(a, sfa, b, sfb), out, alpha, layout, _stream(a))
    return out


def dual_gemm(a, sfa, b1, sfb1, b2, sfb2, *, alpha=None, layout=None, out=None, out_dtype=None, packed=None):
    """Gated dual GEMM (SwiGLU): f16(silu(A @ B1^T) * (A @ B2^T)) (or bf16), alpha (the product
    of the global scales, B1 and B2 sharing one) applied to each product. A is NVFP4, or dense
    float16/bfloat16 with ``sfa=None`` (W4A16; the result then defaults to A's dtype).
    ``packed``: W4A16 on CUDA, the pair's packed form (``pack(b1, sfb1, b2=b2, sfb2=sfb2,
    dtype=...)``)."""
    dense = _dense(a, sfa)
    dtype = _out_dtype(out_dtype, out, dense)
    if out is None:
        out = _empty(a, _out_shape(a, b1, _rows(b1, "b1")[-2], dense_a=dense is not None), dtype)
    if packed is None:
        _nvfp4.dual_gemm(*_args(a, sfa, b1, sfb1, b2, sfb2), out, alpha, layout, _stream(a))
    else:
        _nvfp4.dual_gemm(*_args(a, sfa, b1, sfb1, b2, sfb2), out, alpha, layout, _stream(a), packed)
    return out


def grouped_gemm(groups, *, alpha=None, layout=None, out=None, out_dtype=None, offsets=None, packed=None):
    """Grouped GEMM, every group in one launch. Two forms:

    - list form: ``groups`` is a list of (a, sfa, b, sfb) with L = 1, each with its own M, N, K;
      returns a list of [M_g, N_g] outputs. ``alpha``: a float or one per group, each group's
      global_a * global_b (no operation takes global scales).
    - MoE form, ``offsets=`` (the ``offs`` of ``torch._grouped_mm(a, b, offs)``): ``groups`` is
      one tuple (a, sfa, b, sfb): a [T, K/2] the tokens sorted by expert, b [E, N, K/2] every
      expert's weight (rows are N, like a Linear weight), ``offsets`` int32 [E] on a's device,
      the cumulative end row of each expert's tokens (expert e owns rows offsets[e-1]:offsets[e],
      an expert may own none). Returns [T, N] ([1, T, N] when a is [1, T, K/2]). Rows at or past
      offsets[-1] belong to no expert: zero in a new output, left as they are in ``out=``.
      ``alpha``: one float for every expert (global_a * global_b), or one per expert (a ModelOpt
      MoE export's ``weight_scale_2`` of each expert, times ``input_scale`` in W4A4): a sequence
      of E floats, or a 1-D float32 tensor [E] on a's device. Expert e's rows are then exactly
      what one float alpha_e gives them. On the GPU only the kernel reads the offsets and a
      tensor of alphas (no copy, no host synchronization: a captured CUDA graph may change them
      between replays; offsets are clamped into [0, T], alphas are used as they are, so a NaN
      one makes its expert's rows NaN); a sequence is uploaded when the call is first bound. On
      the CPU the offsets must not decrease and lie in [0, T], and every alpha follows the
      float's rules (finite; with the global scales a factor that neither overflows nor, unless
      the alpha is 0, rounds to 0).

    W4A16 in both forms: each activation dense float16/bfloat16 ([M_g, K_g]; the MoE tokens
    [T, K]) with ``None`` for its scales, and ``alpha`` the weights' global scales. The groups of
    one call share one mode and one activation dtype (one launch); the outputs default to it.
    ``packed`` (MoE form, W4A16 on CUDA): b's packed form (``pack``).
    """
    if offsets is not None:
        return _grouped_moe(groups, offsets, alpha, layout, out, out_dtype, packed)
    if packed is not None:
        raise ValueError("grouped_gemm: packed= goes with the MoE form (offsets=)")
    if not isinstance(groups, (list, tuple)):
        raise TypeError("groups must be a list of (a, sfa, b, sfb) tuples")
    groups = [tuple(g) for g in groups]
    for i, g in enumerate(groups):
        if len(g) != 4:
            raise TypeError(f"groups[{i}] must be a tuple (a, sfa, b, sfb)")
    dtype = _out_dtype(out_dtype, out, _dense(groups[0][0], groups[0][1]) if groups else None)
    if out is None:
        out = [
            _empty(
                g[0],
                _out_shape(g[0], g[2], _rows(g[2], f"groups[{i}].b")[-2], dense_a=g[1] is None),
                dtype,
            )
            for i, g in enumerate(groups)
        ]
    groups = [_args(*g) for g in groups]
    first = groups[0][0] if groups else None
    _nvfp4.grouped_gemm(groups, list(out), alpha, layout, _stream(first))
    return list(out)


def _grouped_moe(operands, offsets, alpha, layout, out, out_dtype, packed=None):
    """The MoE form of ``grouped_gemm`` (see there)."""
    if isinstance(operands, list) and len(operands) == 1:
        operands = operands[0]
    if not isinstance(operands, (list, tuple)) or len(operands) != 4:
        raise TypeError("grouped_gemm(offsets=...): groups must be one tuple (a, sfa, b, sfb)")
    a, sfa, b, sfb = operands
    dtype = _out_dtype(out_dtype, out, _dense(a, sfa))
    if out is None:
        sa, sb = _rows(a, "a", sfa is None), _shape(b, "b")
        if len(sb) != 3:
            raise ValueError(f"moe gemm: b must be [E, N, K/2] (one weight per expert), got shape {list(sb)}")
        out = _zeros(a, sa[:-1] + (sb[1],), dtype)
    if packed is None:
        _nvfp4.grouped_gemm_moe(*_args(a, sfa, b, sfb), offsets, out, alpha, layout, _stream(a))
    else:
        _nvfp4.grouped_gemm_moe(*_args(a, sfa, b, sfb), offsets, out, alpha, layout, _stream(a), packed)
    return out


def quantize(x, global_scale=None, layout="plain", *, out=None, check_finite=False):
    """Quantizes f32/f16/bf16 ``x`` ([rows, K] or [L, rows, K]) to NVFP4 in the ModelOpt
    convention: returns (values uint8 [.., K/2], scales float8_e4m3fn (torch) or uint8 (NumPy),
    global_scale float32 [1]). Scales are plain [.., rows, K/16], or with ``layout="blocked"``
    [L, ceil(rows/128), ceil(K/64), 512] (4-D also for a 2-D ``x``: a shape no plain scales
    have, so the operations read them back as blocked). ``global_scale``: None (amax / (6 * 448),
    at least 2**-126, computed where x lives), a float, or a one-element float32 tensor on x's
    device (read by the kernel: graph-safe). The operations take no global scale: pass
    ``alpha=global_a * global_b`` (or ``dequantize``). Bit-identical on the GPU and the CPU for
    finite x. ``out=(values, scales, global)`` reuses buffers of those shapes.

    NaN and infinities have no NVFP4 encoding. On the CPU they raise ValueError naming the first
    element. On the GPU, where refusing would need a synchronization, a 16-block holding one gets
    the float8_e4m3fn NaN scale (0x7F) and zero values, so NaN reaches exactly the outputs that use
    that block; the amax global scale ignores them (and a device ``global_scale`` that is not
    finite and > 0 makes every scale NaN). ``check_finite=True`` synchronizes after the GPU
    launch and raises ValueError as the CPU does (not allowed under CUDA graph capture).
    """
    s = _shape(x, "x")
    if len(s) not in (2, 3):
        raise ValueError(f"x: must be [rows, K] or [L, rows, K], got shape {list(s)}")
    if layout not in ("plain", "blocked"):
        raise ValueError(f'layout must be "plain" or "blocked", got {layout!r}')
    if out is None:
        lead, k = s[:-1], s[-1]
        if layout == "plain":
            sshape = lead + (k // 16,)
        else:
            l_, rows = (1, s[0]) if len(s) == 2 else (s[0], s[1])
            sshape = (l_, -(-rows // 128), -(-(k // 16) // 4), 512)
        values = values_ret = _empty(x, lead + (k // 2,), "uint8")
        scales = _empty(x, sshape, "uint8")
        glob = _empty(x, (1,), "float32")
        if _is_torch(x) and hasattr(_torch, "float8_e4m3fn"):
            scales_ret = scales.view(_torch.float8_e4m3fn)
        else:
            scales_ret = scales
    else:
        if not isinstance(out, (tuple, list)):
            raise TypeError(f"out= must be a tuple (values, scales, global_scale), got {type(out).__name__}")
        if len(out) != 3:
            raise ValueError(f"out= must be a tuple of 3 tensors (values, scales, global_scale), got {len(out)}")
        values_ret, scales_ret, glob = out
        values, scales = _args(values_ret, scales_ret)
    _nvfp4.quantize(x, values, scales, glob, global_scale, layout, _stream(x), check_finite)
    return values_ret, scales_ret, glob
