"""The scale-layout rule through ``nvfp4.torch`` on CPU tensors: the ``torch.ops.nvfp4.*``
operations take ``layout`` (last, after ``out_dtype``), the fake ``quantize`` gives the shapes the
real one returns, and ``dequantize`` reads plain and blocked scales by the operations' rule.
Skipped without torch (CI's CPU suite is NumPy only; the GPU run has torch)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nvfp4  # noqa: E402
import nvfp4.torch as nvt  # noqa: E402
from reference import decode, gemm_ref, operand, to_blocked  # noqa: E402
from torch_ops import op_error  # noqa: E402

AMBIGUOUS = r'reads both as plain and as blocked scales .*layout="plain" or layout="blocked"'


def t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def f16_bits(x):
    return x.view(torch.int16).numpy().view(np.uint16)


def test_ops_take_layout_last():
    rng = np.random.default_rng(6)
    a, sfa = operand(rng, 1, 128, 128)
    b, sfb = operand(rng, 1, 16, 128)
    want = gemm_ref(a[0], sfa[0], b[0], sfb[0], alpha=0.5).view(np.uint16)
    flat = t(sfa[0].ravel()).view(torch.float8_e4m3fn)
    with pytest.raises(op_error("gemm", ValueError), match=AMBIGUOUS):
        torch.ops.nvfp4.gemm(t(a[0]), flat, t(b[0]), t(sfb[0]), 0.5)
    got = torch.ops.nvfp4.gemm(t(a[0]), flat, t(b[0]), t(sfb[0]), 0.5, None, "plain")
    np.testing.assert_array_equal(f16_bits(got), want)
    got = torch.ops.nvfp4.gemm(t(a[0]), t(to_blocked(sfa).ravel()), t(b[0]), t(to_blocked(sfb)), 0.5, layout="blocked")
    np.testing.assert_array_equal(f16_bits(got), want)
    groups = torch.ops.nvfp4.grouped_gemm([t(a[0])], [flat], [t(b[0])], [t(sfb[0])], [0.5], None, "plain")
    np.testing.assert_array_equal(f16_bits(groups[0]), want)
    moe = torch.ops.nvfp4.grouped_gemm_moe(
        t(a[0]), flat, t(b), t(sfb), torch.tensor([128], dtype=torch.int32), 0.5, layout="plain"
    )
    np.testing.assert_array_equal(f16_bits(moe), want)


@pytest.mark.parametrize("shape", [(128, 8192), (2, 40, 256)])
def test_fake_quantize_shapes_are_the_real_ones(shape):
    x = torch.randn(shape)
    for layout in ("plain", "blocked"):
        real = nvfp4.quantize(x, None, layout)
        fake = nvt._quantize_fake(x, None, layout)
        assert [tuple(r.shape) for r in real] == [tuple(f.shape) for f in fake], layout
        assert [r.dtype for r in real] == [f.dtype for f in fake], layout
    _, blocked, _ = nvfp4.quantize(x, layout="blocked")
    assert blocked.dim() == 4


def test_blocked_scales_from_quantize_read_back_under_compile():
    """A traced quantize(layout="blocked") feeding a GEMM of 3-D values: the fake shape is the
    4-D one, which the GEMM reads as blocked (the 3-D [1, 128, 512] would be refused)."""
    torch.manual_seed(2)
    x = torch.randn(128, 8192)
    w = torch.randn(8, 8192)
    wv, ws, wg = nvfp4.quantize(w)
    alpha = float(np.float32(0.01) * wg[0].numpy())

    def f(x, wv, ws):
        q, s, g = torch.ops.nvfp4.quantize(x, 0.01, "blocked")
        return torch.ops.nvfp4.gemm(q[None], s, wv[None], ws[None], alpha)

    eager = f(x, wv, ws)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(x, wv, ws)
    q, s, _ = nvfp4.quantize(x, 0.01)
    want = gemm_ref(q.numpy(), s.view(torch.uint8).numpy(), wv.numpy(), ws.view(torch.uint8).numpy(), alpha)
    np.testing.assert_array_equal(f16_bits(eager[0]), want.view(np.uint16))
    assert torch.equal(eager.view(torch.int16), compiled.view(torch.int16))


def test_dequantize_reads_both_layouts():
    rng = np.random.default_rng(9)
    v, s = operand(rng, 2, 130, 320)
    want = decode(v, s) * 0.25
    plain = nvt.dequantize(t(v), t(s).view(torch.float8_e4m3fn), 0.25, torch.float64)
    np.testing.assert_array_equal(plain.numpy(), want)
    blocked = nvt.dequantize(t(v), t(to_blocked(s)), 0.25, torch.float64)
    np.testing.assert_array_equal(blocked.numpy(), want)
    flat = nvt.dequantize(t(v), t(to_blocked(s).ravel()), 0.25, torch.float64)
    np.testing.assert_array_equal(flat.numpy(), want)
    one = nvt.dequantize(t(v[0]), t(to_blocked(s[:1])), 0.25, torch.float64)
    np.testing.assert_array_equal(one.numpy(), want[0])


def test_dequantize_refuses_to_guess_and_wrong_shapes():
    rng = np.random.default_rng(10)
    v, s = operand(rng, 1, 128, 128)
    with pytest.raises(ValueError, match=AMBIGUOUS):
        nvt.dequantize(t(v[0]), t(s[0].ravel()))
    got = nvt.dequantize(t(v[0]), t(s[0].ravel()), layout="plain", dtype=torch.float64)
    np.testing.assert_array_equal(got.numpy(), decode(v[0], s[0]))
    got = nvt.dequantize(t(v[0]), t(to_blocked(s).ravel()), layout="blocked", dtype=torch.float64)
    np.testing.assert_array_equal(got.numpy(), decode(v[0], s[0]))
    # Scales of another operand would broadcast into wrong values: refused.
    with pytest.raises(ValueError, match=r"must be plain \[128, 8\]"):
        nvt.dequantize(t(v[0]), t(s[0, :1]))
