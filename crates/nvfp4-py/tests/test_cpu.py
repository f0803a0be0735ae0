"""CPU suite of the Python package: NumPy arrays through DLPack on the CPU backend, every
operation against a NumPy float64 reference (bit-identical where SPEC §4 says so), and every
error the binding reports. Needs neither a GPU nor torch."""

import re

import numpy as np
import pytest

import nvfp4
from reference import bf16_bits, decode, dual_ref, gemm_ref, operand, to_blocked, within_tolerance


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def poisoned(shape):
    return np.full(shape, np.nan, dtype=np.float16)


@pytest.mark.parametrize("m,n,k,l", [(1, 1, 16, 1), (40, 72, 256, 1), (128, 96, 512, 2), (7, 130, 48, 3)])
def test_gemm_bit_identical(rng, m, n, k, l):
    a, sfa = operand(rng, l, m, k)
    b, sfb = operand(rng, l, n, k)
    out = poisoned((l, m, n))
    got = nvfp4.gemm(a, sfa, b, sfb, out=out)
    assert got is out
    np.testing.assert_array_equal(got.view(np.uint16), gemm_ref(a, sfa, b, sfb).view(np.uint16))


def test_gemm_2d_alpha_and_blocked(rng):
    a, sfa = operand(rng, 1, 130, 320)
    b, sfb = operand(rng, 1, 33, 320)
    ref = gemm_ref(a[0], sfa[0], b[0], sfb[0], alpha=0.25)
    got = nvfp4.gemm(a[0], sfa[0], b[0], sfb[0], alpha=0.25)
    assert got.shape == (130, 33) and got.dtype == np.float16
    np.testing.assert_array_equal(got.view(np.uint16), ref.view(np.uint16))
    blk = nvfp4.gemm(a, to_blocked(sfa), b, to_blocked(sfb), alpha=0.25)
    np.testing.assert_array_equal(blk[0].view(np.uint16), ref.view(np.uint16))
    flat = nvfp4.gemm(a, to_blocked(sfa).ravel(), b, sfb, alpha=0.25, layout=None)
    np.testing.assert_array_equal(flat[0].view(np.uint16), ref.view(np.uint16))


def test_gemv_bit_identical(rng):
    l, m, k = 2, 300, 1024
    a, sfa = operand(rng, l, m, k, (0.0, 1.0, 2.0), byte_max=4)
    b, sfb = operand(rng, l, 1, k, (0.0, 1.0, 2.0), byte_max=4)
    got = nvfp4.gemv(a, sfa, b, sfb, out=poisoned((l, m, 1)))
    np.testing.assert_array_equal(got.view(np.uint16), gemm_ref(a, sfa, b, sfb).view(np.uint16))
    blk = nvfp4.gemv(a, to_blocked(sfa), b, to_blocked(sfb))
    np.testing.assert_array_equal(blk.view(np.uint16), got.view(np.uint16))


def test_dual_gemm_tolerance(rng):
    l, m, n, k = 1, 64, 48, 256
    a, sfa = operand(rng, l, m, k, (0.5, 1.0))
    b1, sfb1 = operand(rng, l, n, k, (0.5, 1.0))
    b2, sfb2 = operand(rng, l, n, k, (0.5, 1.0))
    a &= 0xBB
    b1 &= 0xBB
    b2 &= 0xBB
    got = nvfp4.dual_gemm(a, sfa, b1, sfb1, b2, sfb2, alpha=0.5, out=poisoned((l, m, n)))
    assert within_tolerance(got, dual_ref(a, sfa, b1, sfb1, b2, sfb2, alpha=0.5))


def test_grouped_gemm_bit_identical(rng):
    shapes = [(40, 128, 256), (56, 384, 64), (384, 256, 128)]
    groups, refs = [], []
    for m, n, k in shapes:
        a, sfa = operand(rng, 1, m, k, (1.0, 2.0))
        b, sfb = operand(rng, 1, n, k, (1.0, 2.0))
        groups.append((a[0], sfa[0], b[0], sfb[0]))
        refs.append(gemm_ref(a[0], sfa[0], b[0], sfb[0], alpha=2.0))
    outs = nvfp4.grouped_gemm(groups, alpha=[2.0, 2.0, 2.0], out=[poisoned((m, n)) for m, n, _ in shapes])
    for got, ref in zip(outs, refs):
        np.testing.assert_array_equal(got.view(np.uint16), ref.view(np.uint16))
    again = nvfp4.grouped_gemm(groups, alpha=2.0)
    for got, ref in zip(again, refs):
        np.testing.assert_array_equal(got.view(np.uint16), ref.view(np.uint16))


def moe_ref(a, sfa, b, sfb, offsets, out, alpha=1.0):
    """Each expert's rows of a against its weight (gemm_ref), written into a copy of ``out``."""
    want = out.copy()
    start = 0
    for e, end in enumerate(offsets):
        if end > start:
            want[..., start:end, :] = gemm_ref(a[..., start:end, :], sfa[..., start:end, :], b[e], sfb[e], alpha)
        start = end
    return want


@pytest.mark.parametrize(
    "t,offsets",
    [
        (100, [30, 30, 70, 90]),  # expert 1 without tokens, rows 90..99 routed to none
        (77, [0, 77, 77, 77]),  # one expert with every token
        (16, [0, 0, 0, 0]),  # no token routed
        (1, [1, 1, 1, 1]),
    ],
)
def test_moe_bit_identical(rng, t, offsets):
    e, n, k = 4, 48, 256
    a, sfa = operand(rng, 1, t, k)
    b, sfb = operand(rng, e, n, k)
    offs = np.array(offsets, dtype=np.int32)
    out = poisoned((t, n))
    got = nvfp4.grouped_gemm((a[0], sfa[0], b, sfb), offsets=offs, alpha=0.5, out=out)
    assert got is out
    want = moe_ref(a[0], sfa[0], b, sfb, offsets, poisoned((t, n)), alpha=0.5)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))  # NaN rows untouched
    new = nvfp4.grouped_gemm([(a, sfa, b, sfb)], offsets=offs, alpha=0.5)
    assert new.shape == (1, t, n)
    zero = moe_ref(a[0], sfa[0], b, sfb, offsets, np.zeros((t, n), np.float16), alpha=0.5)
    np.testing.assert_array_equal(new[0].view(np.uint16), zero.view(np.uint16))
    blk = nvfp4.grouped_gemm((a, to_blocked(sfa), b, to_blocked(sfb)), offsets=offs, alpha=0.5)
    np.testing.assert_array_equal(blk.view(np.uint16), new.view(np.uint16))


def test_moe_errors(rng):
    t, e, n, k = 24, 3, 16, 64
    a, sfa = operand(rng, 1, t, k)
    b, sfb = operand(rng, e, n, k)
    a, sfa = a[0], sfa[0]
    offs = np.array([8, 16, 24], dtype=np.int32)
    with pytest.raises(ValueError, match="int32"):
        nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=offs.astype(np.int64))
    with pytest.raises(ValueError, match=r"offsets: must be \[E\] = \[3\]"):
        nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=offs[:2].copy())
    with pytest.raises(ValueError, match="must not decrease"):
        nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=np.array([8, 4, 24], dtype=np.int32))
    with pytest.raises(ValueError, match="outside"):
        nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=np.array([8, 16, 25], dtype=np.int32))
    b2, sfb2 = operand(rng, e, n, 2 * k)
    with pytest.raises(ValueError, match="reduction lengths"):
        nvfp4.grouped_gemm((a, sfa, b2, sfb2), offsets=offs)
    with pytest.raises(ValueError, match=r"\[E, N, K/2\]"):
        nvfp4.grouped_gemm((a, sfa, b[0], sfb[0]), offsets=offs)
    with pytest.raises(ValueError, match=r"\[E, N, K/2\]"):
        nvfp4.grouped_gemm((a, sfa, b[0], sfb[0]), offsets=offs, out=np.zeros((t, n), np.float16))
    with pytest.raises(ValueError, match=r"\[T, K/2\]"):
        nvfp4.grouped_gemm((np.stack([a, a]), np.stack([sfa, sfa]), b, sfb), offsets=offs)
    with pytest.raises(ValueError, match="shape"):
        nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=offs, out=np.zeros((t, n + 1), np.float16))
    with pytest.raises(TypeError, match="offsets"):
        nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=[8, 16, 24])
    with pytest.raises(TypeError, match="one tuple"):
        nvfp4.grouped_gemm([(a, sfa, b, sfb), (a, sfa, b, sfb)], offsets=offs)
    with pytest.raises(TypeError, match="alpha must be a float, a sequence of floats"):
        nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=offs, alpha="half")
    with pytest.raises(ValueError, match="2 alphas for E = 3 experts"):
        nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=offs, alpha=[1.0, 2.0])
    with pytest.raises(ValueError, match="alpha"):
        nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=offs, alpha=float("nan"))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_quantize_modelopt(rng, dtype):
    x = (rng.standard_normal((96, 256)) * 3).astype(dtype)
    values, scales, g = nvfp4.quantize(x)
    amax = np.abs(x.astype(np.float32)).max()
    assert g.dtype == np.float32 and g.shape == (1,)
    assert g[0] == np.float32(amax) / np.float32(2688.0)
    assert values.shape == (96, 128) and scales.shape == (96, 16)
    back = decode(values, scales) * np.float64(g[0])
    err = np.abs(back - x.astype(np.float64))
    # Half the largest E2M1 step (2) at the block's scale (about amax / 6, within E4M3's 1/16).
    blocks = np.abs(x.astype(np.float64)).reshape(96, 16, 16).max(-1, keepdims=True)
    assert np.all(err.reshape(96, 16, 16) <= blocks / 6 * 1.07)
    v2, s2, g2 = nvfp4.quantize(x, layout="blocked")
    np.testing.assert_array_equal(v2, values)
    np.testing.assert_array_equal(s2.reshape(1, 1, 4, 512), to_blocked(scales[None]))
    assert g2[0] == g[0]
    v3, s3, g3 = nvfp4.quantize(x, global_scale=0.5)
    assert g3[0] == 0.5
    v4, s4, _ = nvfp4.quantize(x, global_scale=np.array([0.5], dtype=np.float32))
    np.testing.assert_array_equal(v4, v3)
    np.testing.assert_array_equal(s4, s3)


def test_quantize_then_gemm_matches_dequantized(rng):
    x = rng.standard_normal((32, 128)).astype(np.float32)
    w = rng.standard_normal((16, 128)).astype(np.float32)
    xa, xs, xg = nvfp4.quantize(x)
    wa, ws, wg = nvfp4.quantize(w)
    alpha = float(xg[0] * wg[0])
    got = nvfp4.gemm(xa, xs, wa, ws, alpha=alpha)
    ref = (decode(xa, xs) @ decode(wa, ws).T * np.float64(np.float32(alpha))).astype(np.float16)
    assert within_tolerance(got, ref)


@pytest.mark.parametrize("bad,shown", [(np.nan, "NaN"), (np.inf, "inf"), (-np.inf, "-inf")])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_quantize_refuses_nan_and_inf_naming_the_element(bad, shown, dtype):
    x = np.ones((3, 2, 32), dtype)  # [L, rows, K]
    x[1, 0, 17] = bad  # element 1 * 64 + 0 * 32 + 17
    x[2, 1, 31] = np.nan  # a later one is not the one named
    want = f"element 81 ([l, row, k] = [1, 0, 17]) is {shown}: NVFP4 has no NaN or infinity"
    values = np.full((3, 2, 16), 0xAB, np.uint8)
    scales = np.full((3, 2, 2), 0xCD, np.uint8)
    glob = np.full(1, 7.0, np.float32)
    for kw in ({}, {"check_finite": True}, {"global_scale": 0.5}, {"layout": "blocked"}):
        with pytest.raises(ValueError, match=re.escape(want)):
            nvfp4.quantize(x, **kw)
    with pytest.raises(ValueError, match=re.escape(want)):
        nvfp4.quantize(x, out=(values, scales, glob))
    # Nothing written.
    assert (values == 0xAB).all() and (scales == 0xCD).all() and glob[0] == 7.0


def test_quantize_tiny_amax_gives_the_smallest_normal_global_scale():
    tiny = np.finfo(np.float32).tiny  # 2**-126
    v, s, g = nvfp4.quantize(np.full((2, 32), 1e-44, np.float32))  # amax / 2688 underflows to 0
    assert g[0] == tiny
    assert not v.any() and not s.any()
    # amax 2**-130: scale e4m3(2**-130 / 6 / 2**-126) = 5 * 2**-9 (code 5), s = 5 * 2**-135;
    # quotients 6.4 -> 6 (code 7), 3.2 -> 3 (code 5), -1.6 -> -1.5 (code 11).
    y = np.zeros((1, 16), np.float32)
    y[0, :3] = [2.0**-130, 2.0**-131, -(2.0**-132)]
    v, s, g = nvfp4.quantize(y)
    assert g[0] == tiny and s[0, 0] == 5
    np.testing.assert_array_equal(v[0], [0x57, 0x0B, 0, 0, 0, 0, 0, 0])


# ---- bfloat16 output (NumPy has no bfloat16: the results are CPU torch tensors) ------------------


def test_bf16_reference_rounds_once():
    one_up = 1 + 2.0**-7
    x = np.array([1 + 2.0**-8, 1 + 2.0**-8 + 2.0**-40, -(1 + 2.0**-8 + 2.0**-12), 70000.0, 2.0**18 * 441, 0.0])
    want = np.array([1.0, one_up, -one_up, 70144.0, 2.0**18 * 440, 0.0], dtype=np.float32)
    np.testing.assert_array_equal(bf16_bits(x), (want.view(np.uint32) >> 16).astype(np.uint16))


def test_bf16_without_torch_is_a_clear_error(rng):
    try:
        import torch  # noqa: F401

        pytest.skip("torch is installed: NumPy operands get a torch bfloat16 result")
    except ImportError:
        pass
    a, sfa = small(rng)
    with pytest.raises(ValueError, match="needs torch"):
        nvfp4.gemm(a, sfa, a, sfa, out_dtype="bfloat16")


def bits16(t):
    """A CPU torch bfloat16 tensor's bits as NumPy uint16."""
    import torch

    return t.view(torch.int16).numpy().view(np.uint16)


def test_bf16_every_operation(rng):
    torch = pytest.importorskip("torch")

    def ref64(a, sfa, b, sfb, alpha=1.0):
        return decode(a, sfa) @ np.swapaxes(decode(b, sfb), -1, -2) * alpha

    a, sfa = operand(rng, 2, 40, 256)
    b, sfb = operand(rng, 2, 72, 256)
    got = nvfp4.gemm(a, sfa, b, sfb, alpha=1 / 3, out_dtype=torch.bfloat16)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16 and got.shape == (2, 40, 72)
    np.testing.assert_array_equal(bits16(got), bf16_bits(ref64(a, sfa, b, sfb, np.float64(np.float32(1 / 3)))))
    out = torch.full((2, 40, 72), float("nan"), dtype=torch.bfloat16)
    assert nvfp4.gemm(a, sfa, b, to_blocked(sfb), out=out) is out
    np.testing.assert_array_equal(bits16(out), bf16_bits(ref64(a, sfa, b, sfb)))
    v, sv = operand(rng, 2, 1, 256, (0.0, 1.0, 2.0), byte_max=4)
    gv = nvfp4.gemv(a, sfa, v, sv, out_dtype="bfloat16")
    np.testing.assert_array_equal(bits16(gv), bf16_bits(ref64(a, sfa, v, sv)))
    groups = [(a[0], sfa[0], b[0], sfb[0]), (b[1], sfb[1], a[1], sfa[1])]
    outs = nvfp4.grouped_gemm(groups, alpha=[2.0, 0.5], out_dtype=torch.bfloat16)
    for o, (x, sx, y, sy), al in zip(outs, groups, (2.0, 0.5)):
        np.testing.assert_array_equal(bits16(o), bf16_bits(ref64(x, sx, y, sy, al)))
    mixed = [np.empty((40, 72), np.float16), torch.empty(72, 40, dtype=torch.bfloat16)]  # one list, two dtypes
    nvfp4.grouped_gemm(groups, alpha=[2.0, 0.5], out=mixed)
    np.testing.assert_array_equal(mixed[0].view(np.uint16), gemm_ref(*groups[0], alpha=2.0).view(np.uint16))
    np.testing.assert_array_equal(bits16(mixed[1]), bits16(outs[1]))
    # f16 overflows here (16 * 2688^2 = 2^18 * 441); bf16 holds it (2^18 * 440, a tie to even).
    big = np.full((1, 8), 0x77, np.uint8)  # E2M1 6, 6
    s448 = np.full((1, 1), 0x7E, np.uint8)
    assert np.isinf(nvfp4.gemm(big, s448, big, s448)[0, 0])
    assert bits16(nvfp4.gemm(big, s448, big, s448, out_dtype=torch.bfloat16))[0, 0] == bf16_bits(2.0**18 * 441)
    # The dual GEMM: the f32 gate rounded once; two f32 exp implementations may differ by one ulp.
    a2, b1, b2 = a & 0xBB, b & 0xBB, b[:, ::-1].copy() & 0xBB
    d = nvfp4.dual_gemm(a2, sfa, b1, sfb, b2, sfb, alpha=0.5, out_dtype=torch.bfloat16)
    want = bf16_bits(_dual64(a2, sfa, b1, sfb, b2, sfb, 0.5))
    diff = np.abs(bits16(d).astype(np.int32) - want.astype(np.int32))
    assert diff.max() <= 1 and np.mean(diff) < 0.01


def test_bf16_moe(rng):
    torch = pytest.importorskip("torch")
    t, e, n, k = 40, 4, 48, 256
    a, sfa = operand(rng, 1, t, k)
    b, sfb = operand(rng, e, n, k)
    ends = [5, 5, 22, 36]  # an empty expert; rows 36.. routed to none
    out = torch.full((t, n), float("nan"), dtype=torch.bfloat16)
    got = nvfp4.grouped_gemm((a[0], sfa[0], b, sfb), offsets=np.array(ends, np.int32), alpha=2.0, out=out)
    assert got is out and torch.isnan(out[36:]).all()  # rows of no expert untouched
    start = 0
    for x, end in enumerate(ends):
        rows = decode(a[0, start:end], sfa[0, start:end]) @ decode(b[x], sfb[x]).T * 2.0
        np.testing.assert_array_equal(bits16(got[start:end]), bf16_bits(rows))
        start = end
    new = nvfp4.grouped_gemm((a[0], sfa[0], b, sfb), offsets=np.array(ends, np.int32), alpha=2.0, out_dtype="bfloat16")
    assert new.dtype == torch.bfloat16 and (new[36:] == 0).all()
    np.testing.assert_array_equal(bits16(new[:36]), bits16(got[:36]))


def _dual64(a, sfa, b1, sfb1, b2, sfb2, alpha):
    """The dual GEMM's gate in float32 as SPEC §3 has it (e^-x overflows to inf for x < -88: the
    gate is then -0), as float64."""
    da = decode(a, sfa)
    x1 = (da @ np.swapaxes(decode(b1, sfb1), -1, -2)).astype(np.float32) * np.float32(alpha)
    x2 = (da @ np.swapaxes(decode(b2, sfb2), -1, -2)).astype(np.float32) * np.float32(alpha)
    with np.errstate(over="ignore"):
        return (x1 / (np.float32(1) + np.exp(-x1)) * x2).astype(np.float64)


# ---- errors -------------------------------------------------------------------------------------


def small(rng, rows=8, k=64):
    a, s = operand(rng, 1, rows, k)
    return a[0], s[0]


def test_error_not_a_tensor(rng):
    a, sfa = small(rng)
    with pytest.raises(TypeError):
        nvfp4.gemm([[1, 2]], sfa, a, sfa)
    with pytest.raises(TypeError):
        nvfp4.gemm(a, sfa, a, sfa, out=[0.0])
    with pytest.raises(TypeError):
        nvfp4.grouped_gemm([(a, sfa)])
    with pytest.raises(TypeError):
        nvfp4.quantize("x")


def test_error_dtypes(rng):
    a, sfa = small(rng)
    with pytest.raises(ValueError, match="uint8"):
        nvfp4.gemm(a.astype(np.float16), sfa, a, sfa)
    with pytest.raises(ValueError, match="scales"):
        nvfp4.gemm(a, sfa.astype(np.int32), a, sfa)
    with pytest.raises(ValueError, match="float16"):
        nvfp4.gemm(a, sfa, a, sfa, out=np.zeros((8, 8), np.float32))
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        nvfp4.gemm(a, sfa, a, sfa, out_dtype="float32")
    with pytest.raises(ValueError, match="out_dtype is bfloat16"):
        nvfp4.gemm(a, sfa, a, sfa, out=np.zeros((8, 8), np.float16), out_dtype="bfloat16")
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        nvfp4.quantize(np.zeros((4, 32), np.int32))


def test_error_shapes(rng):
    a, sfa = small(rng)
    b, sfb = small(rng, 8, 128)
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4.gemm(a[:, :4].copy(), sfa[:, :1].copy(), a[:, :4].copy(), sfa[:, :1].copy())
    with pytest.raises(ValueError, match="reduction lengths"):
        nvfp4.gemm(a, sfa, b, sfb)
    with pytest.raises(ValueError, match="scales"):
        nvfp4.gemm(a, sfa[:, :2].copy(), a, sfa)
    with pytest.raises(ValueError, match="shape"):
        nvfp4.gemm(a, sfa, a, sfa, out=np.zeros((8, 9), np.float16))
    with pytest.raises(ValueError, match="one row"):
        nvfp4.gemv(a, sfa, a, sfa)
    with pytest.raises(ValueError, match="N ="):
        nvfp4.dual_gemm(a, sfa, a, sfa, a[:4].copy(), sfa[:4].copy())
    with pytest.raises(ValueError, match="L = 1"):
        nvfp4.grouped_gemm([(a[None].repeat(2, 0), sfa[None].repeat(2, 0), a[None].repeat(2, 0), sfa[None].repeat(2, 0))])
    with pytest.raises(ValueError, match="no groups"):
        nvfp4.grouped_gemm([])
    with pytest.raises(ValueError, match="1 values for 2 groups"):
        nvfp4.grouped_gemm([(a, sfa, a, sfa)] * 2, alpha=[1.0])
    with pytest.raises(ValueError, match="packed values"):
        nvfp4.gemm(a.ravel(), sfa, a, sfa)
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4.quantize(np.zeros((4, 40), np.float32))


def test_error_layout_alpha_and_offsets(rng):
    a, sfa = small(rng)
    with pytest.raises(ValueError, match="layout"):
        nvfp4.gemm(a, sfa, a, sfa, layout="tiled")
    with pytest.raises(ValueError, match="blocked"):
        nvfp4.gemm(a, sfa, a, sfa, layout="blocked")
    with pytest.raises(ValueError, match="alpha"):
        nvfp4.gemm(a, sfa, a, sfa, alpha=float("inf"))
    with pytest.raises(ValueError, match="global scale"):
        nvfp4.quantize(np.ones((4, 32), np.float32), global_scale=-1.0)


def test_alpha_is_the_librarys_rule_before_f32_rounding(rng):
    # A Python float is wider than the kernels' f32 alpha: a non-zero one must not round to 0
    # (every output silently 0) nor overflow there, on every operation.
    a, sfa = operand(rng, 1, 8, 64)
    b, sfb = operand(rng, 2, 8, 64)
    offs = np.array([4, 8], dtype=np.int32)
    calls = [
        lambda al: nvfp4.gemm(a, sfa, a, sfa, alpha=al),
        lambda al: nvfp4.gemv(a, sfa, a[:, :1], sfa[:, :1], alpha=al),
        lambda al: nvfp4.dual_gemm(a, sfa, a, sfa, a, sfa, alpha=al),
        lambda al: nvfp4.grouped_gemm([(a[0], sfa[0], a[0], sfa[0])], alpha=al),
        lambda al: nvfp4.grouped_gemm([(a[0], sfa[0], a[0], sfa[0])], alpha=[al]),
        lambda al: nvfp4.grouped_gemm((a[0], sfa[0], b, sfb), offsets=offs, alpha=al),
    ]
    for call in calls:
        for alpha, needle in [(1e-50, "rounds to 0"), (-1e-46, "rounds to 0"), (1e39, "overflows"), (float("nan"), "finite")]:
            with pytest.raises(ValueError, match=needle):
                call(alpha)
        # 0 is a value, and the smallest f32 subnormal is not 0.
        assert not np.any(call(0.0)[0])
        call(1e-45)


def test_error_strides_and_read_only(rng):
    a, sfa = operand(rng, 1, 8, 128)
    a, sfa = a[0], sfa[0]
    with pytest.raises(ValueError, match="contiguous"):
        nvfp4.gemm(a[:, ::2], sfa[:, ::2], a[:, ::2], sfa[:, ::2])
    out = np.zeros((8, 8), np.float16)
    out.flags.writeable = False
    with pytest.raises((ValueError, BufferError)):
        nvfp4.gemm(a, sfa, a, sfa, out=out)
    # A transposed (column-major) output is refused, not written wrongly.
    with pytest.raises(ValueError, match="contiguous"):
        nvfp4.gemm(a, sfa, a[:4].copy(), sfa[:4].copy(), out=np.zeros((4, 8), np.float16).T)


def test_version_and_cuda_flag():
    assert isinstance(nvfp4.__version__, str)
    assert nvfp4.cuda_available() in (True, False)
