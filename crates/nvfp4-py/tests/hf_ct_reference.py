"""compressed-tensors NVFP4 checkpoints for the tests, made from the two real ModelOpt exports,
and a float64 reference of compressed-tensors' semantics; independent of ``nvfp4.hf``.

- ``convert``: a ModelOpt export rewritten as compressed-tensors stores NVFP4 (format
  ``nvfp4-pack-quantized``, compressed-tensors 0.20.0): ``weight`` -> ``weight_packed`` (the same
  bytes: both pack element 2j in the low nibble), ``weight_scale`` as it is, the global scales as
  ``weight_global_scale`` / ``input_global_scale`` F32 [1], which dequantization divides by, and
  the compressed-tensors ``quantization_config``. How the stored global scale g is chosen from
  ModelOpt's multiplier s:

  - ``"pow2"``: g = 2^-round(log2 s), a power of two near 1/s (the weights change by s * g, within
    a factor sqrt(2): these are random models). 1/g is exact, so dividing by g and multiplying by
    f32(1/g) agree exactly: the tests' exact comparisons use these.
  - ``"reciprocal"``: g = f32(1/s), what compressed-tensors' own ModelOpt converter stores.
    f32(1/g) is s again for all but 1 of the dense export's 14 scales and 1 of the MoE one's 112
    (and for those no float32 g gives s back: 1/g skips float32 values where g's significand is
    small); ``modelopt_twin`` is the ModelOpt export with s replaced by f32(1/g).

  Scales ModelOpt shares (gate and up of an expert; one projection's input scale across experts)
  map to one g, so they stay shared.
- ``RefLinearCT``: one quantized layer as compressed-tensors defines it, in float64: the weight
  e2m1 * e4m3 / g; W4A16 multiplies the 16-bit activation by it; W4A4 first quantizes the
  activation per 16-block with the scale e4m3(f32(amax / 6) * g_in) and values
  e2m1(x / (scale / g_in)) (float32, as ``calculate_qparams`` / ``_quantize`` compute it, but with
  amax / 6 in float32, not the activation's 16-bit type that compressed-tensors' own fake
  quantization uses), then the product divided by g_in * g; one rounding to the output type.
"""

import json
import math
import shutil

import hf_reference as R
import torch

FORMAT = "nvfp4-pack-quantized"
NVFP4_ARGS = {
    "num_bits": 4,
    "type": "float",
    "symmetric": True,
    "group_size": 16,
    "strategy": "tensor_group",
    "dynamic": False,
    "scale_dtype": "torch.float8_e4m3fn",
}


def ct_config(ignore, input_activations=True, targets=("Linear",)):
    """A compressed-tensors NVFP4 ``quantization_config`` (NVFP4, or NVFP4A16 without input
    activations), in the form compressed-tensors 0.20.0 serializes it."""
    group = {
        "targets": list(targets),
        "weights": dict(NVFP4_ARGS),
        "input_activations": dict(NVFP4_ARGS, dynamic="local", observer="static_minmax") if input_activations else None,
        "output_activations": None,
        "format": FORMAT,
    }
    return {
        "config_groups": {"config_group_0": group},
        "quant_method": "compressed-tensors",
        "kv_cache_scheme": None,
        "format": FORMAT,
        "quantization_status": "compressed",
        "global_compression_ratio": None,
        "ignore": list(ignore),
        "version": "0.20.0",
    }


def f32(x):
    return torch.tensor(x, dtype=torch.float32)


def stored_scale(s, how):
    """compressed-tensors' stored global scale g (F32 [1]) for ModelOpt's multiplier s."""
    s = f32(float(s))
    if how == "pow2":
        return f32(2.0 ** -round(math.log2(float(s)))).reshape(1)
    assert how == "reciprocal", how
    return (1 / s).reshape(1)  # float32 division: correctly rounded


def convert_tensors(t, how):
    """ModelOpt tensors -> compressed-tensors tensors (see the module docstring)."""
    out = {}
    for k, v in t.items():
        prefix, _, leaf = k.rpartition(".")
        quantized = f"{prefix}.weight_scale" in t
        if quantized and leaf == "weight":
            out[f"{prefix}.weight_packed"] = v
        elif quantized and leaf == "weight_scale_2":
            out[f"{prefix}.weight_global_scale"] = stored_scale(v, how)
        elif quantized and leaf == "input_scale":
            out[f"{prefix}.input_global_scale"] = stored_scale(v, how)
        else:
            out[k] = v
    return out


def convert(src, dest, how="pow2", tensors=None, config=None):
    """``src`` (a ModelOpt export) as a compressed-tensors NVFP4 checkpoint in ``dest``;
    ``tensors(dict) -> dict`` and ``config(dict) -> None`` edit the result."""
    from safetensors.torch import save_file

    dest.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name not in ("model.safetensors", "config.json", "hf_quant_config.json", "down_proj_modelopt_io.safetensors"):
            shutil.copy(f, dest / f.name)
    t = convert_tensors(R.load_tensors(src), how)
    save_file(tensors(t) if tensors else t, str(dest / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = ct_config(cfg["quantization_config"]["ignore"])
    if config:
        config(cfg)
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def modelopt_twin(ct_path, name, dest):
    """The ModelOpt export ``name`` with each global scale s replaced by f32(1/g), g the one the
    compressed-tensors checkpoint ``ct_path`` (converted from it) stores for s."""
    ct = R.load_tensors(ct_path)

    def edit(t):
        for k in list(t):
            prefix, _, leaf = k.rpartition(".")
            ct_name = {"weight_scale_2": "weight_global_scale", "input_scale": "input_global_scale"}.get(leaf)
            if ct_name and f"{prefix}.weight_scale" in t:
                t[k] = (1 / ct[f"{prefix}.{ct_name}"]).reshape(t[k].shape)
        return t

    return R.edited_copy(R.checkpoint(name), dest, tensors=edit)


def fake_quant_parts_ct(x, global_scale):
    """x [.., K] quantized per 16-block the compressed-tensors way (see the module docstring):
    (e2m1 * e4m3 as float64 [.., K]; the dequantized activation is that divided by g_in)."""
    g = f32(float(global_scale))
    xb = x.float().reshape(*x.shape[:-1], x.shape[-1] // 16, 16)
    amax = xb.abs().amax(dim=-1, keepdim=True)
    scale = ((amax / 6) * g).clamp(max=448).to(torch.float8_e4m3fn).float()
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.where(scale == 0, torch.zeros_like(xb), R.e2m1_rne(xb / (safe / g)))
    return (q.double() * scale.double()).reshape(x.shape)


class RefLinearCT(torch.nn.Module):
    """One compressed-tensors NVFP4 layer in float64 (see the module docstring)."""

    def __init__(self, t, prefix, mode, dtype):
        super().__init__()
        self.register_buffer("w", R.decode(t[prefix + "weight_packed"], t[prefix + "weight_scale"]), persistent=False)
        self.g = float(t[prefix + "weight_global_scale"])
        inp = t.get(prefix + "input_global_scale")
        self.g_in = None if inp is None else float(inp)
        self.register_buffer("bias", t.get(prefix + "bias"), persistent=False)
        self.mode, self.dtype = mode, dtype

    def forward(self, x):
        if self.mode == "w4a16":
            y = (x.double() @ self.w.T) / self.g
        else:
            y = (fake_quant_parts_ct(x, self.g_in) @ self.w.T) / (self.g_in * self.g)
        y = R.round_once(y, self.dtype)
        return y if self.bias is None else y + self.bias


def reference_model(path, mode, dtype=torch.bfloat16):
    return R.reference_model(path, mode, dtype=dtype, linear=RefLinearCT)
