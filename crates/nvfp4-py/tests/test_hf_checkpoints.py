"""The two real ModelOpt NVFP4 exports (a dense Llama, a Qwen3-MoE) loaded by transformers'
``from_pretrained`` through ``nvfp4.hf``, on the CPU backend: the modules it puts in place, the
logits against a float64 reference of the same semantics, ``generate``, ModelOpt's recorded
output of one layer, and the typed errors for checkpoints it cannot load.

Tolerance of the logits: **none (identical bits)**. Why that is the right bound here: the
reference (``hf_reference.reference_model``) is the same transformers model in bfloat16 with
every quantized layer replaced by its float64 definition: the product of the activation as the
kernel sees it (the bf16 values, W4A16; their NVFP4 fake-quantization with the layer's
``input_scale``, W4A4) and the dequantized weight, each product (bf16 x E2M1 x E4M3: 14 significant
bits; W4A4: 12) exact in float64 and their sum exact too (its terms span far fewer than the 39
binades float64 has to spare), times the layer's float32 alpha, rounded once to bf16. The CPU
backend computes the same (exact sums, one rounding), so each layer's output has the same bits,
so every later bf16 operation of the model sees the same inputs: any difference at all is an
error in the loading (a tensor on the wrong layer, a wrong scale, a wrong mode), in the experts'
routing or combination, or in the kernels. The MoE layer adds its own documented roundings (gate
and up, the float32 SwiGLU, down, the float32 sum over k = 2 slots), which the reference takes in
the same places. On the GPU the sums are float32 in another order, and
``tests_gpu/test_hf_gpu.py`` states the tolerance that follows from that.

MoE checkpoints carry one global scale per expert: their grouped GEMM needs per-expert alphas
(branch malpha). Until that lands, the real Qwen3-MoE export's forward tests are skipped and the
same tests run on a copy whose experts share one global scale per projection (``equal_alphas``).
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import hf_reference as R  # noqa: E402
import nvfp4.hf  # noqa: E402
import nvfp4.torch as nvt  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

MODES = ["w4a16", "w4a4"]
IDS = torch.tensor([[1, 17, 300, 45, 2, 99, 7, 511, 3, 64, 128, 5]])


def load(path, mode="w4a16", **kw):
    if mode != "w4a16":
        kw["quantization_config"] = nvfp4.hf.ModelOptConfig(mode=mode)
    with pytest.warns(UserWarning, match="loading attributes") if mode != "w4a16" else _nothing():
        return AutoModelForCausalLM.from_pretrained(path, **kw)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def bits(x):
    return x.contiguous().view(torch.int16)


def quantized_names(path):
    return {k[: -len(".weight_scale")] for k in R.load_tensors(path) if k.endswith(".weight_scale")}


def assert_every_tensor_loaded(path):
    """transformers' own account: every checkpoint tensor found its place, none is missing."""
    _, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info


# ---- what from_pretrained builds ---------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_dense_modules(mode):
    path = R.checkpoint(R.DENSE)
    model = load(path, mode)
    t = R.load_tensors(path)
    quantized = quantized_names(path)
    assert_every_tensor_loaded(path)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nvt.Linear)}
    assert set(linears) == quantized and len(quantized) == 7
    for name, m in linears.items():
        assert m.mode == mode and m.weight.dtype == torch.uint8
        assert torch.equal(m.weight, t[name + ".weight"]) and torch.equal(m.weight_scale, t[name + ".weight_scale"].view(torch.uint8))
        assert m.weight_global == float(t[name + ".weight_scale_2"])
        assert m.input_scale == float(t[name + ".input_scale"])
    # Excluded modules stay as they were, with the checkpoint's bf16 tensors.
    assert type(model.lm_head) is torch.nn.Linear and torch.equal(model.lm_head.weight, t["lm_head.weight"])
    assert type(model.model.embed_tokens) is torch.nn.Embedding
    # No dequantized copy: every floating tensor of the model is a dense module's.
    floats = {n for n, p in list(model.named_parameters()) + list(model.named_buffers()) if p.is_floating_point()}
    assert not {n for n in floats if any(n.startswith(q + ".") for q in quantized)}
    assert model.is_quantized and model.config.quantization_config.mode == mode


@pytest.mark.parametrize("mode", MODES)
def test_moe_modules(mode):
    path = R.checkpoint(R.MOE)
    model = load(path, mode)
    t = R.load_tensors(path)
    assert_every_tensor_loaded(path)
    for layer in range(2):
        p = f"model.layers.{layer}.mlp."
        moe = model.get_submodule(p + "experts")
        assert isinstance(moe, nvt.MoE) and moe.mode == mode
        assert (moe.num_experts, moe.hidden_size, moe.intermediate_size) == (8, 256, 128)
        assert type(model.get_submodule(p + "gate")).__name__ == "Qwen3MoeTopKRouter"  # excluded: as it was
        for e in range(8):
            x = f"{p}experts.{e}."
            gate, up, down = (t[f"{x}{n}.weight"] for n in ("gate_proj", "up_proj", "down_proj"))
            assert torch.equal(moe.gate_up_weight[e], torch.cat([gate, up]))
            assert torch.equal(moe.down_weight[e], down)
            assert torch.equal(moe.down_weight_scale[e], t[f"{x}down_proj.weight_scale"].view(torch.uint8))
            g, d = float(t[f"{x}gate_proj.weight_scale_2"]), float(t[f"{x}down_proj.weight_scale_2"])
            if mode == "w4a4":
                g *= float(t[f"{x}gate_proj.input_scale"])
                d *= float(t[f"{x}down_proj.input_scale"])
            assert moe.gate_up_alpha[e] == torch.tensor(g, dtype=torch.float32)
            assert moe.down_alpha[e] == torch.tensor(d, dtype=torch.float32)
        assert len(set(moe.down_alpha.tolist())) > 1  # the export's per-expert global scales
    for name, m in model.named_modules():
        if name.endswith("_proj") and ".experts" not in name:
            assert isinstance(m, nvt.Linear) and m.mode == mode, name


# ---- logits and generate against the float64 reference -----------------------------------------


def compare(path, mode, device="cpu", dtype=torch.bfloat16):
    model = load(path, mode, dtype=dtype, **({} if device == "cpu" else {"device_map": device}))
    ref, replaced = R.reference_model(path, mode, dtype=dtype, device=device)
    assert set(replaced) == {n for n, m in model.named_modules() if isinstance(m, (nvt.Linear, nvt.MoE))}
    ids = IDS.to(device)
    with torch.no_grad():
        got, want = model(ids).logits, ref(ids).logits
    assert got.dtype == want.dtype == dtype and got.shape == (1, IDS.shape[1], 512)
    assert torch.equal(bits(got), bits(want)), f"max |diff| {(got.double() - want.double()).abs().max().item()}"
    out = model.generate(ids, max_new_tokens=6, do_sample=False)
    ref_out = ref.generate(ids, max_new_tokens=6, do_sample=False)
    assert out.shape == (1, IDS.shape[1] + 6) and torch.equal(out, ref_out)
    return model, ref


@pytest.mark.parametrize("mode", MODES)
def test_dense_logits_and_generate(mode):
    compare(R.checkpoint(R.DENSE), mode)


@pytest.mark.parametrize("mode", MODES)
def test_moe_equal_alphas_logits_and_generate(mode, tmp_path):
    compare(R.equal_alphas(tmp_path), mode)


@pytest.mark.parametrize("mode", MODES)
def test_float16_model(mode, tmp_path):
    """dtype=torch.float16: every layer computes and rounds in float16 instead."""
    compare(R.checkpoint(R.DENSE), mode, dtype=torch.float16)
    compare(R.equal_alphas(tmp_path), mode, dtype=torch.float16)


@R.needs_malpha
@pytest.mark.parametrize("mode", MODES)
def test_moe_logits_and_generate(mode):
    compare(R.checkpoint(R.MOE), mode)


def test_the_comparison_tells_the_modes_apart():
    """The reference comparison fails for the wrong mode: W4A4 logits are not W4A16's."""
    path = R.checkpoint(R.DENSE)
    ref, _ = R.reference_model(path, "w4a16")
    with torch.no_grad():
        w4a4 = load(path, "w4a4")(IDS).logits
        want = ref(IDS).logits
    rel = ((w4a4.double() - want.double()).norm() / want.double().norm()).item()
    assert rel > 2.0**-6, rel


# ---- ModelOpt's recorded output of one layer ---------------------------------------------------


def test_down_proj_reproduces_modelopt():
    """``down_proj_modelopt_io.safetensors``: ModelOpt's fake-quantized input ``x_fakequant`` and
    weight ``w_fakequant`` (both rounded to bf16 by ModelOpt) and the float32 product of the two,
    ``y_dequant_ref``, for one input x. Checks, in order: the reference's fake-quantization is
    ModelOpt's (bit for bit, after ModelOpt's bf16 rounding); the quantizer-loaded weight decodes
    to ModelOpt's (likewise); the W4A4 layer's output is ModelOpt's product within
    |y - y_ref| <= 2^-8 |y_ref| + (2^-7 + 2^-14) * sum_k |x_fq[k] w_fq[k]|: our bf16 output rounding
    (u = 2^-8), ModelOpt's bf16 rounding of each operand (2u relative on each product, to first
    order; our operands are the unrounded ones) and its float32 sum of K = 512 terms (K * 2^-24 =
    2^-15, with margin). The W4A16 layer likewise against x @ w_fq^T."""
    from safetensors.torch import load_file

    path = R.checkpoint(R.DENSE)
    io = load_file(str(path / "down_proj_modelopt_io.safetensors"))
    t = R.load_tensors(path)
    p = "model.layers.0.mlp.down_proj."
    x = io["x"]
    assert torch.equal(x.bfloat16().float(), x)
    xq = R.fake_quant(x.bfloat16(), float(t[p + "input_scale"]))
    assert torch.equal(xq.to(torch.bfloat16).float(), io["x_fakequant"])
    w = R.decode(t[p + "weight"], t[p + "weight_scale"]) * float(t[p + "weight_scale_2"])
    assert torch.equal(w.to(torch.bfloat16).float(), io["w_fakequant"])

    for mode, xa, yref in (
        ("w4a4", io["x_fakequant"], io["y_dequant_ref"]),
        ("w4a16", x, x.double() @ io["w_fakequant"].double().T),
    ):
        layer = load(path, mode).model.layers[0].mlp.down_proj
        assert isinstance(layer, nvt.Linear) and layer.mode == mode
        y = layer(x.bfloat16()).double()
        yref = yref.double()
        mag = xa.double().abs() @ io["w_fakequant"].double().abs().T
        tol = 2.0**-8 * yref.abs() + (2.0**-7 + 2.0**-14) * mag
        assert torch.all((y - yref).abs() <= tol), f"{mode}: worst excess {((y - yref).abs() - tol).max().item()}"
        if mode == "w4a16":  # W4A16 does not round the input: tighter than ModelOpt's w4a4 product
            assert torch.all((y - yref).abs() <= 2.0**-8 * yref.abs() + (2.0**-8 + 2.0**-14) * mag)


# ---- checkpoints nvfp4.hf refuses ---------------------------------------------------------------


def test_wrong_quant_algo(tmp_path):
    def cfg(c):
        c["quantization_config"]["quant_algo"] = "FP8"

    path = R.edited_copy(R.checkpoint(R.DENSE), tmp_path / "fp8", config=cfg)
    with pytest.raises(nvfp4.hf.CheckpointError, match="quant_algo 'FP8'"):
        AutoModelForCausalLM.from_pretrained(path)


def test_wrong_group_size(tmp_path):
    def cfg(c):
        c["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 32

    path = R.edited_copy(R.checkpoint(R.DENSE), tmp_path / "g32", config=cfg)
    with pytest.raises(nvfp4.hf.CheckpointError, match="groups of 32"):
        AutoModelForCausalLM.from_pretrained(path)


def test_missing_tensors(tmp_path):
    def edit(t):
        del t["model.layers.0.self_attn.k_proj.weight_scale"]
        del t["model.layers.1.mlp.experts.5.down_proj.weight_scale_2"]
        return t

    path = R.edited_copy(R.checkpoint(R.MOE), tmp_path / "missing", tensors=edit)
    with pytest.raises(nvfp4.hf.CheckpointError) as err:
        AutoModelForCausalLM.from_pretrained(path)
    msg = str(err.value)
    assert "2 problem(s)" in msg
    assert "model.layers.0.self_attn.k_proj.weight_scale: missing" in msg
    assert "model.layers.1.mlp.experts.5.down_proj.weight_scale_2: missing" in msg


def test_wrong_shapes_and_dtypes(tmp_path):
    def edit(t):
        p = "model.layers.0.mlp."
        t[p + "down_proj.weight"] = t[p + "down_proj.weight"][:, :128].contiguous()
        t[p + "up_proj.weight_scale"] = t[p + "up_proj.weight_scale"].view(torch.uint8)
        t[p + "gate_proj.weight_scale_2"] = t[p + "gate_proj.weight_scale_2"].double()
        return t

    path = R.edited_copy(R.checkpoint(R.DENSE), tmp_path / "shapes", tensors=edit)
    with pytest.raises(nvfp4.hf.CheckpointError) as err:
        AutoModelForCausalLM.from_pretrained(path)
    msg = str(err.value)
    assert "down_proj.weight: U8 [256, 128], expected U8 [256, 256]" in msg
    assert "up_proj.weight_scale: U8 [512, 16], expected F8_E4M3 [512, 16]" in msg
    assert "gate_proj.weight_scale_2: F64 [], expected F32 [] or [1]" in msg


def test_excluded_but_quantized(tmp_path):
    def cfg(c):
        c["quantization_config"]["ignore"].append("model.layers.0.self_attn.q_proj")

    path = R.edited_copy(R.checkpoint(R.DENSE), tmp_path / "ignored", config=cfg)
    with pytest.raises(nvfp4.hf.CheckpointError, match="q_proj: excluded by the config's ignore list but stored quantized"):
        AutoModelForCausalLM.from_pretrained(path)


def test_gate_and_up_must_share_the_global_scale(tmp_path):
    def edit(t):
        key = "model.layers.1.mlp.experts.3.up_proj.weight_scale_2"
        t[key] = t[key] * 2
        return t

    path = R.edited_copy(R.checkpoint(R.MOE), tmp_path / "gu", tensors=edit)
    with pytest.raises(nvfp4.hf.CheckpointError, match=r"experts\.3: gate_proj and up_proj have different weight_scale_2"):
        AutoModelForCausalLM.from_pretrained(path)


def test_w4a4_needs_one_input_scale_per_projection(tmp_path):
    def edit(t):
        key = "model.layers.0.mlp.experts.6.down_proj.input_scale"
        t[key] = t[key] * 2
        return t

    path = R.edited_copy(R.checkpoint(R.MOE), tmp_path / "inp", tensors=edit)
    with pytest.raises(nvfp4.hf.CheckpointError, match="down_proj input_scale differ"):
        load(path, "w4a4")
    assert isinstance(load(path).model.layers[0].mlp.experts, nvt.MoE)  # W4A16 does not use them


def test_bad_mode_and_dtype():
    path = R.checkpoint(R.DENSE)
    with pytest.raises(ValueError, match="mode must be"):
        nvfp4.hf.ModelOptConfig(mode="w8a8")
    with pytest.raises(ValueError, match="float16 or bfloat16 activations"):
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
