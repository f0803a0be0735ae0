"""Loading shells: modules whose buffers carry the checkpoint's own names, dtypes and shapes, put
in place of the model's quantized layers before transformers loads the weights (so every
checkpoint tensor lands where its name says, with no conversion), then turned into nvfp4's
modules once loaded: ``LinearSlot`` into ``nvfp4.torch.Linear``, ``ExpertsSlot`` (one slot per
expert and projection, as the exports store them) into ``nvfp4.torch.MoE`` with the experts
stacked. Only packed NVFP4 bytes and scales are ever held; nothing is dequantized.

The tensor names are those of the checkpoint's convention (``checkpoint.Names``: ModelOpt or
compressed-tensors). nvfp4's layers take ModelOpt's semantics, global scales that multiply; a
convention storing reciprocals (compressed-tensors: dequantization divides by
``weight_global_scale``) is mapped by taking f32(1 / stored value) as the multiplier, rounded
once to float32 as ModelOpt stores its own: the layer is then exactly the ModelOpt layer with
``weight_scale_2 = f32(1 / weight_global_scale)`` and ``input_scale = f32(1 / input_global_scale)``.
That rounding is the mapping's one departure from dividing: a relative 2^-24 at most, and none
where the stored value is a power of two.
"""

import math

import torch

from ..moe import MoE
from ..torch import Linear
from .checkpoint import MODELOPT
from .errors import CheckpointError


def _scalar(t, name):
    """A checkpoint's F32 scalar ([] or [1]) as a float, finite and > 0."""
    v = float(t.reshape(()))
    if not (math.isfinite(v) and v > 0):
        raise CheckpointError(f"{name}: {v}, a global scale must be finite and > 0")
    return v


def multiplier(t, name, reciprocal):
    """The multiplying global scale a checkpoint's F32 scalar ``t`` stands for: the value itself,
    or, where the convention stores the reciprocal, 1 / value rounded once to float32 (the
    division is exact in float64 before that one rounding, so this is the correctly rounded
    float32 reciprocal)."""
    v = _scalar(t, name)
    if not reciprocal:
        return v
    m = float(torch.tensor(1.0 / v, dtype=torch.float32))
    if not math.isfinite(m):
        raise CheckpointError(f"{name}: {v} is too small, 1 / {v} overflows float32")
    return m


class LinearSlot(torch.nn.Module):
    """The tensors of one NVFP4 linear layer [out_features, in_features], named as in the
    checkpoint (``names``; ModelOpt's below): ``weight`` uint8 [N, K/2], ``weight_scale``
    float8_e4m3fn [N, K/16], ``weight_scale_2`` and ``input_scale`` float32 scalars, ``bias``
    [N] if the layer has one. Made on the meta device: transformers loads each buffer from the
    checkpoint."""

    def __init__(self, in_features, out_features, bias_dtype=None, input_scale=True, names=MODELOPT):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.names = names
        with torch.device("meta"):
            self.register_buffer(names.packed, torch.empty(out_features, in_features // 2, dtype=torch.uint8))
            self.register_buffer(
                names.block_scale, torch.empty(out_features, in_features // 16, dtype=torch.float8_e4m3fn)
            )
            self.register_buffer(names.global_scale, torch.empty((), dtype=torch.float32))
            if input_scale:
                self.register_buffer(names.input_scale, torch.empty((), dtype=torch.float32))
            if bias_dtype is not None:
                self.register_buffer("bias", torch.empty(out_features, dtype=bias_dtype))

    def forward(self, *args, **kwargs):
        raise RuntimeError("LinearSlot holds checkpoint tensors while loading; it is replaced once loaded")

    @property
    def packed(self):
        return self._buffers[self.names.packed]

    @property
    def block_scale(self):
        return self._buffers[self.names.block_scale]

    def global_scale(self, name):
        """The weight's multiplying global scale (ModelOpt's ``weight_scale_2``)."""
        g = self.names.global_scale
        return multiplier(self._buffers[g], f"{name}.{g}", self.names.reciprocal)

    def input_global(self, name):
        """The calibrated activation scale as a multiplier (ModelOpt's ``input_scale``), or None
        where the checkpoint has none."""
        i = self.names.input_scale
        t = self._buffers.get(i)
        return None if t is None else multiplier(t, f"{name}.{i}", self.names.reciprocal)

    def to_linear(self, name, mode, out_dtype):
        """``nvfp4.torch.Linear`` over the loaded tensors (no copy)."""
        return Linear(
            self.packed,
            self.block_scale,
            self.global_scale(name),
            input_scale=self.input_global(name),
            bias=self._buffers.get("bias"),
            out_dtype=out_dtype,
            mode=mode,
        )


class _ExpertSlot(torch.nn.Module):
    def __init__(self, hidden, inter, input_scale, names):
        super().__init__()
        self.gate_proj = LinearSlot(hidden, inter, input_scale=input_scale, names=names)
        self.up_proj = LinearSlot(hidden, inter, input_scale=input_scale, names=names)
        self.down_proj = LinearSlot(inter, hidden, input_scale=input_scale, names=names)


class ExpertsSlot(torch.nn.ModuleList):
    """A fused experts module's checkpoint tensors, one ``LinearSlot`` per expert and projection:
    ``{e}.gate_proj``, ``{e}.up_proj`` [I, H] and ``{e}.down_proj`` [H, I]."""

    def __init__(self, num_experts, hidden, inter, input_scale=True, names=MODELOPT):
        super().__init__(_ExpertSlot(hidden, inter, input_scale, names) for _ in range(num_experts))
        self.hidden_size, self.intermediate_size = hidden, inter
        self.names = names

    def forward(self, *args, **kwargs):
        raise RuntimeError("ExpertsSlot holds checkpoint tensors while loading; it is replaced once loaded")

    def _shared_input_scale(self, name, projs):
        """W4A4 quantizes every expert's rows with one activation scale per GEMM: the checkpoint's
        input scales of ``projs`` must agree across experts (ModelOpt calibrates them so)."""
        inp = self.names.input_scale
        vals = {(p, e): ex.get_submodule(p).input_global(f"{name}.{e}.{p}") for e, ex in enumerate(self) for p in projs}
        if any(v is None for v in vals.values()):
            missing = [f"{name}.{e}.{p}.{inp}" for (p, e), v in vals.items() if v is None]
            raise CheckpointError(f"mode='w4a4' needs every expert's {inp}; missing: {', '.join(missing[:6])}")
        if len(set(vals.values())) != 1:
            raise CheckpointError(
                f"{name}: the experts' {'/'.join(projs)} {inp} differ ({min(vals.values())} .. "
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
                f"{name}.{e}: gate_proj and up_proj have different {self.names.global_scale} ({gate_g[e]} and "
                f"{up_g[e]} as multipliers); the fused gate/up GEMM takes one global scale per expert (ModelOpt "
                "exports share it)"
            )
        down_g = [ex.down_proj.global_scale(f"{name}.{e}.down_proj") for e, ex in enumerate(self)]
        gu_in = dn_in = None
        if mode == "w4a4":
            gu_in = self._shared_input_scale(name, ("gate_proj", "up_proj"))
            dn_in = self._shared_input_scale(name, ("down_proj",))

        def stack(proj, what):
            return torch.stack([getattr(ex.get_submodule(proj), what).view(torch.uint8) for ex in self])

        gate_up = torch.cat([stack("gate_proj", "packed"), stack("up_proj", "packed")], dim=1)
        gate_up_scale = torch.cat([stack("gate_proj", "block_scale"), stack("up_proj", "block_scale")], dim=1)
        return MoE(
            gate_up,
            gate_up_scale,
            gate_g,
            stack("down_proj", "packed"),
            stack("down_proj", "block_scale"),
            down_g,
            gate_up_input_scale=gu_in,
            down_input_scale=dn_in,
            mode=mode,
            out_dtype=out_dtype,
        )
