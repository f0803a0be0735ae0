"""NVFP4 checkpoints in Hugging Face transformers, on nvfp4's kernels: NVIDIA ModelOpt exports
and compressed-tensors' ``nvfp4-pack-quantized`` checkpoints.

Importing this module registers the ``quant_method`` ``"modelopt"`` with transformers (its
quantization config and its quantizer), so that ``from_pretrained`` of a ModelOpt NVFP4 export
puts ``nvfp4.torch.Linear`` in place of every quantized linear layer and ``nvfp4.torch.MoE`` in
place of every fused experts module, holding the checkpoint's packed NVFP4 bytes and scales as
they are (no dequantized copy)::

    import nvfp4.hf
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, device_map="cuda")            # W4A16
    model = AutoModelForCausalLM.from_pretrained(                                    # W4A4
        path, device_map="cuda", quantization_config=nvfp4.hf.ModelOptConfig(mode="w4a4"))

The checkpoint's ``ignore`` (or ``exclude_modules``) list keeps its modules as they are. A
checkpoint nvfp4 cannot load (another ``quant_algo``, missing tensors, wrong shapes, an experts
layout it does not map) raises ``CheckpointError`` before any weight is read.

It also takes over ``quant_method: "compressed-tensors"`` for NVFP4 checkpoints only
(``compressed_tensors``): transformers' own config and quantizer for that name stay in charge of
every other compressed-tensors checkpoint (FP8, INT4, ...), which load exactly as before; an NVFP4
one loads like a ModelOpt export, its global scales (which divide) mapped to the multipliers
nvfp4 takes, with ``quantization_config=nvfp4.hf.CompressedTensorsNVFP4Config(mode="w4a4")`` for
W4A4; one that mixes NVFP4 with schemes nvfp4 does not run raises ``CheckpointError``.
"""

from transformers.quantizers import auto as _auto

from . import compressed_tensors
from .compressed_tensors import CompressedTensorsNVFP4Config, CompressedTensorsNVFP4Quantizer
from .config import QUANT_METHOD, ModelOptConfig
from .errors import CheckpointError
from .quantizer import ModelOptQuantizer

__all__ = [
    "ModelOptConfig",
    "ModelOptQuantizer",
    "CompressedTensorsNVFP4Config",
    "CompressedTensorsNVFP4Quantizer",
    "CheckpointError",
]


def _register():
    """Registers the config and the quantizer under ``"modelopt"`` (once; a name another package
    already took is left to it, with an error saying so)."""
    have_config = _auto.AUTO_QUANTIZATION_CONFIG_MAPPING.get(QUANT_METHOD)
    have_quantizer = _auto.AUTO_QUANTIZER_MAPPING.get(QUANT_METHOD)
    if have_config is None and have_quantizer is None:
        _auto.register_quantization_config(QUANT_METHOD)(ModelOptConfig)
        _auto.register_quantizer(QUANT_METHOD)(ModelOptQuantizer)
    elif (have_config, have_quantizer) != (ModelOptConfig, ModelOptQuantizer):
        raise ImportError(
            f"transformers already has a quantizer for quant_method {QUANT_METHOD!r} "
            f"({getattr(have_quantizer, '__module__', None)}); nvfp4.hf does not replace it"
        )
    # A config passed to from_pretrained changes a checkpoint's only through its "loading
    # attributes" (here: mode), which transformers copies for the config types of this tuple.
    if ModelOptConfig not in _auto.LOADING_ATTRIBUTES_CONFIG_TYPES:
        _auto.LOADING_ATTRIBUTES_CONFIG_TYPES = (*_auto.LOADING_ATTRIBUTES_CONFIG_TYPES, ModelOptConfig)


_register()
compressed_tensors.register()
