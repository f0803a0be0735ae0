"""Per-expert alphas of the MoE form on the GPU (issue 21, item 4): ``alpha`` a float32 CUDA
tensor [E] (zero-copy, read by the kernel) or a list of E floats, in W4A4 and W4A16 (bfloat16,
float16), both scale layouts, on the skeleton and on the W4A16 fallback (K = 48): bit-identical
to the float64 reference where that is exact (power-of-two alphas) and to the CPU backend for
any alphas, empty experts and rows past the last offset included; a CUDA graph replayed with the
alphas and offsets rewritten in place (capture fails on a host synchronization); the
``torch.ops.nvfp4.grouped_gemm_moe`` overloads; and the errors only a GPU shows."""

import pytest
import torch

import nvfp4
import nvfp4.torch  # noqa: F401 (registers torch.ops.nvfp4)
from test_gpu import DEV, bits, g, operand, ref_gemm, to_blocked  # noqa: F401 (g: the fixture)
from test_w4a16_gpu import exact, poison, ref16, rounded, weights

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

T, ENDS = 300, [40, 40, 100, 172, 172, 250, 251, 290]  # experts 1, 4 empty; rows 290.. routed to none
POW2 = [0.5, 2.0, -0.25, 0.0, 4.0, -1.0, 0.125, 8.0]  # exact reference in float32
ODD = [0.8125, -1.3, 7.0, 0.0, 3.1e-3, -0.71, 1.7, -0.05]  # distinct, any


def spans():
    return list(zip([0] + ENDS[:-1], ENDS))


def ref_w4a4(a, sfa, b, sfb, out, alphas):
    want = out.clone()
    for e, (start, end) in enumerate(spans()):
        if end > start:
            want[start:end] = ref_gemm(a[start:end], sfa[start:end], b[e], sfb[e], alphas[e])
    return want


def ref_w4a16(x, w, plain, out, alphas):
    want = out.clone()
    for e, (start, end) in enumerate(spans()):
        if end > start:
            want[start:end] = rounded(ref16(x[start:end], w[e], plain[e], alphas[e]), out.dtype)
    return want


def f32(alphas):
    return torch.tensor(alphas, dtype=torch.float32, device=DEV)


@pytest.mark.parametrize("layout", ["plain", "blocked"])
def test_w4a4_per_expert_alphas(g, layout):
    e, n, k = len(ENDS), 256, 512
    a, sfa = operand(g, 1, T, k)
    b, plain = operand(g, e, n, k)
    sfb = to_blocked(plain) if layout == "blocked" else plain
    a, sfa, offs = a[0], sfa[0], torch.tensor(ENDS, dtype=torch.int32, device=DEV)
    want = ref_w4a4(a, sfa, b, plain, torch.full((T, n), float("nan"), dtype=torch.float16, device=DEV), POW2)
    for alpha in (f32(POW2), POW2):
        got = nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=offs, alpha=alpha, out=poison((T, n), torch.float16))
        assert torch.equal(bits(got), bits(want)), type(alpha)
    # Any alphas: the GPU gives the CPU backend's bits (the reference of SPEC §4), in both types.
    host = tuple(x.cpu() for x in (a, sfa, b, sfb))
    for dtype in (torch.float16, torch.bfloat16):
        got = nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=offs, alpha=f32(ODD), out_dtype=dtype)
        cpu = nvfp4.grouped_gemm(host, offsets=offs.cpu(), alpha=f32(ODD).cpu(), out_dtype=dtype)
        assert torch.equal(bits(got.cpu()), bits(cpu)), dtype  # zeros past the last offset on both


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["plain", "blocked"])
@pytest.mark.parametrize("k", [512, 48])  # the skeleton; the fallback (K % 32 != 0)
def test_w4a16_per_expert_alphas(g, dtype, layout, k):
    e, n = len(ENDS), 200
    x = exact(g, (T, k), dtype)
    w, sw, plain = weights(g, e, n, k, layout)
    offs = torch.tensor(ENDS, dtype=torch.int32, device=DEV)
    want = ref_w4a16(x, w, plain, poison((T, n), dtype), POW2)
    for alpha in (f32(POW2), POW2):
        got = nvfp4.grouped_gemm((x, None, w, sw), offsets=offs, alpha=alpha, out=poison((T, n), dtype))
        assert torch.equal(bits(got), bits(want)), type(alpha)
    got = nvfp4.grouped_gemm((x, None, w, sw), offsets=offs, alpha=f32(ODD))
    cpu = nvfp4.grouped_gemm((x.cpu(), None, w.cpu(), sw.cpu()), offsets=offs.cpu(), alpha=ODD)
    assert got.dtype == dtype and torch.equal(bits(got.cpu()), bits(cpu))
    op = torch.ops.nvfp4.grouped_gemm_moe(x, None, w, sw, offs, f32(ODD))
    assert torch.equal(bits(op), bits(got))


def test_graph_replays_with_new_alphas_and_offsets(g):
    """The alphas tensor and the offsets captured in a CUDA graph, rewritten between replays:
    each replay computes with the values of that moment (W4A16 bfloat16 and W4A4)."""
    e, n, k = len(ENDS), 384, 256
    x = exact(g, (T, k), torch.bfloat16)
    w, sw, _ = weights(g, e, n, k, "blocked")
    a, sfa = operand(g, 1, T, k)
    b, sfb = operand(g, e, n, k)
    a, sfa = a[0], sfa[0]
    offs, alphas = torch.tensor(ENDS, dtype=torch.int32, device=DEV), f32(POW2)
    out16 = torch.empty(T, n, dtype=torch.bfloat16, device=DEV)
    out4 = torch.empty(T, n, dtype=torch.float16, device=DEV)

    def run():
        nvfp4.grouped_gemm((x, None, w, sw), offsets=offs, alpha=alphas, out=out16)
        torch.ops.nvfp4.grouped_gemm_moe(a, sfa, b, sfb, offs, alphas)  # the op allocates: warm its pool
        nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=offs, alpha=alphas, out=out4)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: kernels compiled, operations bound
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # a host synchronization here would fail the capture
        run()
    for ends, values in (([10, 10, 200, 250, 250, 260, 270, 280], ODD), (ENDS, ODD[::-1]), ([0] * 7 + [T], POW2)):
        offs.copy_(torch.tensor(ends, dtype=torch.int32))
        alphas.copy_(torch.tensor(values, dtype=torch.float32))
        out16.fill_(float("nan"))
        out4.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        nan16 = torch.full((T, n), float("nan"), dtype=torch.bfloat16)
        cpu16 = nvfp4.grouped_gemm((x.cpu(), None, w.cpu(), sw.cpu()), offsets=offs.cpu(), alpha=values, out=nan16)
        assert torch.equal(bits(out16.cpu()), bits(cpu16)), (ends, values)
        nan4 = torch.full((T, n), float("nan"), dtype=torch.float16)
        cpu4 = nvfp4.grouped_gemm((a.cpu(), sfa.cpu(), b.cpu(), sfb.cpu()), offsets=offs.cpu(), alpha=values, out=nan4)
        assert torch.equal(bits(out4.cpu()), bits(cpu4)), (ends, values)


def test_one_expert_tensor_is_read_by_the_kernel_under_capture(g):
    """With one expert a one-element tensor would also read as a float (``.item()``, a host
    synchronization that capture refuses): the op takes it as the per-expert tensor."""
    n, k = 128, 256
    x = exact(g, (64, k), torch.float16)
    w, sw, _ = weights(g, 1, n, k, "plain")
    offs, alpha = torch.tensor([64], dtype=torch.int32, device=DEV), f32([0.5])
    eager = torch.ops.nvfp4.grouped_gemm_moe(x, None, w, sw, offs, alpha)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.ops.nvfp4.grouped_gemm_moe(x, None, w, sw, offs, alpha)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.nvfp4.grouped_gemm_moe(x, None, w, sw, offs, alpha)
    alpha.fill_(2.0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bits(eager), bits(nvfp4.grouped_gemm((x, None, w, sw), offsets=offs, alpha=0.5)))
    assert torch.equal(bits(out), bits(nvfp4.grouped_gemm((x, None, w, sw), offsets=offs, alpha=2.0)))


def test_alpha_errors_on_gpu(g):
    t, e, n, k = 64, 3, 128, 256
    x = exact(g, (t, k), torch.bfloat16)
    w, sw, _ = weights(g, e, n, k, "plain")
    offs = torch.tensor([32, 32, 64], dtype=torch.int32, device=DEV)

    def call(alpha):
        return nvfp4.grouped_gemm((x, None, w, sw), offsets=offs, alpha=alpha)

    with pytest.raises(ValueError, match="alpha is on cpu"):
        call(torch.ones(e))
    with pytest.raises(nvfp4.DtypeError, match="float32, got float64"):
        call(torch.ones(e, dtype=torch.float64, device=DEV))
    with pytest.raises(ValueError, match="2 alphas for E = 3 experts"):
        call(torch.ones(2, device=DEV))
    with pytest.raises(ValueError, match="1-D"):
        call(torch.ones(1, e, device=DEV))
    with pytest.raises(ValueError, match="contiguous"):
        call(torch.ones(2 * e, device=DEV)[::2])
    with pytest.raises(ValueError, match=r"alpha\[2\]: .*finite"):
        call([1.0, 1.0, float("inf")])
