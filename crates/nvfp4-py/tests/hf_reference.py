"""Float64 references for the transformers tests (``test_hf_*``, ``tests_gpu/test_hf_gpu.py``),
written from the formats' definitions (SPEC §1, §8) and the documented semantics of
``nvfp4.torch.Linear`` and ``nvfp4.torch.MoE``, independent of ``nvfp4.hf``: the checkpoint's
tensors are read here with safetensors, decoded with torch's own float8 decoding and a table of
E2M1 values, and multiplied in float64.

- ``fake_quant``: an activation quantized to NVFP4 and back, the ModelOpt way (float32:
  per 16-block scale e4m3(amax / 6 / global), values e2m1(x / (scale * global)) rounded to nearest
  even); the tests check it against ModelOpt's own recorded output.
- ``RefLinear``: one quantized layer: the float64 product of its input as the kernel sees it (the
  bf16 activation, W4A16; its fake-quantized values, W4A4) and the dequantized weight, times the
  layer's float32 alpha, rounded once to the output type.
- ``RefMoE``: the routed experts likewise, per (token, slot) pair: gate and up rounded once, the
  SwiGLU in float32 rounded once, down rounded once, the router-weighted sum over the slots.
- ``reference_model``: the checkpoint's model built by transformers without any quantizer, its
  dense tensors loaded from the file, ``RefLinear`` / ``RefMoE`` in place of every layer the file
  stores quantized (found by its ``weight_scale``, not by the config's lists).
"""

import json
import os
import pathlib
import shutil

import numpy as np
import pytest
import torch
from reference import round_bits

E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)
LEVELS = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float32)
E4M3 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).double()

DENSE = "tiny-llama-nvfp4-modelopt"
MOE = "tiny-qwen3-moe-nvfp4-modelopt"


def checkpoint(name):
    """A checkpoint folder: under ``$NVFP4_CHECKPOINTS``, else ``<repo>/../shared/checkpoints``
    (where CI lays shared/ beside the clone); skips the test where it is absent."""
    env = os.environ.get("NVFP4_CHECKPOINTS")
    root = pathlib.Path(env) if env else pathlib.Path(__file__).resolve().parents[3].parent / "shared" / "checkpoints"
    path = root / name
    if not (path / "model.safetensors").is_file():
        pytest.skip(f"checkpoint {name} not found under {root} (set NVFP4_CHECKPOINTS)")
    return path


def edited_copy(src, dest, tensors=None, config=None):
    """A copy of checkpoint ``src`` in ``dest`` with ``tensors(dict) -> dict`` applied to its
    tensors and ``config(dict) -> None`` to its config.json."""
    from safetensors.torch import load_file, save_file

    dest.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name not in ("model.safetensors", "config.json"):
            shutil.copy(f, dest / f.name)
    t = load_file(str(src / "model.safetensors"))
    save_file(tensors(t) if tensors else t, str(dest / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    if config:
        config(cfg)
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def equal_alphas(tmp_path):
    """The Qwen3-MoE export with every expert's weight_scale_2 set to expert 0's, per layer and
    projection (gate and up share it): a model whose grouped GEMMs take one alpha each."""

    def edit(t):
        for key in list(t):
            if ".experts." in key and key.endswith("weight_scale_2"):
                layer, rest = key.split(".experts.")
                proj = rest.split(".", 1)[1]
                t[key] = t[f"{layer}.experts.0.{proj}"].clone()
        return t

    return edited_copy(checkpoint(MOE), tmp_path / "equal-alphas", tensors=edit)


def load_tensors(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


# ---- formats ------------------------------------------------------------------------------------


def decode(values, scales):
    """[.., N, K/2] uint8 + plain [.., N, K/16] E4M3 -> float64 [.., N, K] of e2m1 * e4m3 (exact)."""
    v = values.view(torch.uint8).long()
    codes = torch.stack([v & 15, v >> 4], dim=-1).flatten(-2)
    s = E4M3[scales.view(torch.uint8).long()].repeat_interleave(16, dim=-1)
    return E2M1[codes] * s


def round_once(x64, dtype):
    """float64 -> float16/bfloat16, rounded once to nearest even."""
    bits = round_bits(x64.detach().cpu().numpy(), str(dtype).replace("torch.", ""))
    return torch.from_numpy(bits.view(np.int16)).view(dtype).to(x64.device)


def e2m1_rne(v):
    """float32 -> the nearest E2M1 value (ties to the even code), saturated at ±6, sign kept."""
    a = v.abs().clamp(max=6.0)
    d = (a.unsqueeze(-1) - LEVELS.to(v.device)).abs()
    nearest = d == d.min(dim=-1, keepdim=True).values
    even = (torch.arange(8, device=v.device) % 2 == 0).to(torch.int32)
    idx = (nearest.to(torch.int32) * 2 + even).argmax(dim=-1)
    return torch.copysign(LEVELS.to(v.device)[idx], v)


def fake_quant_parts(x, global_scale):
    """x [.., K] (float16/bfloat16/float32) quantized to NVFP4 with the global scale given, the
    ModelOpt way, in float32: returns (e2m1 * e4m3 as float64 [.., K], the global scale as
    float32). The dequantized activation is their product."""
    g = torch.tensor(global_scale, dtype=torch.float32)
    xb = x.float().reshape(*x.shape[:-1], x.shape[-1] // 16, 16)
    amax = xb.abs().amax(dim=-1, keepdim=True)
    # E4M3 saturates at 448 (SPEC §1); torch's cast gives NaN above it, so clamp first.
    scale = (amax / 6 / g).clamp(max=448).to(torch.float8_e4m3fn).float()
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.where(scale == 0, torch.zeros_like(xb), e2m1_rne(xb / (safe * g)))
    return (q.double() * scale.double()).reshape(x.shape), g


def fake_quant(x, global_scale):
    qs, g = fake_quant_parts(x, global_scale)
    return qs * float(g)


def f32(x):
    """A float as the kernels take alpha: rounded to float32, as float64."""
    return float(np.float32(x))


# ---- reference layers ---------------------------------------------------------------------------


class RefLinear(torch.nn.Module):
    """One quantized linear layer in float64 (see the module docstring)."""

    def __init__(self, t, prefix, mode, dtype):
        super().__init__()
        self.register_buffer("w", decode(t[prefix + "weight"], t[prefix + "weight_scale"]), persistent=False)
        self.g = float(t[prefix + "weight_scale_2"])
        self.inp = float(t[prefix + "input_scale"]) if prefix + "input_scale" in t else None
        self.register_buffer("bias", t.get(prefix + "bias"), persistent=False)
        self.mode, self.dtype = mode, dtype

    def forward(self, x):
        if self.mode == "w4a16":
            xa, alpha = x.double(), f32(self.g)
        else:
            xa, _ = fake_quant_parts(x, self.inp)
            alpha = f32(f32(self.inp) * self.g)
        y = round_once((xa @ self.w.T) * alpha, self.dtype)
        return y if self.bias is None else y + self.bias


class RefMoE(torch.nn.Module):
    """Routed SwiGLU experts in float64, one (token, slot) pair at a time (see the module
    docstring); the call of transformers' fused experts module. ``linear``: the reference layer
    of the checkpoint's convention (``RefLinear``: ModelOpt)."""

    def __init__(self, t, prefix, num_experts, mode, dtype, linear=None):
        super().__init__()
        linear = linear or RefLinear
        self.mode, self.dtype = mode, dtype
        self.exp = torch.nn.ModuleList(
            torch.nn.ModuleList(linear(t, f"{prefix}{e}.{n}.", mode, dtype) for n in ("gate_proj", "up_proj", "down_proj"))
            for e in range(num_experts)
        )

    def forward(self, hidden_states, top_k_index, top_k_weights):
        t, k = top_k_index.shape
        out = torch.zeros(hidden_states.shape, dtype=torch.float64, device=hidden_states.device)
        for i in range(t):
            x = hidden_states[i : i + 1]
            for j in range(k):
                e = int(top_k_index[i, j])
                if e >= len(self.exp):
                    continue
                gate, up, down = self.exp[e]
                h = (torch.nn.functional.silu(gate(x).float()) * up(x).float()).to(self.dtype)
                # The slot's product: bf16 weight times bf16 output, exact in float64.
                out[i] += float(top_k_weights[i, j]) * down(h)[0].double()
        # The module sums k float32 products; for k <= 2 that is the exact sum rounded to float32.
        return out.float().to(self.dtype)


def reference_model(path, mode, dtype=torch.bfloat16, device="cpu", linear=None):
    """The checkpoint's model with ``RefLinear`` (or ``linear``, the reference layer of another
    checkpoint convention) / ``RefMoE`` in place of its quantized layers."""
    linear = linear or RefLinear
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    t = load_tensors(path)
    own = model.state_dict()
    dense = {k: v for k, v in t.items() if k in own and v.is_floating_point() and v.dtype != torch.float8_e4m3fn}
    replaced = []
    for name, module in list(model.named_modules()):
        if isinstance(module, torch.nn.Linear) and f"{name}.weight_scale" in t:
            new = linear(t, name + ".", mode, dtype)
        elif isinstance(getattr(module, "gate_up_proj", None), torch.nn.Parameter) and f"{name}.0.gate_proj.weight_scale" in t:
            new = RefMoE(t, name + ".", module.gate_up_proj.shape[0], mode, dtype, linear)
        else:
            continue
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, new)
        replaced.append(name)
    missing, unexpected = model.load_state_dict(dense, strict=False)
    assert not unexpected, unexpected
    assert not missing, f"tensors of the dense model absent from the checkpoint: {missing}"
    return model.to(device).eval(), replaced


# ---- per-expert alphas (branch malpha) ----------------------------------------------------------


def per_expert_alphas_supported():
    """Whether ``torch.ops.nvfp4.grouped_gemm_moe`` takes a float32 tensor of per-expert alphas
    (the API of branch malpha). False only where its schema refuses a tensor; any other failure
    of the probe is raised."""
    import nvfp4
    import nvfp4.torch  # noqa: F401

    w, s, _ = nvfp4.quantize(torch.ones(2, 16, 32))
    x = torch.ones(2, 32, dtype=torch.bfloat16)
    offs = torch.tensor([1, 2], dtype=torch.int32)
    try:
        torch.ops.nvfp4.grouped_gemm_moe(x, None, w, s, offs, alpha=torch.ones(2))
    except RuntimeError as e:
        if "Optional[float]" in str(e):
            return False
        raise
    return True


needs_malpha = pytest.mark.skipif(
    "not __import__('hf_reference').per_expert_alphas_supported()",
    reason="needs per-expert alpha tensors in grouped_gemm_moe (branch malpha, not merged here yet)",
)
