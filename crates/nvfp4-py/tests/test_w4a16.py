"""W4A16 (SPEC §8) on the CPU: every operation with a dense float16/bfloat16 activation (its
scales passed as None) against a float64 reference, bit-identical on exact-tier data
(activations {0, ±0.5, ±1, ±1.5, ±2} x 2^e) and within half an output ulp on Gaussian data; the
output dtype rule; and every error the W4A16 forms report. float16 activations run as NumPy
arrays without torch; bfloat16 ones (NumPy has none) as CPU torch tensors, skipped without
torch."""

import re

import numpy as np
import pytest

import nvfp4
from reference import (
    activation,
    decode,
    dual16_gate,
    gemm16_ref,
    operand,
    round_bits,
    to_blocked,
    within_tolerance,
)

KINDS = ["numpy-float16", "torch-float16", "torch-bfloat16"]


@pytest.fixture
def rng():
    return np.random.default_rng(16)


def dtype_of(kind):
    return kind.split("-")[1]


def make(kind, x64):
    """The activation as ``kind`` holds it (exact: the test data is representable)."""
    if kind == "numpy-float16":
        return x64.astype(np.float16)
    torch = pytest.importorskip("torch")
    return torch.from_numpy(np.ascontiguousarray(x64)).to(getattr(torch, dtype_of(kind)))


def poisoned(kind, shape):
    if kind == "numpy-float16":
        return np.full(shape, np.nan, np.float16)
    torch = pytest.importorskip("torch")
    return torch.full(shape, float("nan"), dtype=getattr(torch, dtype_of(kind)))


def bits(t):
    """A float16/bfloat16 result's bits as NumPy uint16."""
    if isinstance(t, np.ndarray):
        return t.view(np.uint16)
    import torch

    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def dtype_name(t):
    return str(t.dtype).replace("torch.", "")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m,n,k,l", [(1, 1, 16, 1), (40, 72, 256, 1), (128, 96, 512, 2), (7, 130, 48, 3)])
def test_gemm_bit_identical(rng, kind, m, n, k, l):
    x64 = activation(rng, (l, m, k))
    w, sfw = operand(rng, l, n, k)
    x = make(kind, x64)
    want = round_bits(gemm16_ref(x64, w, sfw, 0.5), dtype_of(kind))
    out = poisoned(kind, (l, m, n))
    got = nvfp4.gemm(x, None, w, sfw, alpha=0.5, out=out)
    assert got is out
    np.testing.assert_array_equal(bits(got), want)
    # A new output takes the activation's dtype; blocked weight scales read the same.
    new = nvfp4.gemm(x, None, w, to_blocked(sfw), alpha=0.5)
    assert dtype_name(new) == dtype_of(kind) and tuple(new.shape) == (l, m, n)
    np.testing.assert_array_equal(bits(new), want)
    flat = nvfp4.gemm(x[0], None, w[0], sfw[0], alpha=0.5)  # 2-D in, 2-D out
    assert tuple(flat.shape) == (m, n)
    np.testing.assert_array_equal(bits(flat), want[0])


@pytest.mark.parametrize("kind", KINDS)
def test_gemm_output_dtype_follows_the_request(rng, kind):
    x64 = activation(rng, (33, 64))
    w, sfw = operand(rng, 1, 24, 64)
    x, ref = make(kind, x64), gemm16_ref(x64, w[0], sfw[0])
    other = "bfloat16" if dtype_of(kind) == "float16" else "float16"
    if other == "bfloat16":
        pytest.importorskip("torch")
    got = nvfp4.gemm(x, None, w[0], sfw[0], out_dtype=other)
    assert dtype_name(got) == other
    np.testing.assert_array_equal(bits(got), round_bits(ref, other))


@pytest.mark.parametrize("kind", KINDS)
def test_gemv_bit_identical(rng, kind):
    l, m, k = 2, 300, 1024
    w, sfw = operand(rng, l, m, k, (0.0, 1.0, 2.0), byte_max=4)
    x64 = activation(rng, (l, 1, k))
    x = make(kind, x64)
    ref = np.matmul(decode(w, sfw), np.swapaxes(x64, -1, -2)) * np.float64(np.float32(0.25))  # [L, M, 1]
    want = round_bits(ref, dtype_of(kind))
    got = nvfp4.gemv(w, sfw, x, None, alpha=0.25, out=poisoned(kind, (l, m, 1)))
    np.testing.assert_array_equal(bits(got), want)
    new = nvfp4.gemv(w, to_blocked(sfw), x, None, alpha=0.25)  # any weight scale layout
    assert dtype_name(new) == dtype_of(kind) and tuple(new.shape) == (l, m, 1)
    np.testing.assert_array_equal(bits(new), want)
    flat = nvfp4.gemv(w[1], sfw[1], x[1], None, alpha=0.25)  # matrix [M, K/2], vector [1, K]
    assert tuple(flat.shape) == (m, 1)
    np.testing.assert_array_equal(bits(flat), want[1])


@pytest.mark.parametrize("kind", KINDS)
def test_dual_gemm_gate_in_float32(rng, kind):
    l, m, n, k = 2, 40, 48, 256
    x64 = activation(rng, (l, m, k), exps=(-3, -2))
    w1, s1 = operand(rng, l, n, k, (0.5, 1.0))
    w2, s2 = operand(rng, l, n, k, (0.5, 1.0))
    x = make(kind, x64)
    got = nvfp4.dual_gemm(x, None, w1, s1, w2, s2, alpha=0.5, out=poisoned(kind, (l, m, n)))
    want = round_bits(dual16_gate(x64, w1, s1, w2, s2, 0.5), dtype_of(kind))
    # Two float32 exp implementations may differ by one ulp, so the gate may too.
    diff = np.abs(bits(got).astype(np.int32) - want.astype(np.int32))
    assert diff.max() <= 1 and np.mean(diff) < 0.01
    new = nvfp4.dual_gemm(x, None, w1, to_blocked(s1), w2, to_blocked(s2), alpha=0.5)
    assert dtype_name(new) == dtype_of(kind)
    np.testing.assert_array_equal(bits(new), bits(got))


@pytest.mark.parametrize("kind", KINDS)
def test_grouped_list_bit_identical(rng, kind):
    shapes = [(40, 128, 256), (56, 384, 64), (3, 256, 128)]
    alphas = [2.0, 0.5, 0.25]
    groups, wants = [], []
    for (m, n, k), al in zip(shapes, alphas):
        x64 = activation(rng, (m, k))
        w, sfw = operand(rng, 1, n, k, (1.0, 2.0))
        groups.append((make(kind, x64), None, w[0], sfw[0]))
        wants.append(round_bits(gemm16_ref(x64, w[0], sfw[0], al), dtype_of(kind)))
    outs = nvfp4.grouped_gemm(groups, alpha=alphas, out=[poisoned(kind, (m, n)) for m, n, _ in shapes])
    for got, want in zip(outs, wants):
        np.testing.assert_array_equal(bits(got), want)
    again = nvfp4.grouped_gemm(groups, alpha=alphas)
    for got, want in zip(again, wants):
        assert dtype_name(got) == dtype_of(kind)
        np.testing.assert_array_equal(bits(got), want)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "t,ends",
    [
        (100, [30, 30, 70, 90]),  # expert 1 without tokens, rows 90..99 routed to none
        (77, [0, 77, 77, 77]),
        (16, [0, 0, 0, 0]),  # no token routed
    ],
)
def test_moe_bit_identical(rng, kind, t, ends):
    e, n, k = 4, 48, 256
    x64 = activation(rng, (t, k))
    w, sfw = operand(rng, e, n, k)
    x, offs = make(kind, x64), np.array(ends, np.int32)
    want = poisoned(kind, (t, n))
    want = bits(want).copy()
    start = 0
    for ex, end in enumerate(ends):
        if end > start:
            want[start:end] = round_bits(gemm16_ref(x64[start:end], w[ex], sfw[ex], 0.5), dtype_of(kind))
        start = end
    out = poisoned(kind, (t, n))
    got = nvfp4.grouped_gemm((x, None, w, sfw), offsets=offs, alpha=0.5, out=out)
    assert got is out
    np.testing.assert_array_equal(bits(got), want)  # rows of no expert keep their NaN
    new = nvfp4.grouped_gemm([(x[None], None, w, to_blocked(sfw))], offsets=offs, alpha=0.5)
    assert tuple(new.shape) == (1, t, n) and dtype_name(new) == dtype_of(kind)
    routed = ends[-1]
    np.testing.assert_array_equal(bits(new[0])[:routed], want[:routed])
    assert not bits(new[0])[routed:].any()  # zeros in a new output


def test_gaussian_bf16_within_half_an_ulp():
    """The random tier: Gaussian bfloat16 activations and a quantized Gaussian weight, against the
    float64 product: rounded once, so within half a bfloat16 ulp (2^-8 relative: 8 significant bits) everywhere."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(64, 512, generator=gen).to(torch.bfloat16)
    w = torch.randn(96, 512, generator=gen) * 0.02
    wv, ws, wg = nvfp4.quantize(w)
    got = nvfp4.gemm(x, None, wv, ws, alpha=float(wg[0]))
    ref = x.double().numpy() @ decode(wv.numpy(), ws.view(torch.uint8).numpy()).T * np.float64(wg[0].item())
    err = np.abs(got.double().numpy() - ref)
    assert got.dtype == torch.bfloat16
    assert np.all(err <= 2.0**-8 * np.abs(ref))
    f16 = nvfp4.gemm(x.half(), None, wv, ws, alpha=float(wg[0]))
    ref16 = x.half().double().numpy() @ decode(wv.numpy(), ws.view(torch.uint8).numpy()).T * np.float64(wg[0].item())
    assert f16.dtype == torch.float16 and within_tolerance(f16.numpy(), ref16)


# ---- errors -------------------------------------------------------------------------------------


def weight(rng, rows=8, k=64, l=None):
    w, s = operand(rng, l or 1, rows, k)
    return (w, s) if l else (w[0], s[0])


def test_a_float32_activation_is_a_dtype_error_naming_the_rule(rng):
    w, sfw = weight(rng)
    x = np.zeros((4, 64), np.float32)
    rule = r"a dense activation \({}=None, W4A16\) must be float16 or bfloat16, got float32"
    with pytest.raises(nvfp4.DtypeError, match="^a: " + rule.format("sfa")) as e:
        nvfp4.gemm(x, None, w, sfw)
    assert isinstance(e.value, TypeError) and isinstance(e.value, ValueError)
    with pytest.raises(TypeError, match="^b: " + rule.format("sfb")):
        nvfp4.gemv(w, sfw, x[:1], None)
    with pytest.raises(TypeError, match="^a: " + rule.format("sfa")):
        nvfp4.dual_gemm(x, None, w, sfw, w, sfw)
    with pytest.raises(TypeError, match=re.escape("groups[1].a: a dense activation (groups[1].sfa=None")):
        nvfp4.grouped_gemm([(x.astype(np.float16), None, w, sfw), (x, None, w, sfw)])
    we, se = weight(rng, l=2)
    with pytest.raises(TypeError, match="^a: " + rule.format("sfa")):
        nvfp4.grouped_gemm((x, None, we, se), offsets=np.array([2, 4], np.int32))
    with pytest.raises(nvfp4.DtypeError, match="got float64"):
        nvfp4.gemm(x.astype(np.float64), None, w, sfw)


def test_scales_and_modes_that_do_not_match(rng):
    w, sfw = weight(rng)
    x = np.zeros((4, 64), np.float16)
    # A 16-bit activation given scales: the message says to pass None.
    with pytest.raises(nvfp4.DtypeError, match=re.escape("a dense float16 activation takes sfa=None: W4A16")):
        nvfp4.gemm(x, sfw[:4].copy(), w, sfw)
    with pytest.raises(nvfp4.DtypeError, match=re.escape("a dense float16 activation takes sfb=None: W4A16")):
        nvfp4.gemv(w, sfw, x[:1], sfw[:1].copy())
    # NVFP4 values without their scales.
    with pytest.raises(nvfp4.DtypeError, match="^a: uint8 values with sfa=None: an NVFP4 activation needs its scales"):
        nvfp4.gemm(w, None, w, sfw)
    # One launch runs one mode.
    with pytest.raises(ValueError, match="group 1's activation is W4A4, group 0's is W4A16 \\(float16\\): one launch"):
        nvfp4.grouped_gemm([(x, None, w, sfw), (w, sfw, w, sfw)])
    with pytest.raises(ValueError, match="group 1's activation is W4A16 \\(float16\\), group 0's is W4A4"):
        nvfp4.grouped_gemm([(w, sfw, w, sfw), (x, None, w, sfw)])


def test_mixed_activation_dtypes_in_one_group_list(rng):
    torch = pytest.importorskip("torch")
    w, sfw = weight(rng)
    x = torch.zeros(4, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=re.escape("group 1's activation is W4A16 (bfloat16), group 0's is W4A16 (float16)")):
        nvfp4.grouped_gemm([(x, None, w, sfw), (x.bfloat16(), None, w, sfw)])


def test_shapes(rng):
    w, sfw = weight(rng)
    x = np.zeros((4, 64), np.float16)
    with pytest.raises(ValueError, match=re.escape("reduction lengths differ (K = 128 vs 64)")):
        nvfp4.gemm(np.zeros((4, 128), np.float16), None, w, sfw)
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4.gemm(np.zeros((4, 40), np.float16), None, w, sfw)
    shape_rule = r"^a: a dense activation must be \[rows, K\] or \[L, rows, K\], got shape \[64\]$"
    with pytest.raises(ValueError, match=shape_rule):  # the Python layer, allocating the output
        nvfp4.gemm(x[0], None, w, sfw)
    with pytest.raises(ValueError, match=shape_rule):  # the native module, given one
        nvfp4.gemm(x[0], None, w, sfw, out=np.zeros((4, 8), np.float16))
    with pytest.raises(ValueError, match=r"^a: shape \[0, 64\] has a zero dimension$"):
        nvfp4.gemm(x[:0], None, w, sfw)
    with pytest.raises(ValueError, match="one row per batch, has 4"):
        nvfp4.gemv(w, sfw, x, None)
    with pytest.raises(ValueError, match=re.escape("batch counts differ (L = 2 vs 1)")):
        nvfp4.gemm(np.zeros((2, 4, 64), np.float16), None, w[None], sfw[None])
    with pytest.raises(ValueError, match="shape"):
        nvfp4.gemm(x, None, w, sfw, out=np.zeros((4, 9), np.float16))
    we, se = weight(rng, l=2)
    offs = np.array([2, 4], np.int32)
    with pytest.raises(ValueError, match=re.escape("moe gemm: a must be [T, K] or [1, T, K] (the tokens")):
        nvfp4.grouped_gemm((np.zeros((2, 4, 64), np.float16), None, we, se), offsets=offs)
    with pytest.raises(ValueError, match="reduction lengths"):
        nvfp4.grouped_gemm((np.zeros((4, 128), np.float16), None, we, se), offsets=offs)


def test_contiguity_output_and_alpha_rules(rng):
    w, sfw = weight(rng, k=128)
    x = np.zeros((4, 256), np.float16)
    with pytest.raises(ValueError, match="contiguous"):
        nvfp4.gemm(x[:, ::2], None, w, sfw)
    with pytest.raises(nvfp4.DtypeError, match="the output must be float16 or bfloat16, got float32"):
        nvfp4.gemm(x[:, :128].copy(), None, w, sfw, out=np.zeros((4, 8), np.float32))
    with pytest.raises(ValueError, match="float16 or bfloat16, got float32"):
        nvfp4.gemm(x[:, :128].copy(), None, w, sfw, out_dtype="float32")
    with pytest.raises(ValueError, match="out_dtype is bfloat16 but out= holds float16"):
        nvfp4.gemm(x[:, :128].copy(), None, w, sfw, out=np.zeros((4, 8), np.float16), out_dtype="bfloat16")
    for alpha, needle in [(1e-50, "rounds to 0"), (1e39, "overflows"), (float("nan"), "finite")]:
        with pytest.raises(ValueError, match=needle):
            nvfp4.gemm(x[:, :128].copy(), None, w, sfw, alpha=alpha)
