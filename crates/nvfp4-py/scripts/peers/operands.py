"""A case's operands on the device (torch): 16-bit activations, NVFP4 weight sets quantized from
standard normal weights in the ModelOpt convention by ``nvfp4.quantize`` (one global scale per
weight, shared by a dual GEMM's two halves and by a MoE layer's experts), the BF16 dequantized
copies the torch peers read, and for MoE the routed rows sorted by expert with their offsets.
"""

from dataclasses import dataclass, field

import torch

import nvfp4
from peers.cases import case_routing
from peers.reference import decode

E2M1_MAX, E4M3_MAX = 6.0, 448.0


@dataclass
class WeightSet:
    """One NVFP4 weight: values uint8 [.., rows, K/2], plain scales float8_e4m3fn [.., rows, K/16]
    and the global scale (dequantized weight = e2m1 * e4m3 * glob)."""

    values: torch.Tensor
    scales: torch.Tensor
    glob: float


@dataclass
class Operands:
    case: object
    dtype: torch.dtype
    x: torch.Tensor  # [M, K] (dense) or the routed rows [rows, K] sorted by expert (MoE)
    x_global: float  # static activation global scale (a ModelOpt checkpoint's input_scale)
    x_q: tuple  # x quantized with x_global: (values, scales), what the W4A4 kernel reads
    sets: list  # WeightSet per rotation set; weights [N', K] (dense), [2, n, K] (dual), [E, N, K] (MoE)
    routing: object = None
    offsets: torch.Tensor = None  # int32 [E] end rows (nvfp4, torch._grouped_mm)
    layout: torch.Tensor = None  # int64 [E + 1] with a leading 0 (Humming's expert_layout)
    bf16_sets: list = field(default_factory=list)  # torch peer's weights, dequantized in dtype


def quantize_weight(shape, dtype, device, gen):
    w = torch.randn(shape, dtype=dtype, device=device, generator=gen)
    values, scales, glob = nvfp4.quantize(w)
    return WeightSet(values, scales.view(torch.float8_e4m3fn), float(glob.reshape(-1)[0].item()))


def dequantize_16(ws, dtype):
    """The weight as a serving stack with memory to spare keeps it: e2m1 * e4m3 * global, rounded
    once to ``dtype`` (decoded a leading index at a time to bound the float32 temporaries)."""
    v, s = ws.values, ws.scales
    out = torch.empty(v.shape[:-1] + (2 * v.shape[-1],), dtype=dtype, device=v.device)
    if v.dim() == 2:
        step = max(1, (1 << 26) // (2 * v.shape[-1]))
        for r0 in range(0, v.shape[0], step):
            out[r0 : r0 + step] = (decode(v[r0 : r0 + step], s[r0 : r0 + step], torch.float32) * ws.glob).to(dtype)
    else:
        for i in range(v.shape[0]):
            out[i] = dequantize_16(WeightSet(v[i], s[i], ws.glob), dtype)
    return out


def weight_shape(case):
    if case.op == "dual":
        return (2, case.n, case.k)
    if case.op == "moe":
        return (case.experts, case.n, case.k)
    return (case.n, case.k)


def activation_global(x):
    """ModelOpt's activation global scale, calibrated once on this input: amax / (6 * 448)."""
    return max(float(x.abs().max().float().item()) / (E2M1_MAX * E4M3_MAX), 2.0**-126)


def build(case, sets, dtype, device, seed, peers=True):
    """The case's operands with ``sets`` rotation weight sets (and their BF16 copies for the torch
    peer when ``peers``)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    routing = offsets = layout = None
    if case.op == "moe":
        routing = case_routing(case, seed)
        tokens = torch.randn((case.tokens, case.k), dtype=dtype, device=device, generator=gen)
        x = tokens[torch.from_numpy(routing.token).to(device)].contiguous()
        offsets = torch.from_numpy(routing.offsets).to(device=device, dtype=torch.int32)
        layout = torch.from_numpy(routing.layout).to(device=device, dtype=torch.int64)
    else:
        x = torch.randn((case.m, case.k), dtype=dtype, device=device, generator=gen)
    x_global = activation_global(x) if x.numel() else 1.0
    qv, qs, _ = nvfp4.quantize(x, x_global)
    ws = [quantize_weight(weight_shape(case), dtype, device, gen) for _ in range(sets)]
    ops = Operands(case, dtype, x, x_global, (qv, qs.view(torch.float8_e4m3fn)), ws, routing, offsets, layout)
    if peers:
        ops.bf16_sets = [dequantize_16(w, dtype) for w in ws]
    return ops
