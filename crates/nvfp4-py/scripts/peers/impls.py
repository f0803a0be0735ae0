"""The implementations one case times, each a factory of zero-argument calls per weight set
(torch). Every call is the form a user writes; nothing is hoisted out of it but the weights.

  nvfp4_w4a16        nvfp4.gemm / dual_gemm / grouped_gemm(offsets=) with the 16-bit
                     activation in A's slot (sfa None), alpha = the weight's global scale, the
                     weights packed once per set (nvfp4.pack; --w4a16-plain: as they are)
  nvfp4_w4a4         the W4A4 call as a user makes it: nvfp4.torch.Linear with the checkpoint's
                     static input_scale (dense); for dual and MoE what nvfp4.torch.MoE does on
                     CUDA: torch.ops.nvfp4.quantize_dequant, then dual_gemm / grouped_gemm W4A16 on
                     the weights packed once per set (NVFP4_W4A4_ROUTE=nvfp4: nvfp4.quantize, then
                     the NVFP4 x NVFP4 kernels)
  nvfp4_w4a4_kernel  the NVFP4 x NVFP4 GEMM on activations quantized beforehand
  humming            HummingLayer (W4A16), see humming_peer.py
  torch              cuBLAS BF16 (F.linear) or torch._grouped_mm BF16 on dequantized weights

Each implementation names the reference semantics its check uses ("w4a16": the 16-bit x and the
exact dequantized weight; "w4a4": the dequantized quantized x; "bf16": x and the BF16 weight) and
its tolerance profile. A factory that cannot be built (an API the installed package lacks, a peer
not installed) becomes an implementation with ``error`` set, and the bench goes on.
"""

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

import nvfp4
import nvfp4.torch as nvt
from nvfp4.packed_forms import W4A4_ON_W4A16
from peers import humming_peer
from peers.report import HUMMING, NVFP4_W4A4, NVFP4_W4A4_KERNEL, NVFP4_W4A16, TORCH
from peers.tolerance import nvfp4_profile, peer_profile

DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass
class Impl:
    name: str
    semantics: str  # "w4a16", "w4a4" or "bf16"
    profile: object
    make: Optional[Callable] = None  # set index -> zero-argument call returning the output
    error: Optional[str] = None


def _err(exc):
    return f"{type(exc).__name__}: {exc}".strip()[:500]


# The W4A16 weights' form: packed once per weight set (``nvfp4.pack``, what a user's model holds
# after loading), or as the checkpoint has them (bench_peers.py --w4a16-plain).
W4A16_PACKED = True


def _nvfp4_w4a16(ops, i):
    c, ws, x = ops.case, ops.sets[i], ops.x
    v, s = ws.values, ws.scales
    if c.op == "dual":
        p = nvfp4.pack(v[0], s[0], b2=v[1], sfb2=s[1], dtype=ops.dtype) if W4A16_PACKED else None
        return lambda: nvfp4.dual_gemm(x, None, v[0], s[0], v[1], s[1], alpha=ws.glob, packed=p)
    p = nvfp4.pack(v, s, dtype=ops.dtype) if W4A16_PACKED else None
    if c.op == "linear":
        return lambda: nvfp4.gemm(x, None, v, s, alpha=ws.glob, packed=p)
    return lambda: nvfp4.grouped_gemm((x, None, v, s), offsets=ops.offsets, alpha=ws.glob, packed=p)


def _w4a4_gemm(ops, ws, q, sq):
    """The W4A4 GEMM of activations q, sq (already quantized with ops.x_global)."""
    c, alpha, out_dtype = ops.case, ops.x_global * ws.glob, ops.dtype
    if c.op == "linear":
        return nvfp4.gemm(q, sq, ws.values, ws.scales, alpha=alpha, out_dtype=out_dtype)
    if c.op == "dual":
        v, s = ws.values, ws.scales
        return nvfp4.dual_gemm(q, sq, v[0], s[0], v[1], s[1], alpha=alpha, out_dtype=out_dtype)
    return nvfp4.grouped_gemm((q, sq, ws.values, ws.scales), offsets=ops.offsets, alpha=alpha, out_dtype=out_dtype)


def _nvfp4_w4a4(ops, i):
    ws, x = ops.sets[i], ops.x
    if ops.case.op == "linear":
        lin = nvt.Linear(
            ws.values, ws.scales, ws.glob, input_scale=ops.x_global, out_dtype=ops.dtype, mode="w4a4"
        ).to(x.device)
        return lambda: lin(x)

    if not (W4A4_ON_W4A16 and x.is_cuda):

        def call():
            q, sq, _ = nvfp4.quantize(x, ops.x_global)
            return _w4a4_gemm(ops, ws, q, sq)

        return call
    # As the MoE layer runs W4A4 on CUDA: the activations' quantization written back as 16-bit
    # numbers, then the W4A16 GEMM on the weights packed once per set, alpha = both global scales.
    alpha, out_dtype, v, s = ops.x_global * ws.glob, ops.dtype, ws.values, ws.scales
    qdt = torch.float16 if x.dtype == torch.float16 else torch.bfloat16
    if ops.case.op == "dual":
        p = nvfp4.pack(v[0], s[0], b2=v[1], sfb2=s[1], dtype=qdt)

        def dual():
            q = torch.ops.nvfp4.quantize_dequant(x, ops.x_global)[0]
            return nvfp4.dual_gemm(q, None, v[0], s[0], v[1], s[1], alpha=alpha, out_dtype=out_dtype, packed=p)

        return dual
    p = nvfp4.pack(v, s, dtype=qdt)

    def moe():
        q = torch.ops.nvfp4.quantize_dequant(x, ops.x_global)[0]
        return nvfp4.grouped_gemm((q, None, v, s), offsets=ops.offsets, alpha=alpha, out_dtype=out_dtype, packed=p)

    return moe


def _nvfp4_w4a4_kernel(ops, i):
    q, sq = ops.x_q
    ws = ops.sets[i]
    return lambda: _w4a4_gemm(ops, ws, q, sq)


def _torch_peer(ops, i):
    c, w, x = ops.case, ops.bf16_sets[i], ops.x
    if c.op == "linear":
        return lambda: F.linear(x, w)
    if c.op == "dual":
        wcat = w.reshape(2 * c.n, c.k)

        def dual():
            y = F.linear(x, wcat)
            return F.silu(y[:, : c.n]) * y[:, c.n :]

        return dual
    wt = w.transpose(-2, -1)  # [E, K, N], K-major per expert: the layout _grouped_mm takes
    return lambda: torch._grouped_mm(x, wt, offs=ops.offsets)


def _humming_layers(ops):
    c = ops.case
    layers = []
    for ws in ops.sets:
        if c.op == "dual":
            v, s = ws.values.reshape(2 * c.n, -1), ws.scales.reshape(2 * c.n, -1)
            layers.append(humming_peer.layer(v, s, ws.glob, ops.dtype))
        else:
            experts = c.experts if c.op == "moe" else None
            layers.append(humming_peer.layer(ws.values, ws.scales, ws.glob, ops.dtype, experts))
    return layers


def _humming(ops, tuning):
    c = ops.case
    layers = _humming_layers(ops)
    if c.op == "linear":
        return lambda i: humming_peer.dense_call(layers[i], ops.x, tuning)
    if c.op == "dual":
        return lambda i: humming_peer.dual_call(layers[i], ops.x, c.n, tuning)
    return lambda i: humming_peer.moe_call(layers[i], ops.x, ops.layout, tuning)


def build(ops, humming=True, torch_peer=True, humming_tuning=None, humming_error=None):
    """Every implementation of the case (those that fail to build carry their error).
    ``humming_tuning``: the kernel configuration to pass Humming (None: its default path);
    ``humming_error``: why Humming cannot run this case (its prewarm failed)."""
    c = ops.case
    dtype = DTYPE_NAMES[ops.dtype]
    dual = c.op == "dual"
    impls = [
        Impl(NVFP4_W4A16, "w4a16", nvfp4_profile(dtype, c.k), lambda i: _nvfp4_w4a16(ops, i)),
        Impl(NVFP4_W4A4, "w4a4", nvfp4_profile(dtype, c.k), lambda i: _nvfp4_w4a4(ops, i)),
        Impl(NVFP4_W4A4_KERNEL, "w4a4", nvfp4_profile(dtype, c.k), lambda i: _nvfp4_w4a4_kernel(ops, i)),
    ]
    hum = Impl(HUMMING, "w4a16", peer_profile(dtype, c.k, dual))
    if not humming:
        hum.error = "humming-kernels not importable"
    elif humming_error:
        hum.error = humming_error
    else:
        try:
            hum.make = _humming(ops, humming_tuning)
        except Exception as exc:  # noqa: BLE001 (the peer's failure is the row's record)
            hum.error = f"building HummingLayer: {_err(exc)}"
    impls.append(hum)
    peer = Impl(TORCH, "bf16", peer_profile(dtype, c.k, dual))
    if torch_peer:
        peer.make = lambda i: _torch_peer(ops, i)
    else:
        peer.error = "skipped (--no-torch-peer)"
    impls.append(peer)
    return impls


def torch_peer_name(case):
    return "grouped_mm_bf16" if case.op == "moe" else "cublas_bf16"
