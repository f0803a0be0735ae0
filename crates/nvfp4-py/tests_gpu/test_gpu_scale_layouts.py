"""The scale-layout rule on CUDA tensors (the CPU suite's tests/test_scale_layouts.py covers it on
NumPy): a shape that reads both ways is refused unless ``layout=`` names one, blocked scales from
the GPU quantizer read back as blocked (eagerly and under torch.compile), and ``dequantize`` reads
both layouts on the device."""

import pytest
import torch

import nvfp4
import nvfp4.torch as nvt
from test_gpu import DEV, bits, operand, ref_gemm, to_blocked

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
AMBIGUOUS = r'reads both as plain and as blocked scales .*layout="plain" or layout="blocked"'


@pytest.fixture
def g():
    return torch.Generator().manual_seed(19)


def test_flat_scales_need_layout_on_the_gpu(g):
    a, sfa = operand(g, 1, 256, 512)
    b, sfb = operand(g, 1, 128, 512)
    want = bits(ref_gemm(a, sfa, b, sfb))
    with pytest.raises(ValueError, match="^sfa: .*" + AMBIGUOUS):
        nvfp4.gemm(a, sfa.reshape(-1), b, sfb)
    assert torch.equal(bits(nvfp4.gemm(a, sfa.reshape(-1), b, sfb, layout="plain")), want)
    blk = nvfp4.gemm(a, to_blocked(sfa).reshape(-1), b, to_blocked(sfb), layout="blocked")
    assert torch.equal(bits(blk), want)
    with pytest.raises(ValueError, match="^sfb: .*" + AMBIGUOUS):
        nvfp4.grouped_gemm((a, sfa, b, sfb.reshape(-1)), offsets=torch.tensor([256], dtype=torch.int32, device=DEV))


def test_gpu_quantizer_blocked_scales_read_back_as_blocked():
    torch.manual_seed(7)
    x = torch.randn(128, 8192, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(64, 8192, device=DEV, dtype=torch.bfloat16)
    xv, xs, xg = nvfp4.quantize(x)
    bv, bs, _ = nvfp4.quantize(x, layout="blocked")
    wv, ws, wg = nvfp4.quantize(w)
    assert bs.shape == (1, 1, 128, 512)
    assert torch.equal(bs.view(torch.uint8), to_blocked(xs[None]).view(torch.uint8))
    alpha = float(xg[0] * wg[0])
    # The plain-scales GEMM of the same values (torch's float64 -> float16 rounds twice, through
    # float32, so a float64 reference times this alpha may differ by an ulp at a near-tie).
    want = bits(nvfp4.gemm(xv, xs, wv, ws, alpha=alpha))
    assert torch.equal(bits(nvfp4.gemm(bv[None], bs, wv[None], ws[None], alpha=alpha)[0]), want)
    with pytest.raises(ValueError, match=AMBIGUOUS):
        nvfp4.gemm(bv[None], bs[0], wv[None], ws[None], alpha=alpha)

    x_global = float(xg[0])

    def f(x, wv, ws):
        q, s, _ = torch.ops.nvfp4.quantize(x, x_global, "blocked")
        return torch.ops.nvfp4.gemm(q[None], s, wv[None], ws[None], alpha)

    compiled = torch.compile(f, fullgraph=True)(x, wv, ws)
    assert torch.equal(bits(compiled[0]), bits(f(x, wv, ws)[0]))
    # dequantize reads the blocked scales on the device as the plain ones.
    assert torch.equal(nvt.dequantize(bv, bs, xg), nvt.dequantize(xv, xs, xg))
    with pytest.raises(ValueError, match=AMBIGUOUS):
        nvt.dequantize(bv[None], bs[0], xg)

