"""``NVFP4Quantizer``, the transformers ``HfQuantizer`` that loads pre-quantized NVFP4 checkpoints
onto nvfp4's modules, and ``ModelOptQuantizer``, its form for ``quant_method: "modelopt"``
(``compressed_tensors.CompressedTensorsNVFP4Quantizer`` is the other). ``from_pretrained`` calls
it around the weight loading:

1. before: reads the checkpoint's safetensors headers, decides which layers are quantized (every
   ``nn.Linear`` and every fused experts module the config does not leave out), checks
   each one's tensors (names, dtypes, shapes, in the convention ``names``; a ``CheckpointError``
   lists what is missing or wrong), and puts a loading shell (``slots``) with the checkpoint's
   names in its place;
2. loading: transformers fills the shells from the checkpoint, tensor by tensor, on the
   ``device_map``'s device; the model's own conversions that would fuse per-expert checkpoint
   tensors into 3-D parameters are dropped for the experts replaced here;
3. after: each shell becomes ``nvfp4.torch.Linear`` or ``nvfp4.torch.MoE`` in the mode the
   config's ``mode`` names.

Modules left as they are: the excluded ones (``lm_head``, embeddings, MoE routers, ...), and a
linear layer the export stored unquantized although the config does not list it (logged).
"""

import torch
from transformers.quantizers.base import HfQuantizer
from transformers.utils import logging

from .checkpoint import MODELOPT, Header, raise_problems
from .errors import CheckpointError
from .slots import ExpertsSlot, LinearSlot

logger = logging.get_logger(__name__)

_HALF = (torch.float16, torch.bfloat16)
# The 3-D parameters of transformers' fused experts modules ([E, 2I, H] and [E, H, I]).
_EXPERT_PARAMS = ("gate_up_proj", "down_proj")


def _fused_experts(module):
    """Whether ``module`` is a transformers fused experts module this loader maps: 3-D
    ``gate_up_proj`` [E, 2I, H] ([gate; up], not interleaved, not transposed, no bias) and
    ``down_proj`` [E, H, I]."""
    gu, dn = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(gu, torch.nn.Parameter) or not isinstance(dn, torch.nn.Parameter):
        return False
    return gu.dim() == 3 and dn.dim() == 3


def _experts_layout_problem(name, module, config):
    if getattr(module, "is_transposed", False):
        return f"{name}: experts stored transposed ([E, H, 2I]) are not mapped"
    if not getattr(module, "is_concatenated", True):
        return f"{name}: experts with interleaved gate/up rows are not mapped"
    if getattr(module, "has_bias", False):
        return f"{name}: experts with biases are not mapped"
    if not getattr(module, "has_gate", True):
        return f"{name}: experts without a gate projection are not mapped"
    act = getattr(config, "hidden_act", None)
    if act not in ("silu", "swish"):
        return f"{name}: experts with activation {act!r}; nvfp4.torch.MoE computes SwiGLU (silu)"
    e, n2, h = module.gate_up_proj.shape
    if module.down_proj.shape != (e, h, n2 // 2):
        return f"{name}: down_proj {list(module.down_proj.shape)} does not match gate_up_proj {[e, n2, h]}"
    return None


class NVFP4Quantizer(HfQuantizer):
    """Loads NVFP4 checkpoints onto nvfp4's modules (see the module docstring). Pre-quantized
    checkpoints only: it does not quantize a dense model. A form for one checkpoint convention
    sets ``names`` (its tensor names, ``checkpoint.Names``), ``producer`` and ``left_out`` (for
    messages) and,
    where its config chooses the quantized modules otherwise than by an ignore list,
    ``_leaves``."""

    requires_calibration = True
    names = MODELOPT
    producer = "ModelOpt"
    left_out = "excluded by the config's ignore list"

    def __init__(self, quantization_config, **kwargs):
        super().__init__(quantization_config, **kwargs)
        self._replaced = {}  # module name -> "linear" | "experts"

    def validate_environment(self, *args, **kwargs):
        if not self.pre_quantized:
            raise CheckpointError(f"nvfp4.hf loads {self.producer} NVFP4 checkpoints; it does not quantize a dense model")

    def update_dtype(self, dtype):
        if dtype not in _HALF:
            raise ValueError(
                f"nvfp4's NVFP4 layers compute with float16 or bfloat16 activations, got dtype {dtype}: "
                "load with dtype=torch.bfloat16 (or 'auto', the checkpoint's own)"
            )
        self._dtype = dtype
        return dtype

    def _leaves(self, name, module, experts):
        """Whether the config leaves the module ``name`` unquantized (``experts``: a fused experts
        module, whose checkpoint tensors are per expert and projection)."""
        return self.quantization_config.is_excluded(name)

    def _label(self):
        cfg = self.quantization_config
        return f"{cfg.quant_method} {cfg.quant_algo}"

    def _process_model_before_weight_loading(self, model, checkpoint_files=None, **kwargs):
        cfg = self.quantization_config
        names = self.names
        text_config = model.config.get_text_config()
        header = Header.read(checkpoint_files) if checkpoint_files else None
        base = getattr(model, "base_model_prefix", "")
        problems = []
        plan = []
        for name, module in model.named_modules():
            if any(name.startswith(p + ".") for p, _ in plan):
                continue  # inside a module already planned
            if isinstance(module, torch.nn.Linear):
                if self._leaves(name, module, False):
                    if header is not None and header.find(f"{name}.{names.block_scale}", base):
                        problems.append(f"{name}: {self.left_out} but stored quantized")
                    continue
                if header is not None and header.is_dense(name, base, names):
                    logger.warning(f"nvfp4: {name} is stored unquantized in the checkpoint; it stays a dense Linear")
                    continue
                n, k = module.out_features, module.in_features
                bias = module.bias is not None
                inp = True
                if header is not None:
                    inp = header.linear(name, n, k, bias, base, problems, names).has_input_scale
                plan.append((name, LinearSlot(k, n, module.bias.dtype if bias else None, inp, names)))
            elif _fused_experts(module):
                if self._leaves(name, module, True):
                    if header is not None and header.find(f"{name}.0.gate_proj.{names.block_scale}", base):
                        problems.append(f"{name}: {self.left_out} but stored quantized")
                    continue
                problem = _experts_layout_problem(name, module, text_config)
                if problem:
                    problems.append(problem)
                    continue
                e, n2, h = module.gate_up_proj.shape
                inter = n2 // 2
                inp = True
                if header is not None:
                    for x in range(e):
                        for proj, n, k in (("gate_proj", inter, h), ("up_proj", inter, h), ("down_proj", h, inter)):
                            entry = header.linear(f"{name}.{x}.{proj}", n, k, False, base, problems, names)
                            inp &= entry.has_input_scale
                plan.append((name, ExpertsSlot(e, h, inter, inp, names)))
        raise_problems(problems, f"{model.__class__.__name__} ({self._label()})")
        if not plan:
            raise CheckpointError(f"{model.__class__.__name__}: no quantized layer found (every module excluded?)")
        for name, slot in plan:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, slot)
            self._replaced[name] = "experts" if isinstance(slot, ExpertsSlot) else "linear"

    def update_weight_conversions(self, weight_conversions):
        """Drops the model's conversions into the 3-D parameters of the experts replaced here: their
        checkpoint tensors load one per expert and projection, as stored."""
        gone = [f"{n}.{p}" for n, kind in self._replaced.items() if kind == "experts" for p in _EXPERT_PARAMS]

        def targets_replaced(conv):
            if type(conv).__name__ != "WeightConverter":
                return False
            targets = conv.target_patterns if isinstance(conv.target_patterns, list) else [conv.target_patterns]
            return any(key.endswith(t.strip("^$")) for t in targets for key in gone)

        kept = [c for c in weight_conversions if not targets_replaced(c)]
        return super().update_weight_conversions(kept)

    def _process_model_after_weight_loading(self, model, **kwargs):
        mode = self.quantization_config.mode
        out_dtype = getattr(self, "_dtype", None)
        for name, kind in self._replaced.items():
            parent, _, child = name.rpartition(".")
            holder = model.get_submodule(parent) if parent else model
            slot = getattr(holder, child)
            if kind == "linear":
                setattr(holder, child, slot.to_linear(name, mode, out_dtype))
            else:
                setattr(holder, child, slot.to_moe(name, mode, out_dtype))
        return model

    @property
    def is_serializable(self):
        return False

    @property
    def is_trainable(self):
        return False

    @property
    def is_compileable(self):
        return True


class ModelOptQuantizer(NVFP4Quantizer):
    """The quantizer of ``quant_method: "modelopt"`` NVFP4 exports (ModelOpt's tensor names,
    global scales that multiply, modules left out by the config's ``ignore`` list)."""
