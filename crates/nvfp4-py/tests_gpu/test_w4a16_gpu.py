"""W4A16 (SPEC §8) on the GPU: every operation with a dense bfloat16/float16 activation (its
scales passed as None), zero-copy from torch on the caller's stream, x {bfloat16, float16} x
{plain, blocked} weight scales: bit-identical to the float64 reference on exact-tier data
(activations {0, ±0.5, ±1, ±1.5, ±2} x 2^e, whose float32 sums are exact) and to the CPU
reference, within SPEC §4's tolerance on Gaussian data; a busy non-default stream, CUDA graph
capture and replay (MoE offsets and activations changed between replays), torch.compile and
CUDA graphs of the W4A16 Linear, and the errors only a GPU shows."""

import pytest
import torch

import nvfp4
import nvfp4.torch as nvt
from test_gpu import DEV, bits, close, close_bf16, deq, g, operand, to_blocked  # noqa: F401 (g: the fixture)
from test_streams import make_busy

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DTYPES = [torch.bfloat16, torch.float16]
LAYOUTS = ["plain", "blocked"]
LEVELS = torch.tensor([0.0, 0.5, -0.5, 1.0, -1.0, 1.5, -1.5, 2.0, -2.0], dtype=torch.float64)


def exact(g, shape, dtype):
    """Exact-tier activations: every product with a GEMM-generator weight is a multiple of 2^-4
    and every |sum| < 2^19 for K <= 7168, so float32 sums are exact in any order."""
    v = LEVELS[torch.randint(0, len(LEVELS), shape, generator=g)]
    e = torch.randint(-2, 2, shape, generator=g).double()
    return (v * 2.0**e).to(dtype).to(DEV)


def gaussian(g, shape, dtype, scale=1.0):
    return (torch.randn(shape, generator=g) * scale).to(dtype).to(DEV)


def weights(g, l, rows, k, layout, **kw):
    v, s = operand(g, l, rows, k, **kw)
    return v, (to_blocked(s) if layout == "blocked" else s), s


def rounded(ref64, dtype):
    """float64 -> dtype, once: float32 holds the exact-tier sums exactly, so the float32 step
    does not round."""
    r32 = ref64.float()
    assert torch.equal(r32.double(), ref64), "not exact in float32"
    return r32.to(dtype)


def ref16(x, w, s, alpha=1.0):
    """x [.., M, K] times the dequantized weight [.., N, K] transposed, float64, times alpha as the
    kernels take it (float32)."""
    return x.double() @ deq(w, s).transpose(-1, -2) * torch.tensor(alpha, dtype=torch.float32).item()


def within(got, ref, dtype):
    return close(got, ref.to(torch.float16)) if dtype == torch.float16 else close_bf16(got, ref)


def poison(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "m,n,k,l",
    [(128, 256, 256, 1), (1, 4096, 4096, 1), (16, 1536, 7168, 1), (256, 7168, 2048, 1), (40, 72, 512, 2), (1, 9, 48, 1)],
)
def test_gemm(g, dtype, layout, m, n, k, l):
    x = exact(g, (l, m, k), dtype)
    w, sw, plain = weights(g, l, n, k, layout)
    want = rounded(ref16(x, w, plain, 0.5), dtype)
    out = poison((l, m, n), dtype)
    got = nvfp4.gemm(x, None, w, sw, alpha=0.5, out=out)
    assert got is out and torch.equal(bits(got), bits(want))
    new = nvfp4.gemm(x[0], None, w[0], plain[0] if layout == "plain" else to_blocked(plain[:1]), alpha=0.5)
    assert new.dtype == dtype and new.shape == (m, n) and torch.equal(bits(new), bits(want[0]))
    cpu = nvfp4.gemm(x.cpu(), None, w.cpu(), sw.cpu(), alpha=0.5)
    assert torch.equal(bits(got.cpu()), bits(cpu))
    # Gaussian data: SPEC §4's tolerance (bfloat16: its resolution).
    xr = gaussian(g, (l, m, k), dtype)
    assert within(nvfp4.gemm(xr, None, w, sw, alpha=0.5), ref16(xr, w, plain, 0.5), dtype)


# The CUDA W4A16 skeleton loads the activation by TMA (16-byte rows: K % 32 == 0) in 64-element
# steps (K >= 64); the mma.sync fallback takes every other K (a multiple of 16) with more than one
# activation row (issue 21), the GEMV kernel one row. Bit-identical on exact data (the dual GEMM:
# the tolerance of its SiLU), the MoE form's rows past the last offset unwritten.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [48, 80, 32, 16])
def test_k_the_skeleton_cannot_load_runs_on_the_fallback(g, dtype, k):
    x = exact(g, (7, k), dtype)
    w, sw, plain = weights(g, 2, 9, k, "plain")
    want = rounded(ref16(x, w[0], plain[0]), dtype)
    got = nvfp4.gemm(x, None, w[0], sw[0], out=poison((7, 9), dtype))
    assert torch.equal(bits(got), bits(want))
    one = nvfp4.gemm(x[:1], None, w[0], sw[0])
    assert torch.equal(bits(one), bits(want[:1]))
    x1, x2 = ref16(x, w[0], plain[0]).float(), ref16(x, w[1], plain[1]).float()
    ref = x1.double() / (1 + torch.exp(-x1.double())) * x2.double()
    # The second weight on its own allocation: w[1] starts 9 * K / 2 bytes into w, not 16-byte
    # aligned for K = 48, 80, 16 (a device operand must be; that refusal is tested elsewhere).
    w1, sw1 = w[1].clone(), sw[1].clone()
    assert within(nvfp4.dual_gemm(x, None, w[0], sw[0], w1, sw1, out=poison((7, 9), dtype)), ref, dtype)
    outs = nvfp4.grouped_gemm([(x, None, w[0], sw[0]), (x[:3], None, w1, sw1)])
    assert torch.equal(bits(outs[0]), bits(want))
    assert torch.equal(bits(outs[1]), bits(rounded(ref16(x[:3], w[1], plain[1]), dtype)))
    offs = torch.tensor([3, 6], dtype=torch.int32, device=DEV)
    moe = nvfp4.grouped_gemm((x, None, w, sw), offsets=offs, out=poison((7, 9), dtype))
    assert torch.equal(bits(moe), bits(ref_moe16(x, w, plain, [3, 6], poison((7, 9), dtype), 1.0)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m,k,l", [(128, 1536, 1), (512, 4096, 2), (7168, 16384, 1), (4096, 7168, 8), (7, 48, 3)])
def test_gemv(g, dtype, layout, m, k, l):
    w, sw, plain = weights(g, l, m, k, layout, scales=(0.0, 1.0, 2.0), byte_max=4)
    x = exact(g, (l, 1, k), dtype)
    ref = deq(w, plain) @ x.double().transpose(-1, -2) * 0.25  # [L, M, 1]
    want = rounded(ref, dtype)
    got = nvfp4.gemv(w, sw, x, None, alpha=0.25, out=poison((l, m, 1), dtype))
    assert torch.equal(bits(got), bits(want))
    new = nvfp4.gemv(w, sw, x, None, alpha=0.25)
    assert new.dtype == dtype and torch.equal(bits(new), bits(want))
    xr = gaussian(g, (l, 1, k), dtype)
    assert within(nvfp4.gemv(w, sw, xr, None, alpha=0.25), deq(w, plain) @ xr.double().transpose(-1, -2) * 0.25, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m,n,k", [(256, 512, 256), (512, 768, 7168), (100, 40, 160)])
def test_dual_gemm(g, dtype, layout, m, n, k):
    x = gaussian(g, (1, m, k), dtype, 0.5)
    w1, s1, p1 = weights(g, 1, n, k, layout, scales=(0.5, 1.0), mask=0xBB)
    w2, s2, p2 = weights(g, 1, n, k, layout, scales=(0.5, 1.0), mask=0xBB)
    x1 = ref16(x, w1, p1, 0.5).float()
    x2 = ref16(x, w2, p2, 0.5).float()
    ref = x1.double() / (1 + torch.exp(-x1.double())) * x2.double()
    got = nvfp4.dual_gemm(x, None, w1, s1, w2, s2, alpha=0.5, out=poison((1, m, n), dtype))
    assert within(got, ref, dtype)
    flat = (lambda s: s[0]) if layout == "plain" else (lambda s: s)  # blocked [1, R, C, 512] fits 2-D values
    new = nvfp4.dual_gemm(x[0], None, w1[0], flat(s1), w2[0], flat(s2), alpha=0.5)
    assert new.dtype == dtype and torch.equal(bits(new), bits(got[0]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_grouped_list(g, dtype, layout):
    shapes = [(40, 512, 256), (56, 384, 256), (384, 256, 512), (512, 128, 256), (7, 72, 64)]
    alphas = [0.5, 2.0, 1.0, 0.25, 0.5]
    groups, wants = [], []
    for (m, n, k), al in zip(shapes, alphas):
        x = exact(g, (m, k), dtype)
        w, sw, plain = weights(g, 1, n, k, layout, scales=(1.0, 2.0), mask=0xBB)
        groups.append((x, None, w[0], sw if layout == "blocked" else sw[0]))
        wants.append(rounded(ref16(x, w[0], plain[0], al), dtype))
    outs = nvfp4.grouped_gemm(groups, alpha=alphas, out=[poison((m, n), dtype) for m, n, _ in shapes])
    for got, want in zip(outs, wants):
        assert torch.equal(bits(got), bits(want))
    cpu = nvfp4.grouped_gemm([tuple(None if t is None else t.cpu() for t in gr) for gr in groups], alpha=alphas)
    for got, c in zip(outs, cpu):
        assert c.dtype == dtype and torch.equal(bits(got.cpu()), bits(c))


def ref_moe16(x, w, plain, ends, out, alpha):
    want = out.clone()
    start = 0
    for e, end in enumerate(ends):
        if end > start:
            want[start:end] = rounded(ref16(x[start:end], w[e], plain[e], alpha), out.dtype)
        start = end
    return want


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "t,ends",
    [
        (300, [40, 40, 100, 172, 172, 250, 251, 290]),  # empty experts; rows 290.. routed to none
        (200, [0, 0, 200, 200, 200, 200, 200, 200]),
        (5, [1, 2, 2, 3, 4, 4, 5, 5]),  # decode-sized
    ],
)
def test_moe(g, dtype, layout, t, ends):
    e, n, k = 8, 256, 512
    x = exact(g, (t, k), dtype)
    w, sw, plain = weights(g, e, n, k, layout)
    offs = torch.tensor(ends, dtype=torch.int32, device=DEV)
    got = nvfp4.grouped_gemm((x, None, w, sw), offsets=offs, alpha=0.5, out=poison((t, n), dtype))
    assert torch.equal(bits(got), bits(ref_moe16(x, w, plain, ends, poison((t, n), dtype), 0.5)))
    new = nvfp4.grouped_gemm((x[None], None, w, sw), offsets=offs, alpha=0.5)
    assert new.shape == (1, t, n) and new.dtype == dtype
    cpu = nvfp4.grouped_gemm((x.cpu(), None, w.cpu(), sw.cpu()), offsets=offs.cpu(), alpha=0.5)
    assert torch.equal(bits(new[0].cpu()), bits(cpu))  # zeros past the last offset on both
    op = torch.ops.nvfp4.grouped_gemm_moe(x, None, w, sw, offs, 0.5)
    assert torch.equal(bits(op), bits(new[0]))


def test_out_dtype_other_than_the_activations(g):
    x = exact(g, (64, 512), torch.bfloat16)
    w, sw, _ = weights(g, 1, 256, 512, "plain")
    want = rounded(ref16(x, w[0], sw[0]), torch.float16)
    got = nvfp4.gemm(x, None, w[0], sw[0], out_dtype=torch.float16)
    assert got.dtype == torch.float16 and torch.equal(bits(got), bits(want))
    op = torch.ops.nvfp4.gemm(x.half(), None, w[0], sw[0], None, torch.bfloat16)
    assert op.dtype == torch.bfloat16 and torch.equal(bits(op), bits(rounded(ref16(x, w[0], sw[0]), torch.bfloat16)))


def test_busy_side_stream(g):
    """Every W4A16 operation queued behind milliseconds of work on a non-default stream: each
    reads its inputs and writes its output in stream order."""
    x = exact(g, (256, 2048), torch.bfloat16)
    w, sw, _ = weights(g, 1, 1024, 2048, "plain")
    we, se, _ = weights(g, 4, 512, 2048, "plain")
    offs = torch.tensor([64, 64, 200, 256], dtype=torch.int32, device=DEV)
    side = torch.cuda.Stream()
    keep = make_busy(side)
    with torch.cuda.stream(side):
        outs = [
            nvfp4.gemm(x, None, w[0], sw[0]),
            nvfp4.gemv(w[0], sw[0], x[:1], None),
            nvfp4.grouped_gemm([(x, None, w[0], sw[0]), (x[:40], None, we[1], se[1])]),
            nvfp4.grouped_gemm((x, None, we, se), offsets=offs),
        ]
    side.synchronize()
    del keep
    assert torch.equal(bits(outs[0]), bits(rounded(ref16(x, w[0], sw[0]), torch.bfloat16)))
    assert torch.equal(bits(outs[1]), bits(rounded(deq(w[0], sw[0]) @ x[:1].double().T, torch.bfloat16)))
    assert torch.equal(bits(outs[2][1]), bits(rounded(ref16(x[:40], we[1], se[1]), torch.bfloat16)))
    zeros = torch.zeros(256, 512, dtype=torch.bfloat16, device=DEV)
    assert torch.equal(bits(outs[3]), bits(ref_moe16(x, we, se, [64, 64, 200, 256], zeros, 1.0)))


def test_graph_capture_and_replay(g):
    """A dense GEMM, a GEMV and the MoE form captured in one CUDA graph; new activations and new
    offsets written into the captured tensors between replays."""
    t, e, n, k = 256, 4, 384, 512
    x = exact(g, (t, k), torch.bfloat16)
    w, sw, _ = weights(g, 1, 768, k, "plain")
    we, se, _ = weights(g, e, n, k, "blocked")
    offs = torch.tensor([64, 128, 192, 256], dtype=torch.int32, device=DEV)
    out = torch.empty(t, 768, dtype=torch.bfloat16, device=DEV)
    vec = torch.empty(768, 1, dtype=torch.bfloat16, device=DEV)
    moe = torch.empty(t, n, dtype=torch.bfloat16, device=DEV)

    def run():
        nvfp4.gemm(x, None, w[0], sw[0], alpha=0.5, out=out)
        nvfp4.gemv(w[0], sw[0], x[:1], None, out=vec)
        nvfp4.grouped_gemm((x, None, we, se), offsets=offs, out=moe)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: kernels compiled, operations bound
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    gen = torch.Generator().manual_seed(5)
    for ends in ([10, 10, 200, 250], [0, 256, 256, 256], [100, 120, 140, 160]):
        x.copy_(exact(gen, (t, k), torch.bfloat16))
        offs.copy_(torch.tensor(ends, dtype=torch.int32))
        for o in (out, vec, moe):
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(bits(out), bits(rounded(ref16(x, w[0], sw[0], 0.5), torch.bfloat16))), ends
        assert torch.equal(bits(vec), bits(rounded(deq(w[0], sw[0]) @ x[:1].double().T, torch.bfloat16))), ends
        cpu = nvfp4.grouped_gemm(
            (x.cpu(), None, we.cpu(), se.cpu()), offsets=offs.cpu(), out=torch.full((t, n), float("nan"), dtype=torch.bfloat16)
        )
        assert torch.equal(bits(moe.cpu()), bits(cpu)), ends  # rows past the last offset keep NaN


def test_linear_w4a16_compile_and_graph(g):
    """The default (W4A16) Linear: bit-identical to the CPU reference on exact data, and the same
    bits eager, under torch.compile (fullgraph) and replayed from a CUDA graph."""
    n, k = 384, 1024
    wf = torch.randn(n, k, generator=g).to(DEV) * 0.05
    wv, ws, wg = nvfp4.quantize(wf)
    bias = torch.randn(n, generator=g).to(torch.bfloat16).to(DEV)
    sd = {"weight": wv, "weight_scale": ws, "weight_scale_2": wg[0], "input_scale": torch.tensor(0.01), "bias": bias}
    layer = nvt.Linear.from_state_dict(sd)
    assert layer.mode == "w4a16"
    x = exact(g, (4, 33, k), torch.bfloat16)
    y = layer(x)
    assert y.shape == (4, 33, n) and y.dtype == torch.bfloat16
    cpu = nvt.Linear.from_state_dict({key: v.cpu() for key, v in sd.items()})
    assert torch.equal(bits(y.cpu()), bits(cpu(x.cpu())))
    compiled = torch.compile(layer, fullgraph=True)
    assert torch.equal(bits(compiled(x)), bits(y))
    static = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        layer(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        yg = layer(static)
    x2 = exact(g, (4, 33, k), torch.bfloat16)
    static.copy_(x2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bits(yg), bits(layer(x2)))
    # Accuracy on Gaussian inputs (no bias): the float64 product up to the output's rounding.
    unbiased = nvt.Linear.from_state_dict({key: v for key, v in sd.items() if key != "bias"})
    xr = gaussian(g, (64, k), torch.bfloat16)
    assert close_bf16(unbiased(xr), xr.double() @ (deq(wv, ws) * wg.double()).T)


def test_errors_on_gpu(g):
    w, sw, _ = weights(g, 1, 128, 256, "plain")
    x = exact(g, (64, 256), torch.bfloat16)
    with pytest.raises(ValueError, match="is on cpu, the operation's first tensor on cuda"):
        nvfp4.gemm(x, None, w[0].cpu(), sw[0].cpu())
    with pytest.raises(ValueError, match="is on cuda:0, the operation's first tensor on cpu"):
        nvfp4.gemm(x.cpu(), None, w[0], sw[0])
    with pytest.raises(nvfp4.DtypeError, match="must be float16 or bfloat16, got float32"):
        nvfp4.gemm(x.float(), None, w[0], sw[0])
    with pytest.raises(ValueError, match="contiguous"):
        nvfp4.gemm(x.T, None, w[0], sw[0])
    with pytest.raises(ValueError, match="reduction lengths"):
        nvfp4.gemm(x[:, :128].contiguous(), None, w[0], sw[0])
    off = x.view(-1)[4 : 4 + 60 * 256].view(60, 256)  # 8 bytes past a 16-byte boundary
    with pytest.raises(ValueError, match="aligned"):
        nvfp4.gemm(off, None, w[0], sw[0])
    with pytest.raises(ValueError, match="one launch runs one mode"):
        nvfp4.grouped_gemm([(x, None, w[0], sw[0]), (w[0], sw[0], w[0], sw[0])])
