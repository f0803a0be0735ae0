"""W4A16 on real ModelOpt exports (the dense and the MoE checkpoint of the shared checkpoint
folder, read from ``$NVFP4_CHECKPOINTS`` or /work/shared/checkpoints; skipped where absent): a
Linear layer read with the library's readers against a float64 reference of x @ dequant(W)^T,
ModelOpt's own fake-quantized weight as a cross-check of the reading, the two modes' accuracy
that the ``Linear`` docstring quotes, and the MoE experts (per-expert global scales) through the
list-form grouped GEMM and the dual GEMM. CPU torch tensors; skipped without torch."""

import os
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nvfp4  # noqa: E402
import nvfp4.torch as nvt  # noqa: E402
import safetensors_io  # noqa: E402
from reference import bf16_bits, decode, dual16_gate, gemm16_ref  # noqa: E402

ROOT = pathlib.Path(os.environ.get("NVFP4_CHECKPOINTS", "/work/shared/checkpoints"))
DENSE = ROOT / "tiny-llama-nvfp4-modelopt"
MOE = ROOT / "tiny-qwen3-moe-nvfp4-modelopt"
DOWN = "model.layers.0.mlp.down_proj."


def need(path):
    if not path.is_dir():
        pytest.skip(f"{path} is absent (set NVFP4_CHECKPOINTS to the folder holding the exports)")


def bits(x):
    return x.contiguous().view(torch.int16).numpy().view(np.uint16)


def test_dense_layer_w4a16_is_the_float64_product_rounded_once():
    need(DENSE)
    layer = nvt.Linear.from_safetensors(DENSE / "model.safetensors", DOWN, device="cpu")
    assert layer.mode == "w4a16" and (layer.out_features, layer.in_features) == (256, 512)
    io = safetensors_io.read(DENSE / "down_proj_modelopt_io.safetensors")
    x = io["x"][2]  # [16, 512] float32 holding bfloat16 values
    w = decode(layer.weight.numpy(), layer.weight_scale.numpy()) * np.float64(np.float32(layer.weight_global))
    # The reading agrees with ModelOpt: its fake-quantized weight is the dequantized one in bf16
    # (compared as values: the E2M1 code -0 decodes to -0, ModelOpt writes +0).
    as_bf16 = (bf16_bits(w).astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(as_bf16, io["w_fakequant"][2])
    xb = torch.from_numpy(x.copy()).to(torch.bfloat16)
    assert torch.equal(xb.float(), torch.from_numpy(x.copy()))
    y = layer(xb)
    assert y.dtype == torch.bfloat16 and y.shape == (16, 256)
    ref = gemm16_ref(x.astype(np.float64), layer.weight.numpy(), layer.weight_scale.numpy(), layer.weight_global)
    np.testing.assert_array_equal(bits(y), bf16_bits(ref))


def test_dense_layer_w4a4_matches_modelopts_product():
    """W4A4 with the checkpoint's calibrated input_scale: ModelOpt's own W4A4 product of the same
    input (computed from its bfloat16 fake-quantized operands, so within their rounding)."""
    need(DENSE)
    layer = nvt.Linear.from_safetensors(DENSE / "model.safetensors", DOWN, device="cpu", mode="w4a4")
    io = safetensors_io.read(DENSE / "down_proj_modelopt_io.safetensors")
    x = torch.from_numpy(io["x"][2].copy())
    y = layer(x).float().numpy()
    ref = io["y_dequant_ref"][2].astype(np.float64)
    assert np.all(np.abs(y - ref) <= 2.0**-7 * np.abs(ref) + 2.0**-8 * np.abs(ref).max())
    # And not W4A16's result: the activations were quantized.
    y16 = nvt.Linear.from_safetensors(DENSE / "model.safetensors", DOWN, device="cpu")(x.bfloat16())
    assert not np.allclose(y, y16.float().numpy(), rtol=2.0**-7, atol=0)


def test_mode_accuracy_quoted_in_the_linear_docstring():
    """Gaussian bfloat16 activations [256, 512] through the real down_proj: W4A16 is the float64
    product up to its bfloat16 rounding (0.17% relative norm); W4A4 with a per-tensor amax scale
    is 9.5% off it."""
    need(DENSE)
    errs = {}
    for mode in ("w4a16", "w4a4"):
        path = DENSE / "model.safetensors"
        layer = nvt.Linear.from_safetensors(path, DOWN, device="cpu", mode=mode, out_dtype=torch.bfloat16)
        layer.input_scale = None  # W4A4: the per-call amax scale (W4A16 ignores it)
        w = decode(layer.weight.numpy(), layer.weight_scale.numpy()) * layer.weight_global
        torch.manual_seed(0)
        x = torch.randn(256, 512).to(torch.bfloat16)
        ref = x.double().numpy() @ w.T
        y = layer(x).double().numpy()
        errs[mode] = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    print(f"relative norm error: W4A16 {errs['w4a16']:.4%}, W4A4 {errs['w4a4']:.4%}")
    assert 0.0015 < errs["w4a16"] < 0.0018
    assert 0.09 < errs["w4a4"] < 0.10


def expert(sd, layer, e, proj):
    p = f"model.layers.{layer}.mlp.experts.{e}.{proj}."
    return sd[p + "weight"][2], sd[p + "weight_scale"][2], float(sd[p + "weight_scale_2"][2])


def test_moe_experts_w4a16_grouped_and_dual():
    """The MoE export's experts have one global scale each (as NVIDIA's published checkpoints
    do): the list-form grouped GEMM takes one alpha per group. Tokens routed to 8 experts (two
    without tokens), down_proj per expert bit-identical to the float64 product, and each expert's
    gate/up pair as a W4A16 dual GEMM (SwiGLU in float32)."""
    need(MOE)
    sd = safetensors_io.read(MOE / "model.safetensors")
    rng = np.random.default_rng(30)
    counts = [5, 0, 17, 3, 0, 9, 1, 5]
    groups, alphas, wants = [], [], []
    for e, m in enumerate(counts):
        if m == 0:
            continue
        w, s, g = expert(sd, 0, e, "down_proj")
        x = torch.randn(m, 2 * w.shape[1], generator=torch.Generator().manual_seed(e)).to(torch.bfloat16)
        groups.append((x, None, torch.from_numpy(w.copy()), torch.from_numpy(s.copy())))
        alphas.append(g)
        wants.append(bf16_bits(gemm16_ref(x.double().numpy(), w, s, g)))
    outs = nvfp4.grouped_gemm(groups, alpha=alphas)
    for o, want in zip(outs, wants):
        assert o.dtype == torch.bfloat16
        np.testing.assert_array_equal(bits(o), want)
    for e in (0, 6):
        gw, gs, gg = expert(sd, 0, e, "gate_proj")
        uw, us, ug = expert(sd, 0, e, "up_proj")
        assert gg == ug  # ModelOpt gives an expert's gate and up one global scale
        x = torch.from_numpy(rng.standard_normal((12, 2 * gw.shape[1])).astype(np.float32)).to(torch.bfloat16)
        t = lambda a: torch.from_numpy(a.copy())  # noqa: E731
        got = nvfp4.dual_gemm(x, None, t(gw), t(gs), t(uw), t(us), alpha=gg)
        want = bf16_bits(dual16_gate(x.double().numpy(), gw, gs, uw, us, gg))
        diff = np.abs(bits(got).astype(np.int32) - want.astype(np.int32))
        assert got.dtype == torch.bfloat16 and diff.max() <= 1
