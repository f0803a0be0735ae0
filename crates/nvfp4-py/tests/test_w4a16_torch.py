"""W4A16 (SPEC §8) through ``nvfp4.torch`` on CPU tensors: the ``torch.ops.nvfp4.*`` operations
take ``None`` for the activation's scales (their fake implementations give the real outputs'
shapes and dtypes, and they trace under ``torch.compile``), and ``Linear`` in both modes, from
state dicts and safetensors files of both conventions, bias included. Skipped without torch
(CI's CPU suite is NumPy only; the GPU run has torch)."""

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nvfp4  # noqa: E402
import nvfp4.torch as nvt  # noqa: E402
import safetensors_io  # noqa: E402
from torch_ops import op_error  # noqa: E402
from reference import activation, decode, dual16_gate, gemm16_ref, operand, round_bits, to_blocked  # noqa: E402

DTYPES = [torch.float16, torch.bfloat16]


def t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def bits(x):
    return x.contiguous().view(torch.int16).numpy().view(np.uint16)


def name(dtype):
    return str(dtype).replace("torch.", "")


def e4m3(s):
    return t(s).view(torch.float8_e4m3fn)


# ---- torch.ops.nvfp4.* --------------------------------------------------------------------------


def op_calls(rng, dtype):
    """(op name, its arguments, the expected bits) for every operation's W4A16 form."""
    k, n, e = 128, 24, 3
    x64 = activation(rng, (2, 10, k))
    w, sw = operand(rng, 2, n, k)
    w2, sw2 = operand(rng, 2, n, k)
    v64 = activation(rng, (2, 1, k))
    we, se = operand(rng, e, n, k)
    ends = [3, 3, 8]
    x, v = t(x64).to(dtype), t(v64).to(dtype)
    want_moe = np.zeros((10, n), np.uint16)
    start = 0
    for ex, end in enumerate(ends):
        if end > start:
            want_moe[start:end] = round_bits(gemm16_ref(x64[0, start:end], we[ex], se[ex], 0.5), name(dtype))
        start = end
    gemv_ref = np.matmul(decode(w, sw), np.swapaxes(v64, -1, -2)) * 0.5
    return [
        ("gemm", (x, None, t(w), e4m3(sw), 0.5), round_bits(gemm16_ref(x64, w, sw, 0.5), name(dtype))),
        ("gemv", (t(w), e4m3(sw), v, None, 0.5), round_bits(gemv_ref, name(dtype))),
        ("dual_gemm", (x, None, t(w), e4m3(sw), t(w2), e4m3(sw2), 0.5), None),
        (
            "grouped_gemm",
            ([x[0], x[1]], [None, None], [t(w[0]), t(w[1])], [e4m3(sw[0]), t(to_blocked(sw[1:]))], [0.5, 2.0]),
            [round_bits(gemm16_ref(x64[i], w[i], sw[i], al), name(dtype)) for i, al in ((0, 0.5), (1, 2.0))],
        ),
        ("grouped_gemm_moe", (x[0], None, t(we), e4m3(se), torch.tensor(ends, dtype=torch.int32), 0.5), want_moe),
    ]


def check(op, got, want, args, dtype):
    if op == "grouped_gemm":
        assert [o.dtype for o in got] == [dtype, dtype]
        for o, w in zip(got, want):
            np.testing.assert_array_equal(bits(o), w)
    elif op == "dual_gemm":
        assert got.dtype == dtype
        x = args[0].double().numpy()
        ref = dual16_gate(x, *(a.view(torch.uint8).numpy() for a in args[2:6]), 0.5)
        diff = np.abs(bits(got).astype(np.int32) - round_bits(ref, name(dtype)).astype(np.int32))
        assert diff.max() <= 1
    else:
        assert got.dtype == dtype
        np.testing.assert_array_equal(bits(got), want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ops_take_none_for_the_activation_scales(dtype):
    rng = np.random.default_rng(21)
    for op, args, want in op_calls(rng, dtype):
        got = getattr(torch.ops.nvfp4, op)(*args)
        check(op, got, want, args, dtype)
        # out_dtype still decides where given.
        other = torch.bfloat16 if dtype == torch.float16 else torch.float16
        forced = getattr(torch.ops.nvfp4, op)(*args, other)
        outs = forced if isinstance(forced, list) else [forced]
        assert all(o.dtype == other for o in outs), op


@pytest.mark.parametrize("dtype", DTYPES)
def test_fakes_give_the_real_shapes_and_dtypes(dtype):
    rng = np.random.default_rng(22)
    fakes = {
        "gemm": nvt._gemm_fake,
        "gemv": nvt._gemv_fake,
        "dual_gemm": nvt._dual_fake,
        "grouped_gemm": nvt._grouped_fake,
        "grouped_gemm_moe": nvt._grouped_moe_fake,
    }
    for op, args, _ in op_calls(rng, dtype):
        for extra in ((), (torch.float16,), (torch.bfloat16,)):
            real = getattr(torch.ops.nvfp4, op)(*args, *extra)
            fake = fakes[op](*args, *extra)
            real, fake = (real, fake) if isinstance(real, list) else ([real], [fake])
            assert [(r.shape, r.dtype) for r in real] == [(f.shape, f.dtype) for f in fake], (op, extra)


def test_w4a16_ops_under_torch_compile():
    rng = np.random.default_rng(23)
    calls = op_calls(rng, torch.bfloat16)

    def f(*flat):
        outs, i = [], 0
        for op, args, _ in calls:
            n = len(args)
            outs.append(getattr(torch.ops.nvfp4, op)(*flat[i : i + n]))
            i += n
        return outs

    flat = [a for _, args, _ in calls for a in args]
    eager = f(*flat)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(*flat)
    for e, c in zip(eager, compiled):
        for x, y in zip(e if isinstance(e, list) else [e], c if isinstance(c, list) else [c]):
            assert x.dtype == y.dtype == torch.bfloat16
            assert torch.equal(x.view(torch.int16), y.view(torch.int16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quantize_dequant_writes_the_quantization_back(dtype):
    """``quantize_dequant``: x quantized (as ``quantize``) and each element written back as e2m1 *
    e4m3 without the global scale, in bfloat16 (float16 for float16 x), with the global scale;
    its fake gives the real shapes and dtypes; it traces under torch.compile; bad input refused."""
    torch.manual_seed(7)
    x = (torch.randn(2, 5, 64) * torch.logspace(-3, 3, 64)).to(dtype)
    want_dt = torch.float16 if dtype == torch.float16 else torch.bfloat16
    for gs in (None, 0.37):
        v, s, g = torch.ops.nvfp4.quantize(x, gs)
        got, gg = torch.ops.nvfp4.quantize_dequant(x, gs)
        want = nvt.dequantize(v, s, dtype=torch.float64).to(want_dt)
        assert got.dtype == want_dt and got.shape == x.shape
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)) and torch.equal(gg, g)
        fake, fg = nvt._quantize_dequant_fake(x, gs)
        assert (fake.shape, fake.dtype, fg.shape, fg.dtype) == (got.shape, got.dtype, gg.shape, gg.dtype)
    compiled = torch.compile(lambda a: torch.ops.nvfp4.quantize_dequant(a, 0.37), backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x)[0].view(torch.int16), torch.ops.nvfp4.quantize_dequant(x, 0.37)[0].view(torch.int16))
    with pytest.raises(op_error("quantize_dequant", ValueError), match="multiple of 16"):
        torch.ops.nvfp4.quantize_dequant(torch.zeros(4, 40, dtype=dtype))
    with pytest.raises(op_error("quantize_dequant", nvfp4.DtypeError), match="float32, float16 or bfloat16"):
        torch.ops.nvfp4.quantize_dequant(torch.zeros(4, 32, dtype=torch.int32))
    with pytest.raises(op_error("quantize_dequant", ValueError), match="finite and > 0"):
        torch.ops.nvfp4.quantize_dequant(torch.ones(4, 32, dtype=dtype), -1.0)


# ---- Linear -------------------------------------------------------------------------------------


def layer_data(rng, n=48, k=256):
    """An NVFP4 weight quantized from a Gaussian one, its global scale, an input scale, a bias."""
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    wv, ws, wg = nvfp4.quantize(t(w))
    return wv, ws, wg, torch.tensor(0.01), t(rng.standard_normal(n).astype(np.float32)).to(torch.bfloat16)


def modelopt(wv, ws, wg, inp, bias=None):
    sd = {"weight": wv, "weight_scale": ws, "weight_scale_2": wg[0], "input_scale": inp}
    return sd if bias is None else {**sd, "bias": bias}


def compressed(wv, ws, wg, inp, bias=None):
    sd = {
        "weight_packed": wv,
        "weight_scale": ws,
        "weight_global_scale": (1 / wg[0]).float(),
        "input_global_scale": (1 / inp).float(),
    }
    return sd if bias is None else {**sd, "bias": bias}


def w4a16_bits(x64, wv, ws, alpha, dtype):
    ref = gemm16_ref(x64, wv.numpy(), ws.view(torch.uint8).numpy(), alpha)
    return round_bits(ref, name(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_defaults_to_w4a16_in_the_inputs_dtype(dtype):
    rng = np.random.default_rng(24)
    wv, ws, wg, inp, _ = layer_data(rng)
    layer = nvt.Linear.from_state_dict(modelopt(wv, ws, wg, inp))
    assert layer.mode == "w4a16" and "mode='w4a16'" in repr(layer)
    x64 = activation(rng, (2, 5, 256))
    y = layer(t(x64).to(dtype))
    assert y.shape == (2, 5, 48) and y.dtype == dtype
    np.testing.assert_array_equal(bits(y), w4a16_bits(x64, wv, ws, wg[0].item(), dtype))
    # The input scale is W4A4's: W4A16 does not read it.
    other = nvt.Linear.from_state_dict(modelopt(wv, ws, wg, inp * 8))
    assert torch.equal(other(t(x64).to(dtype)).view(torch.int16), y.view(torch.int16))


@pytest.mark.parametrize("convention", [modelopt, compressed])
def test_linear_w4a16_both_conventions_bias_and_out_dtype(convention):
    rng = np.random.default_rng(25)
    wv, ws, wg, inp, bias = layer_data(rng)
    sd = convention(wv, ws, wg, inp, bias)
    # compressed-tensors stores 1 / global: the layer's global is its inverse, in f32.
    g = wg[0].item() if convention is modelopt else float(np.float32(1 / np.float64(sd["weight_global_scale"])))
    x64 = activation(rng, (7, 256))
    x = t(x64).to(torch.bfloat16)
    layer = nvt.Linear.from_state_dict(sd, mode="w4a16")
    assert np.float32(layer.weight_global) == np.float32(g)
    y = layer(x)
    gemm = t(w4a16_bits(x64, wv, ws, g, torch.bfloat16).view(np.int16)).view(torch.bfloat16)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y.view(torch.int16), (gemm + bias).view(torch.int16))  # the bias added in bf16
    # out_dtype float16: one rounding to float16 (not bf16 first), then the bias.
    y16 = nvt.Linear.from_state_dict(sd, out_dtype=torch.float16)(x)
    g16 = t(w4a16_bits(x64, wv, ws, g, torch.float16).view(np.int16)).view(torch.float16)
    assert y16.dtype == torch.float16 and torch.equal(y16.view(torch.int16), (g16 + bias).to(torch.float16).view(torch.int16))
    # float32: the input's rounding, cast.
    y32 = nvt.Linear.from_state_dict(sd, out_dtype=torch.float32)(x)
    assert y32.dtype == torch.float32 and torch.equal(y32, (gemm + bias).float())


def test_linear_w4a4_keeps_its_behaviour():
    rng = np.random.default_rng(26)
    wv, ws, wg, inp, _ = layer_data(rng)
    x = t(rng.standard_normal((9, 256)).astype(np.float32))
    layer = nvt.Linear.from_state_dict(modelopt(wv, ws, wg, inp), mode="w4a4")
    y = layer(x)
    q, s, _ = nvfp4.quantize(x, inp.item())
    want = nvfp4.gemm(q, s, wv, ws, alpha=inp.item() * wg[0].item())
    assert y.dtype == torch.float16 and torch.equal(y.view(torch.int16), want.view(torch.int16))
    # Any float input: W4A4 quantizes it.
    assert layer(x.bfloat16()).dtype == torch.float16


def test_linear_rejects_what_it_cannot_compute():
    rng = np.random.default_rng(27)
    wv, ws, wg, inp, _ = layer_data(rng)
    with pytest.raises(ValueError, match=re.escape('mode must be "w4a16" or "w4a4", got \'w8a8\'')):
        nvt.Linear.from_state_dict(modelopt(wv, ws, wg, inp), mode="w8a8")
    layer = nvt.Linear.from_state_dict(modelopt(wv, ws, wg, inp))
    rule = "Linear(mode='w4a16') takes float16 or bfloat16 input, got torch.float32"
    with pytest.raises(nvfp4.DtypeError, match=re.escape(rule)):
        layer(torch.zeros(3, 256))
    with pytest.raises(ValueError, match=re.escape("the input's last dimension is 128, the layer's in_features 256")):
        layer(torch.zeros(3, 128, dtype=torch.bfloat16))


def test_packed_forms_never_serve_other_weights():
    # A packed form is made from the weights as they were: a move, a cast or a state-dict load
    # drops it (Linear and MoE share PackedForms). A stand-in entry, as no GPU packs here.
    rng = np.random.default_rng(31)
    wv, ws, wg, inp, _ = layer_data(rng)
    layer = nvt.Linear.from_state_dict(modelopt(wv, ws, wg, inp))
    for change in (lambda: layer.to("cpu"), lambda: layer.load_state_dict(layer.state_dict())):
        layer._packed[torch.bfloat16] = torch.zeros(1, dtype=torch.uint8)
        change()
        assert layer._packed == {}


def test_linear_under_torch_compile():
    rng = np.random.default_rng(28)
    wv, ws, wg, inp, bias = layer_data(rng)
    x = t(activation(rng, (4, 3, 256))).to(torch.bfloat16)
    for mode in ("w4a16", "w4a4"):
        layer = nvt.Linear.from_state_dict(modelopt(wv, ws, wg, inp, bias), mode=mode)
        eager = layer(x)
        compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)(x)
        assert compiled.dtype == eager.dtype and torch.equal(eager.view(torch.int16), compiled.view(torch.int16)), mode


def write_layer(path, prefix, wv, ws, wg, convention, bias=None):
    g = np.float32(wg[0].item())
    tensors = {}
    if convention == "modelopt":
        tensors[prefix + "weight"] = ("U8", wv.shape, wv.numpy().tobytes())
        tensors[prefix + "weight_scale_2"] = ("F32", [], g.tobytes())
    else:
        tensors[prefix + "weight_packed"] = ("U8", wv.shape, wv.numpy().tobytes())
        tensors[prefix + "weight_global_scale"] = ("F32", [], (np.float32(1) / g).tobytes())
    tensors[prefix + "weight_scale"] = ("F8_E4M3", ws.shape, ws.view(torch.uint8).numpy().tobytes())
    if bias is not None:
        tensors[prefix + "bias"] = bias
    safetensors_io.write(path, tensors)


@pytest.mark.parametrize("convention", ["modelopt", "compressed-tensors"])
def test_linear_from_safetensors_reads_the_bias(tmp_path, convention):
    rng = np.random.default_rng(29)
    wv, ws, wg, _, bias = layer_data(rng)
    bias_bytes = bias.view(torch.int16).numpy().tobytes()
    path = tmp_path / "layer.safetensors"
    write_layer(path, "l.", wv, ws, wg, convention, ("BF16", [48], bias_bytes))
    layer = nvt.Linear.from_safetensors(path, "l.", device="cpu")
    assert layer.mode == "w4a16" and layer.bias.dtype == torch.bfloat16 and torch.equal(layer.bias, bias)
    x64 = activation(rng, (6, 256))
    g = layer.weight_global
    gemm = t(w4a16_bits(x64, wv, ws, g, torch.bfloat16).view(np.int16)).view(torch.bfloat16)
    assert torch.equal(layer(t(x64).bfloat16()).view(torch.int16), (gemm + bias).view(torch.int16))
    # bias= overrides the file's; no bias in the file: none.
    assert nvt.Linear.from_safetensors(path, "l.", device="cpu", bias=bias * 2).bias.eq(bias * 2).all()
    write_layer(tmp_path / "nobias.safetensors", "l.", wv, ws, wg, convention)
    assert nvt.Linear.from_safetensors(tmp_path / "nobias.safetensors", "l.", device="cpu").bias is None
    write_layer(tmp_path / "bad.safetensors", "l.", wv, ws, wg, convention, ("BF16", [24], bias_bytes[:48]))
    with pytest.raises(ValueError, match=re.escape("tensor `l.bias`: a bias must be [N] = [48], got shape [24]")):
        nvt.Linear.from_safetensors(tmp_path / "bad.safetensors", "l.", device="cpu")
    write_layer(tmp_path / "u8.safetensors", "l.", wv, ws, wg, convention, ("U8", [48], bytes(48)))
    with pytest.raises(ValueError, match="a bias must be F32, F16 or BF16"):
        nvt.Linear.from_safetensors(tmp_path / "u8.safetensors", "l.", device="cpu")
