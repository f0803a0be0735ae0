"""The packed W4A16 weight form (``nvfp4.pack``) on the GPU: ``gemm``, ``dual_gemm`` (a pair
packed together) and the MoE form of ``grouped_gemm`` with ``packed=`` give the same bits as
without it (and as the float64 reference on exact-tier data), in both activation types and
scale layouts; a CUDA graph of packed calls replays; the packed form's errors."""

import pytest
import torch

import nvfp4
from test_gpu import DEV, g  # noqa: F401 (g: the fixture)
from test_w4a16_gpu import DTYPES, LAYOUTS, exact, poison, ref16, rounded, weights

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m,n,k", [(2, 64, 256), (37, 300, 544), (256, 1024, 1024)])
def test_gemm_packed_is_bit_identical(g, dtype, layout, m, n, k):
    w, s, s_plain = weights(g, 1, n, k, layout)
    w, s = w[0], s if layout == "blocked" else s[0]
    x = exact(g, (m, k), dtype)
    p = nvfp4.pack(w, s, dtype=dtype, layout=layout)
    got = nvfp4.gemm(x, None, w, s, layout=layout, packed=p, out=poison((m, n), dtype))
    plain = nvfp4.gemm(x, None, w, s, layout=layout)
    assert torch.equal(got.view(torch.int16), plain.view(torch.int16))
    assert torch.equal(got, rounded(ref16(x, w, s_plain[0]), dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dual_packed_pair_is_bit_identical(g, dtype):
    m, n, k = 40, 200, 512
    w1, s1, _ = weights(g, 1, n, k, "plain")
    w2, s2, _ = weights(g, 1, n, k, "plain")
    x = exact(g, (m, k), dtype)
    p = nvfp4.pack(w1[0], s1[0], b2=w2[0], sfb2=s2[0], dtype=dtype)
    got = nvfp4.dual_gemm(x, None, w1[0], s1[0], w2[0], s2[0], packed=p)
    plain = nvfp4.dual_gemm(x, None, w1[0], s1[0], w2[0], s2[0])
    assert torch.equal(got.view(torch.int16), plain.view(torch.int16))


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_weights_the_previous_kernel_wrote(g, dtype):
    """Calls are chained behind the kernel before them on the stream (SPEC §7's programmatic
    dependent launch: a call may start while that kernel ends). Packed weights that kernel wrote
    in place (a copy into one buffer, alternating two weights) are the ones each call reads."""
    m, n, k = 16, 2048, 4096
    wa, sa, _ = weights(g, 1, n, k, "blocked")
    wb, sb, _ = weights(g, 1, n, k, "blocked")
    x = exact(g, (m, k), dtype)
    pa = nvfp4.pack(wa[0], sa, dtype=dtype, layout="blocked")
    pb = nvfp4.pack(wb[0], sb, dtype=dtype, layout="blocked")
    want = [nvfp4.gemm(x, None, wa[0], sa, layout="blocked", packed=pa)]
    want.append(nvfp4.gemm(x, None, wb[0], sb, layout="blocked", packed=pb))
    assert not torch.equal(want[0], want[1])
    buf = torch.empty_like(pa)
    outs = []
    for i in range(20):
        buf.copy_(pa if i % 2 == 0 else pb)
        outs.append(nvfp4.gemm(x, None, wa[0], sa, layout="blocked", packed=buf))
    torch.cuda.synchronize()
    for i, o in enumerate(outs):
        assert torch.equal(o.view(torch.int16), want[i % 2].view(torch.int16)), i


@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_packed_in_a_graph(g, dtype):
    e, n, k, t = 5, 260, 512, 90
    w, s, _ = weights(g, e, n, k, "blocked")
    p = nvfp4.pack(w, s, dtype=dtype, layout="blocked")
    x = exact(g, (t, k), dtype)
    offs = torch.tensor([10, 10, 50, 71, 90], dtype=torch.int32, device=DEV)
    want = nvfp4.grouped_gemm((x, None, w, s), offsets=offs, layout="blocked")
    out = poison((t, n), dtype)
    graph = torch.cuda.CUDAGraph()
    nvfp4.grouped_gemm((x, None, w, s), offsets=offs, layout="blocked", packed=p, out=out)  # warm, bind
    with torch.cuda.graph(graph):
        nvfp4.grouped_gemm((x, None, w, s), offsets=offs, layout="blocked", packed=p, out=out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_ops_take_the_packed_form(g, dtype):
    """``torch.ops.nvfp4.gemm`` and ``grouped_gemm_moe`` (one alpha and per-expert alphas) with
    ``packed=``: the bits of the calls without it; unrouted rows zero."""
    import nvfp4.torch  # noqa: F401 (registers torch.ops.nvfp4)

    e, n, k, t = 3, 200, 512, 50
    w, s, _ = weights(g, e, n, k, "plain")
    p = nvfp4.pack(w, s, dtype=dtype)
    x = exact(g, (t, k), dtype)
    offs = torch.tensor([10, 10, 40], dtype=torch.int32, device=DEV)
    alphas = torch.tensor([0.5, 2.0, 0.25], dtype=torch.float32, device=DEV)
    for alpha in (0.5, alphas):
        want = nvfp4.grouped_gemm((x, None, w, s), offsets=offs, alpha=alpha)
        got = torch.ops.nvfp4.grouped_gemm_moe(x, None, w, s, offs, alpha, packed=p)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), type(alpha)
        assert not got[40:].any()
    p0 = nvfp4.pack(w[0], s[0], dtype=dtype)
    got = torch.ops.nvfp4.gemm(x, None, w[0], s[0], 0.5, packed=p0)
    assert torch.equal(got.view(torch.int16), nvfp4.gemm(x, None, w[0], s[0], alpha=0.5).view(torch.int16))


@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_layer_packs_its_experts(g, dtype):
    """``nvfp4.torch.MoE`` (W4A16, CUDA) packs both projections, when asked (``pack``) or on its
    first forward; either gives the bits of the same layer kept unpacked; a CUDA graph of the
    packed layer replays them."""
    import nvfp4.torch as nvt

    e, h, i, t, k = 4, 256, 128, 24, 2
    gu, sgu, _ = weights(g, e, 2 * i, h, "plain")
    dn, sdn, _ = weights(g, e, h, i, "plain")
    make = lambda: nvt.MoE(gu, sgu, [0.5, 1.0, 2.0, 0.25], dn, sdn, 0.75)  # noqa: E731
    packed, auto, plain = make(), make(), make()
    plain._packed_for = lambda name, x: None  # this one never packs
    assert packed.pack(dtype)
    x = exact(g, (t, h), dtype)
    ids = torch.randint(0, e, (t, k), generator=g).to(DEV)
    wts = torch.rand((t, k), generator=g).to(dtype).to(DEV)
    want = plain(x, ids, wts)
    assert not plain._packed
    got = packed(x, ids, wts)
    assert {("gate_up", dtype), ("down", dtype)} <= set(packed._packed)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert not auto._packed
    got = auto(x, ids, wts)
    assert {("gate_up", dtype), ("down", dtype)} <= set(auto._packed)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = packed(x, ids, wts)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))


def test_pack_errors(g):
    w, s, _ = weights(g, 1, 64, 256, "plain")
    w, s = w[0], s[0]
    x = exact(g, (4, 256), torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA"):
        nvfp4.pack(w.cpu(), s.cpu(), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        nvfp4.pack(w, s, dtype=torch.float32)
    p = nvfp4.pack(w, s, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bytes"):
        nvfp4.gemm(x, None, w, s, packed=p[:-16])
    q, sq, _ = nvfp4.quantize(x.float())
    with pytest.raises(ValueError, match="W4A16"):
        nvfp4.gemm(q, sq, w, s, packed=p)
