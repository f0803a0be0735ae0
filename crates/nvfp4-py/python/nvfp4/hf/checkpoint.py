"""What an NVFP4 checkpoint holds for each layer, read from the safetensors headers alone
(names, dtypes, shapes; no tensor is loaded), and checked against the model before transformers
loads anything, so that a missing tensor or a wrong shape is a ``CheckpointError`` naming it
rather than an uninitialized buffer.

A quantized linear layer [N, K] (``out_features`` N, ``in_features`` K) is, under its prefix, in
the names of ModelOpt (``MODELOPT``) or of compressed-tensors (``COMPRESSED_TENSORS``):

| ModelOpt | compressed-tensors | dtype | shape |
|---|---|---|---|
| ``weight`` | ``weight_packed`` | U8 (two E2M1 per byte) | [N, K/2] |
| ``weight_scale`` | ``weight_scale`` | F8_E4M3 | [N, K/16] |
| ``weight_scale_2`` (multiplies) | ``weight_global_scale`` (divides) | F32 | [] or [1] |
| ``input_scale`` (optional, multiplies) | ``input_global_scale`` (optional, divides) | F32 | [] or [1] |
| ``bias`` (if the layer has one) | ``bias`` | F16, BF16 or F32 | [N] |

The two store the same bytes and block scales; their global scales are reciprocals of each other
(``Names.reciprocal``; ``slots`` turns either into the multiplier nvfp4's layers take).

Fused experts (transformers' [E, 2I, H] ``gate_up_proj`` and [E, H, I] ``down_proj``) are stored
as one such layer per expert and projection: ``experts.{e}.gate_proj`` [I, H], ``up_proj`` [I, H],
``down_proj`` [H, I].
"""

from dataclasses import dataclass

from safetensors import safe_open

from .errors import CheckpointError

_SCALAR = ((), (1,))
_FLOATS = ("F16", "BF16", "F32")


@dataclass(frozen=True)
class Names:
    """The names of one quantized layer's tensors in a checkpoint convention, and whether its
    global scales are stored as reciprocals (dequantization divides by them) rather than as the
    multipliers themselves."""

    packed: str
    block_scale: str
    global_scale: str
    input_scale: str
    reciprocal: bool


MODELOPT = Names("weight", "weight_scale", "weight_scale_2", "input_scale", reciprocal=False)
COMPRESSED_TENSORS = Names(
    "weight_packed", "weight_scale", "weight_global_scale", "input_global_scale", reciprocal=True
)


@dataclass(frozen=True)
class LinearEntry:
    """One quantized linear layer as the checkpoint stores it: its key prefix (``...q_proj.``),
    and whether it carries an ``input_scale``."""

    prefix: str
    has_input_scale: bool


class Header:
    """The tensors of a checkpoint (one or several safetensors files): name -> (dtype, shape)."""

    def __init__(self, entries):
        self.entries = entries

    @classmethod
    def read(cls, files):
        entries = {}
        for f in files:
            if not str(f).endswith(".safetensors"):
                raise CheckpointError(f"{f}: nvfp4 reads safetensors checkpoints only")
            with safe_open(str(f), framework="pt") as h:
                for k in h.keys():
                    s = h.get_slice(k)
                    entries[k] = (s.get_dtype(), tuple(s.get_shape()))
        return cls(entries)

    def find(self, key, base_prefix):
        """The checkpoint's name for the model's ``key``: itself, or with the base model's prefix
        (``model.``) removed or added, as transformers matches them."""
        if key in self.entries:
            return key
        if base_prefix:
            bare = key.removeprefix(base_prefix + ".")
            for k in (bare, f"{base_prefix}.{key}"):
                if k in self.entries:
                    return k
        return None

    def is_dense(self, module_name, base_prefix, names=MODELOPT):
        """Whether the checkpoint holds ``module_name`` unquantized (a float ``weight``, no
        block scale): a layer the config does not list as excluded but the export left as it
        is."""
        w = self.find(module_name + ".weight", base_prefix)
        s = self.find(f"{module_name}.{names.block_scale}", base_prefix)
        return w is not None and s is None and self.entries[w][0] in _FLOATS

    def linear(self, module_name, n, k, bias, base_prefix, problems, names=MODELOPT):
        """Checks the entries of the quantized linear ``module_name`` [N, K] in the convention
        ``names`` (``problems`` gets one line per missing or malformed tensor); returns its
        ``LinearEntry``."""
        want = {
            names.packed: (("U8",), [(n, k // 2)]),
            names.block_scale: (("F8_E4M3",), [(n, k // 16)]),
            names.global_scale: (("F32",), list(_SCALAR)),
        }
        if bias:
            want["bias"] = (_FLOATS, [(n,)])
        if k % 16:
            problems.append(f"{module_name}: in_features {k} is not a multiple of 16 (one E4M3 scale per 16 values)")
            return LinearEntry(module_name + ".", False)
        prefix = None
        for suffix, (dtypes, shapes) in want.items():
            key = self.find(f"{module_name}.{suffix}", base_prefix)
            if key is None:
                problems.append(f"{module_name}.{suffix}: missing")
                continue
            prefix = key[: -len(suffix)]
            dtype, shape = self.entries[key]
            if dtype not in dtypes or shape not in shapes:
                problems.append(
                    f"{key}: {dtype} {list(shape)}, expected {' or '.join(dtypes)} "
                    f"{' or '.join(str(list(s)) for s in shapes)}"
                )
        inp = self.find(f"{module_name}.{names.input_scale}", base_prefix)
        if inp is not None and (self.entries[inp][0] != "F32" or self.entries[inp][1] not in _SCALAR):
            dtype, shape = self.entries[inp]
            problems.append(f"{inp}: {dtype} {list(shape)}, expected F32 [] or [1]")
        return LinearEntry(prefix or module_name + ".", inp is not None)


def raise_problems(problems, what):
    """One ``CheckpointError`` listing the first problems found, if any."""
    if not problems:
        return
    shown = "\n  ".join(problems[:12])
    more = f"\n  ... and {len(problems) - 12} more" if len(problems) > 12 else ""
    raise CheckpointError(f"{what}: {len(problems)} problem(s) in the checkpoint:\n  {shown}{more}")
