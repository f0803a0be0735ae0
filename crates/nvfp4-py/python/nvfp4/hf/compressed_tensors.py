"""compressed-tensors' NVFP4 checkpoints (``quant_method: "compressed-tensors"``, format
``"nvfp4-pack-quantized"``, as llm-compressor writes them) in transformers, on nvfp4's kernels.

How it hooks in. transformers maps ``"compressed-tensors"`` to its own config and quantizer,
which decompress NVFP4 to 16-bit weights. Importing ``nvfp4.hf`` puts two dispatchers in their
place, which take over NVFP4 checkpoints only and hand every other one, unchanged, to the classes
that were registered before (transformers' own):

- ``CompressedTensorsNVFP4Config.from_dict`` reads the checkpoint's ``quantization_config``: if
  no config group has NVFP4 weights (4-bit float in groups of 16) and none is stored
  ``nvfp4-pack-quantized`` (FP8, INT4/INT8 pack-quantized, MXFP4, dense, ...), it returns what
  transformers' ``CompressedTensorsConfig.from_dict`` returns (which, as before, needs the
  ``compressed-tensors`` package); otherwise it returns itself, and a checkpoint that mixes NVFP4
  with anything nvfp4 does not run (another scheme in another group, output or KV-cache
  quantization, an asymmetric or static-local scale, a format other than the packed one,
  transforms, sparsity) is a ``CheckpointError`` listing every such entry: nvfp4 does not load
  half a model, and does not silently leave it to a dequantizing path either.
- ``CompressedTensorsNVFP4Quantizer`` builds transformers' own quantizer for any other config,
  and is ``NVFP4Quantizer`` (the ModelOpt path's loader) for its own, with compressed-tensors'
  tensor names and scale direction (``checkpoint.COMPRESSED_TENSORS``) and its ``targets`` /
  ``ignore`` matching.

Loading needs only transformers, not the ``compressed-tensors`` package. The mode is a loading
option, as for ModelOpt: ``quantization_config=CompressedTensorsNVFP4Config(mode="w4a4")``.
``restore_transformers()`` puts transformers' own classes back (to dequantize a checkpoint with
them, e.g. for fine-tuning).

The format, as compressed-tensors 0.20.0 defines it (``compressors/nvfp4``,
``quantization/lifecycle/forward_helpers.py``, ``quantization/utils/helpers.py``,
``quantization/quant_scheme.py``; the ModelOpt converter ``entrypoints/convert/converters/
modelopt_nvfp4.py`` does the reverse of this mapping), and what this module relies on:

- config: ``format: "nvfp4-pack-quantized"`` (top level, or per group where the top level says
  ``"mixed-precision"``), ``quantization_status: "compressed"``, ``config_groups`` whose
  ``weights`` are ``num_bits: 4, type: "float", strategy: "tensor_group", group_size: 16,
  symmetric: true, dynamic: false`` (scale_dtype float8_e4m3fn) and whose ``input_activations``
  are absent (NVFP4A16, W4A16) or the same but ``dynamic: "local"`` (NVFP4, W4A4: block scales
  computed per call under a calibrated global scale); ``targets`` (class names such as
  ``"Linear"``, exact module names, or ``"re:"`` regexes matched from the name's start) and
  ``ignore`` (likewise) choose the quantized modules.
- tensors, per quantized linear [N, K]: ``weight_packed`` U8 [N, K/2], ``weight_scale`` F8_E4M3
  [N, K/16], ``weight_global_scale`` F32 [1], ``input_global_scale`` F32 [1] (W4A4 only). No
  ``weight_shape`` (unlike INT4 pack-quantized). MoE experts are stored per expert and
  projection (``mlp.experts.E.gate_proj.weight_packed``, ...), as ModelOpt stores them.
- packing: byte j of a row holds elements 2j (low nibble) and 2j+1 (high nibble); a nibble is an
  E2M1 code, bit 3 the sign, bits 0-2 the index into 0, 0.5, 1, 1.5, 2, 3, 4, 6: ModelOpt's
  packing, byte for byte.
- global scale: dequantization divides by it: w = e2m1 * (weight_scale / weight_global_scale)
  (``_dequantize``: ``scale = scale / global_scale``); the activation's block scale is
  e4m3(global * amax / 6) and its values are x / (scale / global) rounded to E2M1, ties to the
  even code (``calculate_qparams``, ``_quantize``; the package's own fake quantization takes
  amax / 6 in the activation's 16-bit type, where nvfp4, as ModelOpt, keeps float32: a block
  scale can then differ by one E4M3 step where that rounding crosses an E4M3 boundary). The
  global scale is the reciprocal of ModelOpt's ``weight_scale_2`` / ``input_scale``, which
  multiply (the package's ModelOpt converter stores ``1 / weight_scale_2``).

The mapping: the checkpoint loads as the ModelOpt checkpoint with ``weight_scale_2 =
f32(1 / weight_global_scale)`` and ``input_scale = f32(1 / input_global_scale)`` (``slots``). The
one rounding this adds: f32(1/g) = (1/g)(1 + e), |e| <= 2^-24, so each layer's output before its
one rounding to 16 bits is within a relative 2^-24 of the exact division's (W4A4: about 3 * 2^-24
for alpha, and the activation's block scales e4m3(amax / 6 / f32(1/g)) can differ from
e4m3(amax / 6 * g) by one E4M3 step where that value sits within 2^-24 of a rounding boundary).
Where g is a power of two, 1/g is exact and so is every operation above: the layer then computes
exactly what dividing by g defines.
"""

import re

import torch
from transformers.quantizers import auto as _auto
from transformers.utils.quantization_config import QuantizationConfigMixin

from ..moe import MODES
from .checkpoint import COMPRESSED_TENSORS
from .errors import CheckpointError
from .quantizer import NVFP4Quantizer

QUANT_METHOD = "compressed-tensors"
FORMAT = "nvfp4-pack-quantized"
_E4M3_NAMES = (None, "torch.float8_e4m3fn", "float8_e4m3fn")
# The experts' per-expert projections, as the checkpoint stores them (each was an nn.Linear).
_EXPERT_PROJS = ("gate_proj", "up_proj", "down_proj")


def _is_nvfp4_args(args):
    """Whether a group's ``weights`` / ``input_activations`` entry is NVFP4-shaped (4-bit float
    in groups of 16), whatever its other options."""
    return bool(args) and args.get("num_bits") == 4 and args.get("type") == "float" and args.get("group_size") == 16


def _args_problems(where, args, dynamic):
    """What in an NVFP4 ``weights`` (``dynamic`` False) or ``input_activations`` (``dynamic``
    "local") entry nvfp4 does not run."""
    want = {
        "num_bits": 4,
        "type": "float",
        "strategy": "tensor_group",
        "group_size": 16,
        "symmetric": True,
        "dynamic": dynamic,
    }
    out = [f"{where}.{k} is {args.get(k)!r}, nvfp4 runs {v!r}" for k, v in want.items() if args.get(k, v) != v]
    if args.get("scale_dtype") not in _E4M3_NAMES:
        out.append(f"{where}.scale_dtype is {args.get('scale_dtype')!r}, nvfp4 runs float8_e4m3fn block scales")
    for k in ("block_structure", "actorder"):
        if args.get(k) is not None:
            out.append(f"{where}.{k} is {args[k]!r}, not part of NVFP4")
    return out


def is_nvfp4(config_dict):
    """Whether a compressed-tensors ``quantization_config`` is this module's to load: some config
    group has NVFP4-shaped weights or is stored ``nvfp4-pack-quantized``."""
    top = config_dict.get("format")
    for group in (config_dict.get("config_groups") or {}).values():
        if isinstance(group, dict) and (_is_nvfp4_args(group.get("weights")) or group.get("format", top) == FORMAT):
            return True
    return top == FORMAT


def _match(name, cls, target):
    """compressed-tensors' matching of one ``targets`` / ``ignore`` entry: ``"re:<regex>"``
    matched from the start of the module name, else the exact module name or the name of a
    module class among ``cls``'s bases."""
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name or any(c.__name__ == target for c in cls.__mro__ if issubclass(c, torch.nn.Module))


class CompressedTensorsNVFP4Config(QuantizationConfigMixin):
    """A compressed-tensors NVFP4 checkpoint's quantization config (see the module docstring for
    the fields read), plus nvfp4's one loading option, ``mode``: ``"w4a16"`` (the default) or
    ``"w4a4"`` (activations quantized with each layer's ``input_global_scale``, as a Blackwell GPU
    serves the checkpoint). Pass it as
    ``from_pretrained(path, quantization_config=CompressedTensorsNVFP4Config(mode="w4a4"))``:
    the checkpoint's own config is read as usual and only ``mode`` is taken from the one passed.
    A config nvfp4 cannot run raises ``CheckpointError`` listing every unsupported entry."""

    def __init__(
        self,
        config_groups=None,
        format=FORMAT,
        quantization_status="compressed",
        ignore=None,
        kv_cache_scheme=None,
        mode="w4a16",
        **kwargs,
    ):
        self.quant_method = QUANT_METHOD
        self.config_groups = config_groups or {}
        self.format = format
        self.quantization_status = quantization_status
        self.ignore = list(ignore or [])
        self.kv_cache_scheme = kv_cache_scheme
        self.mode = mode
        # Kept as written, for the model's config; those that change the numbers are checked.
        self.extra = {k: v for k, v in kwargs.items() if k != "quant_method"}
        self.post_init()

    @classmethod
    def from_dict(cls, config_dict, return_unused_kwargs=False, **kwargs):
        """The checkpoint's config: this class's for NVFP4 (``is_nvfp4``), else whatever the
        classes registered before it make of it (transformers' ``CompressedTensorsConfig``)."""
        config_dict = config_dict.get("quantization_config", config_dict)
        if not is_nvfp4(config_dict):
            return _fallback[0].from_dict(config_dict, return_unused_kwargs=return_unused_kwargs, **kwargs)
        return super().from_dict(config_dict, return_unused_kwargs=return_unused_kwargs, **kwargs)

    def post_init(self):
        if self.mode not in MODES:
            raise ValueError(f'mode must be "w4a16" or "w4a4", got {self.mode!r}')
        problems = []
        if self.config_groups and self.quantization_status != "compressed":
            problems.append(
                f"quantization_status is {self.quantization_status!r}: the weights are not stored packed "
                "(nvfp4 loads 'compressed' checkpoints)"
            )
        if self.kv_cache_scheme is not None:
            problems.append("kv_cache_scheme is set: nvfp4 does not quantize the KV cache")
        for key in ("transform_config", "sparsity_config"):
            if self.extra.get(key):
                problems.append(f"{key} is set: nvfp4 runs plain NVFP4 layers only")
        for gname, group in self.config_groups.items():
            where = f"config_groups.{gname}"
            if not isinstance(group, dict):
                problems.append(f"{where} is {group!r}, not a scheme")
                continue
            fmt = group.get("format") or self.format
            if fmt != FORMAT:
                problems.append(f"{where} is stored {fmt!r}, nvfp4 loads {FORMAT!r}")
            if not group.get("targets"):
                problems.append(f"{where} has no targets")
            weights = group.get("weights")
            if not weights:
                problems.append(f"{where} quantizes no weights")
            else:
                problems += _args_problems(f"{where}.weights", weights, False)
            inputs = group.get("input_activations")
            if inputs:
                problems += _args_problems(f"{where}.input_activations", inputs, "local")
            if group.get("output_activations"):
                problems.append(f"{where}.output_activations is set: nvfp4 does not quantize outputs")
        if problems:
            shown = "\n  ".join(problems[:12])
            more = f"\n  ... and {len(problems) - 12} more" if len(problems) > 12 else ""
            raise CheckpointError(
                f"quantization_config (compressed-tensors, NVFP4): {len(problems)} entr{'y' if len(problems) == 1 else 'ies'} "
                f"nvfp4 cannot run:\n  {shown}{more}\n(nvfp4.hf.compressed_tensors.restore_transformers() hands "
                "compressed-tensors checkpoints back to transformers' own quantizer)"
            )

    def get_loading_attributes(self):
        """What a config passed to ``from_pretrained`` changes in the checkpoint's."""
        return {"mode": self.mode}

    def quantizes(self, name, cls):
        """Whether the module ``name`` of class ``cls`` is quantized: some group's ``targets``
        match it and no ``ignore`` entry does (compressed-tensors' rule)."""
        targets = [t for g in self.config_groups.values() for t in g.get("targets") or []]
        return any(_match(name, cls, t) for t in targets) and not any(_match(name, cls, i) for i in self.ignore)


class CompressedTensorsNVFP4Quantizer(NVFP4Quantizer):
    """The quantizer registered for ``"compressed-tensors"``: for a ``CompressedTensorsNVFP4Config``
    the NVFP4 loader with compressed-tensors' names and reciprocal global scales; for any other
    config, the quantizer registered before (transformers' own), which construction returns
    instead."""

    names = COMPRESSED_TENSORS
    producer = "compressed-tensors"
    left_out = "not quantized by the config's targets / ignore"

    def __new__(cls, quantization_config, *args, **kwargs):
        if not isinstance(quantization_config, CompressedTensorsNVFP4Config):
            return _fallback[1](quantization_config, *args, **kwargs)
        return super().__new__(cls)

    def _leaves(self, name, module, experts):
        cfg = self.quantization_config
        if not experts:
            return not cfg.quantizes(name, type(module))
        # Fused experts: the checkpoint's modules are each expert's projections, nn.Linear each.
        count = module.gate_up_proj.shape[0]
        picks = {(e, p): cfg.quantizes(f"{name}.{e}.{p}", torch.nn.Linear) for e in range(count) for p in _EXPERT_PROJS}
        if len(set(picks.values())) > 1:
            some = [f"{name}.{e}.{p}" for (e, p), q in picks.items() if not q][:4]
            raise CheckpointError(
                f"{name}: the config quantizes some experts' projections but not others ({', '.join(some)}, ...); "
                "nvfp4.torch.MoE runs all of a layer's experts in NVFP4"
            )
        return not next(iter(picks.values()))

    def _label(self):
        return f"{QUANT_METHOD} {self.quantization_config.format}"


# (config class, quantizer class) registered for "compressed-tensors" before this module.
_fallback = [None, None]


def register():
    """Puts the dispatchers in place for ``"compressed-tensors"`` (once), remembering what was
    registered before (transformers' own) to hand other checkpoints to."""
    cfgs, quants = _auto.AUTO_QUANTIZATION_CONFIG_MAPPING, _auto.AUTO_QUANTIZER_MAPPING
    if cfgs.get(QUANT_METHOD) is not CompressedTensorsNVFP4Config:
        _fallback[:] = [cfgs[QUANT_METHOD], quants[QUANT_METHOD]]
        cfgs[QUANT_METHOD] = CompressedTensorsNVFP4Config
        quants[QUANT_METHOD] = CompressedTensorsNVFP4Quantizer
    if CompressedTensorsNVFP4Config not in _auto.LOADING_ATTRIBUTES_CONFIG_TYPES:
        _auto.LOADING_ATTRIBUTES_CONFIG_TYPES = (*_auto.LOADING_ATTRIBUTES_CONFIG_TYPES, CompressedTensorsNVFP4Config)


def restore_transformers():
    """Gives ``"compressed-tensors"`` back to the classes registered before ``register`` (every
    such checkpoint, NVFP4 included, then loads the way transformers loads it); ``register()``
    takes it over again."""
    if _auto.AUTO_QUANTIZATION_CONFIG_MAPPING.get(QUANT_METHOD) is CompressedTensorsNVFP4Config:
        _auto.AUTO_QUANTIZATION_CONFIG_MAPPING[QUANT_METHOD] = _fallback[0]
        _auto.AUTO_QUANTIZER_MAPPING[QUANT_METHOD] = _fallback[1]
