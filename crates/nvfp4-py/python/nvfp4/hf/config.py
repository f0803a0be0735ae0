"""``ModelOptConfig``: the ``quantization_config`` of an NVIDIA ModelOpt NVFP4 export
(``quant_method: "modelopt"``, ``quant_algo: "NVFP4"``), as transformers reads it from the
checkpoint's ``config.json``, plus nvfp4's one loading option, ``mode``.

Both forms ModelOpt writes are read: the newer one (``config_groups``, ``ignore``) and the older
flat one of ``hf_quant_config.json`` (``group_size``, ``exclude_modules``).
"""

import fnmatch
import re

from transformers.utils.quantization_config import QuantizationConfigMixin

from ..moe import MODES
from .errors import CheckpointError

QUANT_METHOD = "modelopt"


def _check_group(name, spec):
    """A config group's ``weights`` / ``input_activations`` entry must describe NVFP4: 4-bit
    floats in groups of 16."""
    if spec is None:
        return
    bits, kind, group = spec.get("num_bits", 4), spec.get("type", "float"), spec.get("group_size", 16)
    if (bits, kind, group) != (4, "float", 16):
        raise CheckpointError(
            f"quantization_config: {name} is {bits}-bit {kind} in groups of {group}; nvfp4 loads NVFP4 "
            "(4-bit float, groups of 16)"
        )


class ModelOptConfig(QuantizationConfigMixin):
    """A ModelOpt NVFP4 checkpoint's quantization config.

    - ``quant_algo``: must be ``"NVFP4"`` (anything else, such as ``"FP8"`` or ``"NVFP4_AWQ"``,
      is a ``CheckpointError``);
    - ``ignore`` / ``exclude_modules``: the modules left unquantized, by name, as a glob
      (``model.layers.*.mlp.gate``) or as ``re:<regex>``; a name also excludes what it holds;
    - ``mode``: how nvfp4 runs the quantized layers, a loading option (not in checkpoints):
      ``"w4a16"`` (the default; 16-bit activations times the NVFP4 weights) or ``"w4a4"``
      (activations quantized with each layer's calibrated ``input_scale``, as a Blackwell GPU
      serves the checkpoint). Pass it as
      ``from_pretrained(path, quantization_config=ModelOptConfig(mode="w4a4"))``: the checkpoint's
      own config is read as usual and only ``mode`` is taken from the one passed.
    """

    def __init__(
        self,
        quant_algo="NVFP4",
        ignore=None,
        exclude_modules=None,
        config_groups=None,
        group_size=None,
        mode="w4a16",
        kv_cache_quant_algo=None,
        producer=None,
        **kwargs,
    ):
        self.quant_method = QUANT_METHOD
        self.quant_algo = quant_algo
        self.ignore = list(ignore or []) + list(exclude_modules or [])
        self.config_groups = config_groups
        self.group_size = group_size
        self.mode = mode
        self.kv_cache_quant_algo = kv_cache_quant_algo
        self.producer = producer
        self.post_init()

    def post_init(self):
        if self.quant_algo != "NVFP4":
            raise CheckpointError(
                f"quantization_config: quant_algo {self.quant_algo!r} is not supported; nvfp4 loads ModelOpt "
                "exports with quant_algo 'NVFP4'"
            )
        if self.mode not in MODES:
            raise ValueError(f'mode must be "w4a16" or "w4a4", got {self.mode!r}')
        if self.group_size not in (None, 16):
            raise CheckpointError(f"quantization_config: group_size {self.group_size}; NVFP4 groups are 16")
        for gname, group in (self.config_groups or {}).items():
            _check_group(f"config_groups.{gname}.weights", group.get("weights"))
            _check_group(f"config_groups.{gname}.input_activations", group.get("input_activations"))

    def get_loading_attributes(self):
        """What a config passed to ``from_pretrained`` changes in the checkpoint's."""
        return {"mode": self.mode}

    def is_excluded(self, name):
        """Whether the module ``name`` (or a module holding it) is left unquantized."""
        parts = name.split(".")
        prefixes = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
        for pattern in self.ignore:
            if pattern.startswith("re:"):
                rx = re.compile(pattern[3:])
                if any(rx.fullmatch(p) for p in prefixes):
                    return True
            elif any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
                return True
        return False
