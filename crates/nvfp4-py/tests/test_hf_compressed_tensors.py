"""compressed-tensors NVFP4 checkpoints (``nvfp4-pack-quantized``) loaded by transformers'
``from_pretrained`` through ``nvfp4.hf``, on the CPU backend. No real compressed-tensors export is
at hand, so ``hf_ct_reference.convert`` makes them from the two real ModelOpt exports; where the
``compressed-tensors`` package is installed, the tests also check the format mapping against it
(its own decompression of every layer, its config parser, its ModelOpt converter). Everything
else needs only CI's packages (torch, transformers, safetensors).

Tolerances, derived from the mapping's one rounding: nvfp4 multiplies by f32(1/g) where
compressed-tensors divides by the stored g; f32(1/g) = (1/g)(1 + e) with |e| <= 2^-24.

- Global scales that are powers of two (``"pow2"``): 1/g is exact, so e = 0 and every operation
  of the layer (the weight's scaling, W4A4's activation block scales e4m3(amax / 6 * g_in) =
  e4m3(amax / 6 / (1 / g_in)) and values, alpha = 1 / (g_in * g)) is the same number either way.
  The argument of ``test_hf_checkpoints`` then applies unchanged: the float64 reference of
  compressed-tensors' semantics (``hf_ct_reference``) and the CPU backend both round each
  layer's exact result once, so the logits must have **identical bits** (and ``generate`` the
  same tokens), in both modes, dense and MoE.
- Any global scale: per layer, W4A16 output y = rnd(S * f32(1/g)) for the exact product sum S,
  so |y - S/g| <= ulp(y)/2 + 2^-24 |S/g| (the rounding to 16 bits, then e), checked on every
  layer of a checkpoint whose scales are compressed-tensors' own reciprocals of ModelOpt's. No
  whole-model bound is derived from that: a layer output within 2^-24 of a rounding midpoint
  rounds the other way (one 16-bit ulp, about once per 2^15 outputs), and one flipped ulp's
  effect through RMSNorm, softmax and SiLU has no useful closed-form bound. Instead the exact
  whole-model check for such scales is the mapping itself: a checkpoint with compressed-tensors'
  own reciprocals g = f32(1/s) loads, bit for bit, as the ModelOpt export whose scales are
  f32(1/g) (``modelopt_twin``; the export's own s for all but 2 of its 126 scales).
"""

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import hf_ct_reference as C  # noqa: E402
import hf_reference as R  # noqa: E402
import nvfp4.hf  # noqa: E402
import nvfp4.torch as nvt  # noqa: E402
from nvfp4.hf import compressed_tensors as CT  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.quantizers import auto as hf_auto  # noqa: E402

try:
    import compressed_tensors as ct_package
except ImportError:
    ct_package = None

needs_package = pytest.mark.skipif(ct_package is None, reason="the compressed-tensors package is not installed")

MODES = ["w4a16", "w4a4"]
IDS = torch.tensor([[1, 17, 300, 45, 2, 99, 7, 511, 3, 64, 128, 5]])
PROJS = ("gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """``ckpt(name, how)``: the export ``name`` converted with global scales ``how`` (made once
    per module)."""
    made = {}

    def get(name, how="pow2"):
        if (name, how) not in made:
            made[name, how] = C.convert(R.checkpoint(name), tmp_path_factory.mktemp(how) / name, how)
        return made[name, how]

    return get


def load(path, mode="w4a16", **kw):
    if mode == "w4a16":
        return AutoModelForCausalLM.from_pretrained(path, **kw)
    with pytest.warns(UserWarning, match="loading attributes"):
        return AutoModelForCausalLM.from_pretrained(
            path, quantization_config=nvfp4.hf.CompressedTensorsNVFP4Config(mode=mode), **kw
        )


def bits(x):
    return x.contiguous().view(torch.int16)


def f32(x):
    return float(torch.tensor(x, dtype=torch.float32))


# ---- what from_pretrained builds ---------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_dense_modules(mode, ckpt):
    path = ckpt(R.DENSE, "reciprocal")
    model = load(path, mode)
    t = R.load_tensors(path)
    assert type(model.config.quantization_config) is nvfp4.hf.CompressedTensorsNVFP4Config
    assert model.config.quantization_config.mode == mode and model.is_quantized
    _, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    quantized = {k[: -len(".weight_packed")] for k in t if k.endswith(".weight_packed")}
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nvt.Linear)}
    assert set(linears) == quantized and len(quantized) == 7
    for name, m in linears.items():
        assert m.mode == mode
        assert torch.equal(m.weight, t[name + ".weight_packed"])
        assert torch.equal(m.weight_scale, t[name + ".weight_scale"].view(torch.uint8))
        # The multipliers: the float32 reciprocals of what compressed-tensors divides by.
        assert m.weight_global == f32(1 / float(t[name + ".weight_global_scale"]))
        assert m.input_scale == f32(1 / float(t[name + ".input_global_scale"]))
    assert type(model.lm_head) is torch.nn.Linear and torch.equal(model.lm_head.weight, t["lm_head.weight"])
    floats = {n for n, p in list(model.named_parameters()) + list(model.named_buffers()) if p.is_floating_point()}
    assert not {n for n in floats if any(n.startswith(q + ".") for q in quantized)}


@pytest.mark.parametrize("mode", MODES)
def test_moe_modules(mode, ckpt):
    path = ckpt(R.MOE, "reciprocal")
    model = load(path, mode)
    t = R.load_tensors(path)
    _, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    for layer in range(2):
        p = f"model.layers.{layer}.mlp."
        moe = model.get_submodule(p + "experts")
        assert isinstance(moe, nvt.MoE) and moe.mode == mode and moe.num_experts == 8
        assert type(model.get_submodule(p + "gate")).__name__ == "Qwen3MoeTopKRouter"
        for e in range(8):
            x = f"{p}experts.{e}."
            gate, up, down = (t[f"{x}{n}.weight_packed"] for n in PROJS)
            assert torch.equal(moe.gate_up_weight[e], torch.cat([gate, up]))
            assert torch.equal(moe.down_weight[e], down)
            assert torch.equal(moe.down_weight_scale[e], t[f"{x}down_proj.weight_scale"].view(torch.uint8))
            g, d = (f32(1 / float(t[f"{x}{n}.weight_global_scale"])) for n in ("gate_proj", "down_proj"))
            if mode == "w4a4":
                g *= f32(1 / float(t[f"{x}gate_proj.input_global_scale"]))
                d *= f32(1 / float(t[f"{x}down_proj.input_global_scale"]))
            assert moe.gate_up_alpha[e] == torch.tensor(g, dtype=torch.float32)
            assert moe.down_alpha[e] == torch.tensor(d, dtype=torch.float32)
    for name, m in model.named_modules():
        if name.endswith("_proj") and ".experts" not in name:
            assert isinstance(m, nvt.Linear) and m.mode == mode, name


# ---- logits and generate -----------------------------------------------------------------------


def compare(path, mode):
    model = load(path, mode)
    ref, replaced = C.reference_model(path, mode)
    assert set(replaced) == {n for n, m in model.named_modules() if isinstance(m, (nvt.Linear, nvt.MoE))}
    with torch.no_grad():
        got, want = model(IDS).logits, ref(IDS).logits
    assert got.shape == (1, IDS.shape[1], 512) and got.dtype == want.dtype == torch.bfloat16
    assert torch.equal(bits(got), bits(want)), f"max |diff| {(got.double() - want.double()).abs().max().item()}"
    out = model.generate(IDS, max_new_tokens=6, do_sample=False)
    assert out.shape == (1, IDS.shape[1] + 6) and torch.equal(out, ref.generate(IDS, max_new_tokens=6, do_sample=False))


@pytest.mark.parametrize("mode", MODES)
def test_dense_logits_and_generate(mode, ckpt):
    """Power-of-two global scales: identical bits to compressed-tensors' semantics."""
    compare(ckpt(R.DENSE), mode)


@R.needs_malpha
@pytest.mark.parametrize("mode", MODES)
def test_moe_logits_and_generate(mode, ckpt):
    compare(ckpt(R.MOE), mode)


def test_the_reference_tells_the_scale_direction_apart(ckpt):
    """The comparison fails for the wrong direction: multiplying by the stored g (the ModelOpt
    reading of these numbers) is far from compressed-tensors' semantics."""
    path = ckpt(R.DENSE)
    ref, _ = C.reference_model(path, "w4a16")
    wrong, _ = R.reference_model(path, "w4a16", linear=_MultiplyByStored)
    with torch.no_grad():
        a, b = ref(IDS).logits.double(), wrong(IDS).logits.double()
    assert ((a - b).norm() / a.norm()).item() > 2.0**-6


class _MultiplyByStored(C.RefLinearCT):
    def forward(self, x):
        return R.round_once((x.double() @ self.w.T) * self.g, self.dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", [R.DENSE, R.MOE])
def test_loads_as_the_modelopt_export(name, mode, ckpt, tmp_path):
    """compressed-tensors' own reciprocals g = f32(1/s) of the export's scales: the model is the
    ModelOpt export's with s' = f32(1/g) (s itself for nearly all), bit for bit."""
    path = ckpt(name, "reciprocal")
    src = C.modelopt_twin(path, name, tmp_path / "twin")
    t = R.load_tensors(path)
    stored = [float(v) for k, v in t.items() if k.endswith("global_scale")]
    assert any(g != 2.0 ** round(math.log2(g)) for g in stored)  # not the exact case
    got = load(path, mode)
    with pytest.warns(UserWarning, match="loading attributes") if mode == "w4a4" else _nothing():
        want = AutoModelForCausalLM.from_pretrained(
            src, **({"quantization_config": nvfp4.hf.ModelOptConfig(mode=mode)} if mode == "w4a4" else {})
        )
    with torch.no_grad():
        assert torch.equal(bits(got(IDS).logits), bits(want(IDS).logits))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_reciprocal_layers_within_the_rounding_bound(ckpt):
    """compressed-tensors' own reciprocals (f32(1/s)): each W4A16 layer within
    ulp(y)/2 + 2^-24 |S/g| of the exact division (module docstring), on random inputs."""
    path = ckpt(R.DENSE, "reciprocal")
    model = load(path)
    t = R.load_tensors(path)
    gen = torch.Generator().manual_seed(24)
    inexact = 0
    for name, m in model.named_modules():
        if not isinstance(m, nvt.Linear):
            continue
        x = torch.randn(32, m.in_features, generator=gen).bfloat16()
        y = m(x).double()
        g = float(t[name + ".weight_global_scale"])
        # S / g: the sum is exact in float64 (test_hf_checkpoints' argument), the division one rounding.
        exact = (x.double() @ R.decode(t[name + ".weight_packed"], t[name + ".weight_scale"]).T) / g
        ulp = 2.0 ** (torch.floor(torch.log2(y.abs().clamp(min=2.0**-126))) - 7)  # bfloat16: 8 bits
        bound = ulp / 2 + (2.0**-24 + 2.0**-52) * exact.abs()
        assert torch.all((y - exact).abs() <= bound), f"{name}: worst excess {((y - exact).abs() - bound).max().item()}"
        inexact += f32(1 / g) * g != 1
    assert inexact > 0  # some layer's 1/g is rounded: the bound's second term is exercised


# ---- against the compressed-tensors package -----------------------------------------------------


def _scheme(path):
    from compressed_tensors.quantization import QuantizationConfig

    cfg = QuantizationConfig.model_validate(json.loads((path / "config.json").read_text())["quantization_config"])
    return cfg, cfg.config_groups["config_group_0"]


@needs_package
def test_the_config_is_compressed_tensors_nvfp4(ckpt):
    """The package parses the config written by the conversion as its own NVFP4 preset."""
    from compressed_tensors.quantization.quant_scheme import NVFP4

    cfg, scheme = _scheme(ckpt(R.DENSE))
    assert cfg.format == C.FORMAT and cfg.quantization_status == "compressed"
    assert scheme.weights == NVFP4["weights"] and scheme.input_activations == NVFP4["input_activations"]


@needs_package
@pytest.mark.parametrize("name", [R.DENSE, R.MOE])
def test_package_decompression_equals_the_loaded_layers(name, ckpt):
    """Every quantized layer, decompressed by compressed-tensors (``NVFP4PackedCompressor``,
    bfloat16), equals, bit for bit, the weight nvfp4 loaded: its codes decoded times its
    multiplier (exact here: power-of-two g, and e2m1 * e4m3 has at most 6 significant bits). This
    proves the mapping: nibble order, code table, scale placement and the scale's direction."""
    from compressed_tensors.compressors.nvfp4 import NVFP4PackedCompressor

    path = ckpt(name)
    _, scheme = _scheme(path)
    t = R.load_tensors(path)
    model = load(path)

    def package(prefix):
        sd = {k: t[prefix + k] for k in ("weight_packed", "weight_scale", "weight_global_scale")}
        return NVFP4PackedCompressor.decompress(sd, scheme)["weight"].double()

    checked = 0
    for mname, m in model.named_modules():
        if isinstance(m, nvt.Linear):
            assert torch.equal(R.decode(m.weight, m.weight_scale) * m.weight_global, package(mname + "."))
            checked += 1
        elif isinstance(m, nvt.MoE):
            for e in range(m.num_experts):
                x = f"{mname}.{e}."
                gu = R.decode(m.gate_up_weight[e], m.gate_up_weight_scale[e]) * float(m.gate_up_alpha[e])
                dn = R.decode(m.down_weight[e], m.down_weight_scale[e]) * float(m.down_alpha[e])
                assert torch.equal(gu, torch.cat([package(x + "gate_proj."), package(x + "up_proj.")]))
                assert torch.equal(dn, package(x + "down_proj."))
                checked += 3
    assert checked == (7 if name == R.DENSE else 2 * (4 + 3 * 8))


@needs_package
@pytest.mark.parametrize("name", [R.DENSE, R.MOE])
def test_package_converter_writes_the_reciprocal_checkpoint(name):
    """compressed-tensors' own ModelOpt converter makes the same tensors as the ``"reciprocal"``
    conversion (it stores the global scales as [] rather than [1])."""
    from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import ModelOptNvfp4Converter

    src = R.checkpoint(name)
    ignore = json.loads((src / "config.json").read_text())["quantization_config"]["ignore"]
    theirs = ModelOptNvfp4Converter(ignore=ignore, targets=["Linear"]).process(R.load_tensors(src))
    ours = C.convert_tensors(R.load_tensors(src), "reciprocal")
    assert sorted(theirs) == sorted(ours)
    for k in ours:
        a, b = theirs[k].reshape(-1), ours[k].reshape(-1)
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), k


# ---- which checkpoints are taken over -----------------------------------------------------------


def _scheme_dict(num_bits, kind, group_size=None, strategy="channel", dynamic=False):
    return {"num_bits": num_bits, "type": kind, "symmetric": True, "group_size": group_size, "strategy": strategy, "dynamic": dynamic}


FP8_W8A8 = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": _scheme_dict(8, "float"),
            "input_activations": _scheme_dict(8, "float", strategy="token", dynamic=True),
        }
    },
    "ignore": ["lm_head"],
}
INT4_W4A16 = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": _scheme_dict(4, "int", 128, "group")}},
    "ignore": ["lm_head"],
}
MXFP4 = {
    "quant_method": "compressed-tensors",
    "format": "mxfp4-pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": _scheme_dict(4, "float", 32, "group")}},
}


@pytest.mark.parametrize("cfg", [FP8_W8A8, INT4_W4A16, MXFP4], ids=["fp8", "int4", "mxfp4"])
def test_other_schemes_are_left_to_transformers(cfg):
    """Not NVFP4: transformers' own config and quantizer, as without nvfp4.hf (which, without the
    compressed-tensors package, is transformers' ImportError asking for it)."""
    assert not CT.is_nvfp4(cfg)
    from transformers.utils.quantization_config import CompressedTensorsConfig

    if ct_package is None:
        with pytest.raises(ImportError, match="compressed-tensors"):
            hf_auto.AutoQuantizationConfig.from_dict(dict(cfg))
        return
    config = hf_auto.AutoQuantizationConfig.from_dict(dict(cfg))
    assert type(config) is CompressedTensorsConfig
    from transformers.quantizers.quantizer_compressed_tensors import CompressedTensorsHfQuantizer

    assert type(hf_auto.AutoHfQuantizer.from_config(config, pre_quantized=True)) is CompressedTensorsHfQuantizer


@needs_package
def test_an_fp8_checkpoint_loads_as_before(tmp_path):
    """A whole compressed-tensors FP8 (W8A8, per-channel) checkpoint, made from the dense export's
    weights, loads through transformers' own quantizer with nvfp4.hf imported: its layers are
    compressed-tensors', none is nvfp4's, and the model runs."""

    def tensors(t):
        out = {}
        for k, v in t.items():
            p, _, leaf = k.rpartition(".")
            if f"{p}.weight_scale" not in t or leaf not in ("weight", "weight_scale", "weight_scale_2", "input_scale"):
                out[k] = v
            elif leaf == "weight":
                w = (R.decode(v, t[p + ".weight_scale"]) * float(t[p + ".weight_scale_2"])).float()
                scale = w.abs().amax(dim=1, keepdim=True) / 448
                out[k] = (w / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
                out[p + ".weight_scale"] = scale
        return out

    def cfg(c):
        c["quantization_config"] = dict(FP8_W8A8)

    path = R.edited_copy(R.checkpoint(R.DENSE), tmp_path / "fp8", tensors=tensors, config=cfg)
    (path / "hf_quant_config.json").unlink()
    from transformers.quantizers.quantizer_compressed_tensors import CompressedTensorsHfQuantizer
    from transformers.utils.quantization_config import CompressedTensorsConfig

    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    assert type(model.config.quantization_config) is CompressedTensorsConfig
    assert type(model.hf_quantizer) is CompressedTensorsHfQuantizer
    assert not any(isinstance(m, (nvt.Linear, nvt.MoE)) for m in model.modules())
    assert model.model.layers[0].self_attn.q_proj.quantization_scheme.weights.num_bits == 8
    with torch.no_grad():
        assert torch.isfinite(model(IDS).logits).all()


def test_nvfp4_is_taken_over():
    cfg = C.ct_config(["lm_head"])
    assert CT.is_nvfp4(cfg)
    config = hf_auto.AutoQuantizationConfig.from_dict(cfg)
    assert type(config) is nvfp4.hf.CompressedTensorsNVFP4Config
    assert type(hf_auto.AutoHfQuantizer.from_config(config, pre_quantized=True)) is nvfp4.hf.CompressedTensorsNVFP4Quantizer
    # NVFP4A16 (no input activations) too.
    assert type(hf_auto.AutoQuantizationConfig.from_dict(C.ct_config([], input_activations=False))) is type(config)


def test_restore_transformers():
    from transformers.utils.quantization_config import CompressedTensorsConfig

    try:
        CT.restore_transformers()
        assert hf_auto.AUTO_QUANTIZATION_CONFIG_MAPPING["compressed-tensors"] is CompressedTensorsConfig
        if ct_package is None:
            with pytest.raises(ImportError, match="compressed-tensors"):
                hf_auto.AutoQuantizationConfig.from_dict(C.ct_config(["lm_head"]))
        else:
            assert type(hf_auto.AutoQuantizationConfig.from_dict(C.ct_config(["lm_head"]))) is CompressedTensorsConfig
    finally:
        CT.register()
    assert hf_auto.AUTO_QUANTIZATION_CONFIG_MAPPING["compressed-tensors"] is nvfp4.hf.CompressedTensorsNVFP4Config


def test_targets_and_ignore_match_as_compressed_tensors_does():
    cfg = nvfp4.hf.CompressedTensorsNVFP4Config(
        config_groups={"g": {"targets": ["re:.*self_attn", "model.layers.0.mlp.up_proj"], "weights": C.NVFP4_ARGS}},
        ignore=["model.layers.0.self_attn.q_proj", "re:.*k_proj$"],
    )
    lin = torch.nn.Linear
    assert cfg.quantizes("model.layers.0.self_attn.v_proj", lin)
    assert not cfg.quantizes("model.layers.0.self_attn.q_proj", lin)  # ignored by name
    assert not cfg.quantizes("model.layers.3.self_attn.k_proj", lin)  # ignored by regex
    assert cfg.quantizes("model.layers.0.mlp.up_proj", lin)  # exact name
    assert not cfg.quantizes("model.layers.1.mlp.up_proj", lin)
    from_start = nvfp4.hf.CompressedTensorsNVFP4Config(config_groups={"g": {"targets": ["re:layers"], "weights": C.NVFP4_ARGS}})
    assert from_start.quantizes("layers.0.q_proj", lin) and not from_start.quantizes("model.layers.0.q_proj", lin)
    by_class = nvfp4.hf.CompressedTensorsNVFP4Config(config_groups={"g": {"targets": ["Linear"], "weights": C.NVFP4_ARGS}}, ignore=["lm_head"])
    assert by_class.quantizes("anything", lin) and not by_class.quantizes("anything", torch.nn.Embedding)
    assert not by_class.quantizes("lm_head", lin)


# ---- checkpoints nvfp4.hf refuses ---------------------------------------------------------------


def test_mixed_schemes_raise(ckpt, tmp_path):
    """NVFP4 beside anything nvfp4 does not run: one error listing every such entry."""

    def cfg(c):
        q = c["quantization_config"]
        q["config_groups"]["group_1"] = {"targets": ["re:.*mlp.*"], **{k: v for k, v in FP8_W8A8["config_groups"]["group_0"].items() if k != "targets"}}
        q["config_groups"]["config_group_0"]["output_activations"] = C.NVFP4_ARGS
        q["kv_cache_scheme"] = _scheme_dict(8, "float", strategy="tensor")

    path = C.convert(R.checkpoint(R.DENSE), tmp_path / "mixed", config=cfg)
    with pytest.raises(nvfp4.hf.CheckpointError) as err:
        AutoModelForCausalLM.from_pretrained(path)
    msg = str(err.value)
    assert "kv_cache_scheme is set" in msg
    assert "config_groups.group_1.weights.num_bits is 8, nvfp4 runs 4" in msg
    assert "config_groups.group_1.weights.strategy is 'channel', nvfp4 runs 'tensor_group'" in msg
    assert "config_groups.config_group_0.output_activations is set" in msg
    assert "restore_transformers" in msg


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda q: q.update(quantization_status="frozen"), "quantization_status is 'frozen'"),
        (lambda q: q["config_groups"]["config_group_0"].update(format="float-quantized"), "stored 'float-quantized'"),
        (lambda q: q["config_groups"]["config_group_0"]["weights"].update(group_size=32), "weights.group_size is 32"),
        (lambda q: q["config_groups"]["config_group_0"]["input_activations"].update(dynamic=False), "input_activations.dynamic is False, nvfp4 runs 'local'"),
        (lambda q: q["config_groups"]["config_group_0"]["weights"].update(scale_dtype="torch.float16"), "scale_dtype is 'torch.float16'"),
    ],
    ids=["frozen", "format", "group32", "static-input", "scale-dtype"],
)
def test_unsupported_nvfp4_options(edit, match):
    cfg = C.ct_config(["lm_head"])
    edit(cfg)
    with pytest.raises(nvfp4.hf.CheckpointError, match=match):
        hf_auto.AutoQuantizationConfig.from_dict(cfg)


def test_missing_and_malformed_tensors(ckpt, tmp_path):
    def edit(t):
        del t["model.layers.0.self_attn.k_proj.weight_global_scale"]
        t["model.layers.0.mlp.up_proj.weight_packed"] = t["model.layers.0.mlp.up_proj.weight_packed"].view(torch.int8)
        t["model.layers.0.mlp.down_proj.input_global_scale"] = t["model.layers.0.mlp.down_proj.input_global_scale"].double()
        return t

    path = C.convert(R.checkpoint(R.DENSE), tmp_path / "bad", tensors=edit)
    with pytest.raises(nvfp4.hf.CheckpointError) as err:
        AutoModelForCausalLM.from_pretrained(path)
    msg = str(err.value)
    assert "(compressed-tensors nvfp4-pack-quantized): 3 problem(s)" in msg
    assert "model.layers.0.self_attn.k_proj.weight_global_scale: missing" in msg
    assert "up_proj.weight_packed: I8 [512, 128], expected U8 [512, 128]" in msg
    assert "down_proj.input_global_scale: F64 [1], expected F32 [] or [1]" in msg


@pytest.mark.parametrize("value, match", [(0.0, "finite and > 0"), (1e-45, "overflows float32")])
def test_bad_global_scales(value, match, tmp_path):
    key = "model.layers.0.self_attn.o_proj.weight_global_scale"

    def edit(t):
        t[key] = torch.tensor([value], dtype=torch.float32)
        return t

    path = C.convert(R.checkpoint(R.DENSE), tmp_path / "g", tensors=edit)
    with pytest.raises(nvfp4.hf.CheckpointError, match=f"{key}: .*{match}"):
        AutoModelForCausalLM.from_pretrained(path)


def test_ignored_but_stored_quantized(tmp_path):
    def cfg(c):
        c["quantization_config"]["ignore"].append("model.layers.0.self_attn.q_proj")

    path = C.convert(R.checkpoint(R.DENSE), tmp_path / "ignored", config=cfg)
    with pytest.raises(nvfp4.hf.CheckpointError, match="q_proj: not quantized by the config's targets / ignore but stored quantized"):
        AutoModelForCausalLM.from_pretrained(path)


def test_partially_targeted_experts(tmp_path):
    def cfg(c):
        c["quantization_config"]["ignore"].append("model.layers.1.mlp.experts.3.down_proj")

    path = C.convert(R.checkpoint(R.MOE), tmp_path / "partial", config=cfg)
    with pytest.raises(nvfp4.hf.CheckpointError, match=r"layers\.1\.mlp\.experts: the config quantizes some experts' projections but not others \(model\.layers\.1\.mlp\.experts\.3\.down_proj"):
        AutoModelForCausalLM.from_pretrained(path)


def test_bad_mode():
    with pytest.raises(ValueError, match="mode must be"):
        nvfp4.hf.CompressedTensorsNVFP4Config(mode="w8a8")
