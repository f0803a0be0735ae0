"""Scale layouts told from shapes (docs/FORMAT.md §2, "Scale shapes in Python"): a shape that reads
only one way is read that way, a shape that reads both ways is refused unless ``layout=`` says
which, and what ``quantize`` returns reads back as what it is. Every operation's operand path, on
NumPy arrays (the CPU backend), against the float64 reference."""

import numpy as np
import pytest

import nvfp4
from reference import gemm_ref, operand, to_blocked

AMBIGUOUS = r'reads both as plain and as blocked scales .*layout="plain" or layout="blocked"'


@pytest.fixture
def rng():
    return np.random.default_rng(19)


def same(got, want):
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))


def test_flat_plain_scales_of_a_blocked_length_need_layout(rng):
    # rows % 128 == 0 and K % 64 == 0: L*rows*K/16 == L*R*C*512, so a 1-D tensor reads both ways.
    a, sfa = operand(rng, 1, 128, 128)
    b, sfb = operand(rng, 1, 8, 128)
    want = gemm_ref(a[0], sfa[0], b[0], sfb[0])
    with pytest.raises(ValueError, match=AMBIGUOUS) as e:
        nvfp4.gemm(a[0], sfa[0].ravel(), b[0], sfb[0])
    assert str(e.value).startswith("sfa: shape [1024]")
    same(nvfp4.gemm(a[0], sfa[0].ravel(), b[0], sfb[0], layout="plain"), want)
    same(nvfp4.gemm(a[0], to_blocked(sfa).ravel(), b[0], to_blocked(sfb), layout="blocked"), want)


def test_flat_scales_of_one_length_read_as_that_layout(rng):
    # 130 rows: the plain length (130*20 = 2600) and the blocked one (2*5*512 = 5120) differ.
    a, sfa = operand(rng, 1, 130, 320)
    b, sfb = operand(rng, 1, 33, 320)
    want = gemm_ref(a[0], sfa[0], b[0], sfb[0])
    same(nvfp4.gemm(a[0], sfa[0].ravel(), b[0], sfb[0]), want)
    same(nvfp4.gemm(a[0], to_blocked(sfa).ravel(), b[0], sfb[0]), want)
    with pytest.raises(ValueError, match=r"must be blocked \[1, 2, 5, 512\] \(or flat \[5120\]\), got \[2600\]"):
        nvfp4.gemm(a[0], sfa[0].ravel(), b[0], sfb[0], layout="blocked")


def test_blocked_scales_from_quantize_read_back_as_blocked():
    # 128 x 8192: blocked scales [R, C, 512] = [1, 128, 512] are also the plain shape of values[None].
    rng = np.random.default_rng(5)
    x = rng.standard_normal((128, 8192)).astype(np.float32)
    w = rng.standard_normal((8, 8192)).astype(np.float32)
    xv, xs, xg = nvfp4.quantize(x)
    xv2, xb, _ = nvfp4.quantize(x, layout="blocked")
    wv, ws, wg = nvfp4.quantize(w)
    assert xb.shape == (1, 1, 128, 512)
    np.testing.assert_array_equal(xb, to_blocked(xs[None]))
    alpha = float(xg[0] * wg[0])
    want = gemm_ref(xv, xs, wv, ws, alpha)
    assert np.isfinite(want).all()
    same(nvfp4.gemm(xv2, xb, wv, ws, alpha=alpha), want)
    same(nvfp4.gemm(xv2[None], xb, wv[None], ws[None], alpha=alpha)[0], want)
    # The 3-D form of the same bytes reads both ways for values [1, 128, 4096].
    with pytest.raises(ValueError, match=AMBIGUOUS):
        nvfp4.gemm(xv2[None], xb[0], wv[None], ws[None], alpha=alpha)
    same(nvfp4.gemm(xv2[None], xb[0], wv[None], to_blocked(ws[None]), alpha=alpha, layout="blocked")[0], want)
    same(nvfp4.gemm(xv[None], xs[None], wv[None], ws[None], alpha=alpha, layout="plain")[0], want)


def test_three_dimensional_blocked_scales_with_one_reading(rng):
    # [R, C, 512] for L = 1 where no plain shape matches: blocked, as before.
    a, sfa = operand(rng, 1, 40, 256)
    b, sfb = operand(rng, 1, 24, 256)
    same(nvfp4.gemm(a, to_blocked(sfa)[0], b, sfb), gemm_ref(a, sfa, b, sfb))


def test_gemv_refuses_to_guess(rng):
    l, m, k = 2, 256, 128
    a, sfa = operand(rng, l, m, k, (0.0, 1.0, 2.0), byte_max=4)
    b, sfb = operand(rng, l, 1, k, (0.0, 1.0, 2.0), byte_max=4)
    with pytest.raises(ValueError, match="^sfa: .*" + AMBIGUOUS):
        nvfp4.gemv(a, sfa.ravel(), b, sfb)
    same(nvfp4.gemv(a, sfa.ravel(), b, sfb, layout="plain"), gemm_ref(a, sfa, b, sfb))


def test_dual_gemm_refuses_to_guess(rng):
    a, sfa = operand(rng, 1, 64, 256, (0.5, 1.0))
    b1, sfb1 = operand(rng, 1, 128, 256, (0.5, 1.0))
    b2, sfb2 = operand(rng, 1, 128, 256, (0.5, 1.0))
    a &= 0xBB
    b1 &= 0xBB
    b2 &= 0xBB
    with pytest.raises(ValueError, match="^sfb1: .*" + AMBIGUOUS):
        nvfp4.dual_gemm(a, sfa, b1, sfb1.ravel(), b2, sfb2)
    plain = nvfp4.dual_gemm(a, sfa, b1, sfb1, b2, sfb2)
    same(nvfp4.dual_gemm(a, sfa, b1, sfb1.ravel(), b2, sfb2, layout="plain"), plain)


def test_grouped_gemm_list_refuses_to_guess(rng):
    a0, sa0 = operand(rng, 1, 40, 128)
    b0, sb0 = operand(rng, 1, 16, 128)
    a1, sa1 = operand(rng, 1, 24, 256)
    b1, sb1 = operand(rng, 1, 128, 256)
    groups = [(a0[0], sa0[0], b0[0], sb0[0]), (a1[0], sa1[0], b1[0], sb1[0].ravel())]
    with pytest.raises(ValueError, match=r"^groups\[1\]\.sfb: .*" + AMBIGUOUS):
        nvfp4.grouped_gemm(groups)
    outs = nvfp4.grouped_gemm(groups, layout="plain")
    same(outs[0], gemm_ref(a0[0], sa0[0], b0[0], sb0[0]))
    same(outs[1], gemm_ref(a1[0], sa1[0], b1[0], sb1[0]))


def test_moe_form_refuses_to_guess():
    # One expert of [128, 4096] packed values: its plain scales [1, 128, 512] are also [R, C, 512].
    rng = np.random.default_rng(3)
    t, e, n, k = 24, 1, 128, 8192
    a, sfa = operand(rng, 1, t, k)
    b, sfb = operand(rng, e, n, k)
    offs = np.array([t], dtype=np.int32)
    with pytest.raises(ValueError, match="^sfb: .*" + AMBIGUOUS):
        nvfp4.grouped_gemm((a[0], sfa[0], b, sfb), offsets=offs)
    got = nvfp4.grouped_gemm((a[0], sfa[0], b, sfb), offsets=offs, layout="plain")
    same(got, gemm_ref(a[0], sfa[0], b[0], sfb[0]))
    blk = nvfp4.grouped_gemm((a[0], to_blocked(sfa), b, to_blocked(sfb)), offsets=offs)
    same(blk, got)


def test_quantize_out_in_either_layout():
    # quantize names its layout (plain by default), so a buffer of a length both layouts share is
    # written as the one asked for.
    rng = np.random.default_rng(8)
    x = rng.standard_normal((128, 256)).astype(np.float32)
    v, s, g = nvfp4.quantize(x)
    flat = np.full(128 * 16, 0xAA, np.uint8)
    out = (np.empty((128, 128), np.uint8), flat, np.empty(1, np.float32))
    nvfp4.quantize(x, out=out)
    np.testing.assert_array_equal(flat, s.ravel())
    nvfp4.quantize(x, layout="blocked", out=out)
    np.testing.assert_array_equal(flat, to_blocked(s[None]).ravel())
    four = np.empty((1, 1, 4, 512), np.uint8)
    nvfp4.quantize(x, layout="blocked", out=(out[0], four, out[2]))
    np.testing.assert_array_equal(four, to_blocked(s[None]))
    with pytest.raises(ValueError, match=r"^scales: .*must be plain \[128, 16\]"):
        nvfp4.quantize(x, out=(out[0], four, out[2]))


def test_scale_layout_rule():
    rule = nvfp4._nvfp4.scale_layout
    assert rule((128, 64), (128, 8)) == "plain"
    assert rule((2, 130, 8), (2, 130, 1)) == "plain"
    assert rule((130, 160), (130 * 20,)) == "plain"
    assert rule((130, 160), (2 * 5 * 512,)) == "blocked"
    assert rule((2, 130, 160), (2, 2, 5, 512)) == "blocked"
    assert rule((1, 40, 128), (1, 4, 512)) == "blocked"
    assert rule((128, 32), (512,), "plain") == "plain"
    with pytest.raises(ValueError, match=AMBIGUOUS):
        rule((128, 32), (512,))
    with pytest.raises(ValueError, match=AMBIGUOUS):
        rule((1, 128, 4096), (1, 128, 512))
    with pytest.raises(ValueError, match="must be plain"):
        rule((128, 64), (1, 1, 2, 512), "plain")
