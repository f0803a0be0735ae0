"""Loading shells: modules whose buffers carry the checkpoint's own names, dtypes and shapes, put
in place of the model's quantized layers before transformers loads the weights (so every
checkpoint tensor lands where its name says, with no conversion), then turned into nvfp4's
modules once loaded: ``LinearSlot`` into ``nvfp4.torch.Linear``, ``ExpertsSlot`` (one slot per
expert and projection, as the export stores them) into ``nvfp4.torch.MoE`` with the experts
stacked. Only packed NVFP4 bytes and scales are ever held; nothing is dequantized.
"""

import math

import torch

from ..moe import MoE
from ..torch import Linear
from .errors import CheckpointError


def _scalar(t, name):
    """A checkpoint's F32 scalar ([] or [1]) as a float, finite and > 0."""
    v = float(t.reshape(()))
    if not (math.isfinite(v) and v > 0):
        raise CheckpointError(f"{name}: {v}, a global scale must be finite and > 0")
    return v


class LinearSlot(torch.nn.Module):
    """The tensors of one NVFP4 linear layer [out_features, in_features], named as in the
    checkpoint: ``weight`` uint8 [N, K/2], ``weight_scale`` float8_e4m3fn [N, K/16],
    ``weight_scale_2`` and ``input_scale`` float32 scalars, ``bias`` [N] if the layer has one.
    Made on the meta device: transformers loads each buffer from the checkpoint."""

    def __init__(self, in_features, out_features, bias_dtype=None, input_scale=True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        with torch.device("meta"):
            self.register_buffer("weight", torch.empty(out_features, in_features // 2, dtype=torch.uint8))
            self.register_buffer(
                "weight_scale", torch.empty(out_features, in_features // 16, dtype=torch.float8_e4m3fn)
            )
            self.register_buffer("weight_scale_2", torch.empty((), dtype=torch.float32))
            if input_scale:
                self.register_buffer("input_scale", torch.empty((), dtype=torch.float32))
            if bias_dtype is not None:
                self.register_buffer("bias", torch.empty(out_features, dtype=bias_dtype))

    def forward(self, *args, **kwargs):
        raise RuntimeError("LinearSlot holds checkpoint tensors while loading; it is replaced once loaded")

    def global_scale(self, name):
        return _scalar(self.weight_scale_2, f"{name}.weight_scale_2")

    def input_global(self, name):
        """The calibrated ``input_scale`` as a float, or None where the checkpoint has none."""
        t = self._buffers.get("input_scale")
        return None if t is None else _scalar(t, f"{name}.input_scale")

    def to_linear(self, name, mode, out_dtype):
        """``nvfp4.torch.Linear`` over the loaded tensors (no copy)."""
        return Linear(
            self.weight,
            self.weight_scale,
            self.global_scale(name),
            input_scale=self.input_global(name),
            bias=self._buffers.get("bias"),
            out_dtype=out_dtype,
            mode=mode,
        )


class _ExpertSlot(torch.nn.Module):
    def __init__(self, hidden, inter, input_scale):
        super().__init__()
        self.gate_proj = LinearSlot(hidden, inter, input_scale=input_scale)
        self.up_proj = LinearSlot(hidden, inter, input_scale=input_scale)
        self.down_proj = LinearSlot(inter, hidden, input_scale=input_scale)


class ExpertsSlot(torch.nn.ModuleList):
    """A fused experts module's checkpoint tensors, one ``LinearSlot`` per expert and projection:
    ``{e}.gate_proj``, ``{e}.up_proj`` [I, H] and ``{e}.down_proj`` [H, I]."""

    def __init__(self, num_experts, hidden, inter, input_scale=True):
        super().__init__(_ExpertSlot(hidden, inter, input_scale) for _ in range(num_experts))
        self.hidden_size, self.intermediate_size = hidden, inter

    def forward(self, *args, **kwargs):
        raise RuntimeError("ExpertsSlot holds checkpoint tensors while loading; it is replaced once loaded")

    def _shared_input_scale(self, name, projs):
        """W4A4 quantizes every expert's rows with one activation scale per GEMM: the checkpoint's
        input scales of ``projs`` must agree across experts (ModelOpt calibrates them so)."""
        vals = {(p, e): ex.get_submodule(p).input_global(f"{name}.{e}.{p}") for e, ex in enumerate(self) for p in projs}
        if any(v is None for v in vals.values()):
            missing = [f"{name}.{e}.{p}.input_scale" for (p, e), v in vals.items() if v is None]
            raise CheckpointError(f"mode='w4a4' needs every expert's input_scale; missing: {', '.join(missing[:6])}")
        if len(set(vals.values())) != 1:
            raise CheckpointError(
                f"{name}: the experts' {'/'.join(projs)} input_scale differ ({min(vals.values())} .. "
                f"{max(vals.values())}); W4A4 needs one activation scale per projection (use mode='w4a16')"
            )
        return next(iter(vals.values()))

    def to_moe(self, name, mode, out_dtype):
        """``nvfp4.torch.MoE`` with the experts stacked ([gate; up] rows per expert): the only copy
        made, of packed bytes and scales; the slots are dropped with this module."""
        gate_g = [ex.gate_proj.global_scale(f"{name}.{e}.gate_proj") for e, ex in enumerate(self)]
        up_g = [ex.up_proj.global_scale(f"{name}.{e}.up_proj") for e, ex in enumerate(self)]
        differ = [e for e, (g, u) in enumerate(zip(gate_g, up_g)) if g != u]
        if differ:
            e = differ[0]
            raise CheckpointError(
                f"{name}.{e}: gate_proj and up_proj have different weight_scale_2 ({gate_g[e]} and {up_g[e]}); "
                "the fused gate/up GEMM takes one global scale per expert (ModelOpt exports share it)"
            )
        down_g = [ex.down_proj.global_scale(f"{name}.{e}.down_proj") for e, ex in enumerate(self)]
        gu_in = dn_in = None
        if mode == "w4a4":
            gu_in = self._shared_input_scale(name, ("gate_proj", "up_proj"))
            dn_in = self._shared_input_scale(name, ("down_proj",))

        def stack(proj, what):
            return torch.stack([getattr(ex.get_submodule(proj), what).view(torch.uint8) for ex in self])

        gate_up = torch.cat([stack("gate_proj", "weight"), stack("up_proj", "weight")], dim=1)
        gate_up_scale = torch.cat([stack("gate_proj", "weight_scale"), stack("up_proj", "weight_scale")], dim=1)
        return MoE(
            gate_up,
            gate_up_scale,
            gate_g,
            stack("down_proj", "weight"),
            stack("down_proj", "weight_scale"),
            down_g,
            gate_up_input_scale=gu_in,
            down_input_scale=dn_in,
            mode=mode,
            out_dtype=out_dtype,
        )
