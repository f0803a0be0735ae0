"""Calls on a side stream that still has work queued, the way a serving loop makes them: every
operation and form (gemv, gemm, dual GEMM, grouped list, MoE form, quantize) twice back to back
with different shapes, enough distinct calls to cycle the binding's cache of bound operations
(an evicted operation frees its descriptor tables while its launches may still be queued), and
the same calls captured into a CUDA graph (bound inside the capture), then replayed after later
calls have reused the library's memory. Every output is checked against a float64 reference or
the CPU path once the stream has drained."""

import pytest
import torch

import nvfp4
from test_gpu import DEV, bits, close, deq, g, operand, ref_gemm, ref_moe  # noqa: F401 (g: the fixture)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def make_busy(stream, products=6):
    """Queues a few large products on ``stream`` (milliseconds of work); returns their inputs."""
    x = torch.randn(8192, 8192, device=DEV, dtype=torch.float16)
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(products):
            y = x @ x
    return x, y


def gemm_case(g, m, n, k, gemv=False):
    a, sfa = operand(g, 1, m, k, (0.0, 1.0, 2.0), byte_max=4) if gemv else operand(g, 1, m, k)
    b, sfb = operand(g, 1, 1 if gemv else n, k, (0.0, 1.0, 2.0), byte_max=4) if gemv else operand(g, 1, n, k)
    fn = nvfp4.gemv if gemv else nvfp4.gemm
    return (lambda: fn(a, sfa, b, sfb)), (lambda got: torch.equal(bits(got), bits(ref_gemm(a, sfa, b, sfb))))


def dual_case(g, m, n, k):
    a, sfa = operand(g, 1, m, k, (0.5, 1.0), mask=0xBB)
    b1, sfb1 = operand(g, 1, n, k, (0.5, 1.0), mask=0xBB)
    b2, sfb2 = operand(g, 1, n, k, (0.5, 1.0), mask=0xBB)

    def ok(got):
        x1 = (deq(a, sfa) @ deq(b1, sfb1).transpose(-1, -2)).float().double()
        x2 = (deq(a, sfa) @ deq(b2, sfb2).transpose(-1, -2)).float().double()
        return close(got, (x1 / (1 + torch.exp(-x1)) * x2).to(torch.float16))

    return (lambda: nvfp4.dual_gemm(a, sfa, b1, sfb1, b2, sfb2)), ok


def grouped_case(g, shapes, alpha=0.5):
    groups = []
    for m, n, k in shapes:
        a, sfa = operand(g, 1, m, k, (1.0, 2.0), mask=0xBB)
        b, sfb = operand(g, 1, n, k, (1.0, 2.0), mask=0xBB)
        groups.append((a[0], sfa[0], b[0], sfb[0]))

    def ok(outs):
        refs = [ref_gemm(a, sfa, b, sfb, alpha) for a, sfa, b, sfb in groups]
        return all(torch.equal(bits(o), bits(r)) for o, r in zip(outs, refs))

    return (lambda: nvfp4.grouped_gemm(groups, alpha=alpha)), ok


def moe_case(g, n, k, ends):
    t, e = ends[-1], len(ends)
    a, sfa = operand(g, 1, t, k)
    b, sfb = operand(g, e, n, k)
    a, sfa = a[0], sfa[0]
    offs = torch.tensor(ends, dtype=torch.int32, device=DEV)

    def ok(got):
        return torch.equal(bits(got), bits(ref_moe(a, sfa, b, sfb, offs, got.new_zeros(t, n), alpha=0.5)))

    return (lambda: nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=offs, alpha=0.5)), ok


def quantize_case(rows, k, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, k, generator=gen) * 3).to(torch.bfloat16)
    xd = x.to(DEV)

    def ok(got):
        want = nvfp4.quantize(x)
        return all(torch.equal(u.cpu().view(torch.uint8), v.view(torch.uint8)) for u, v in zip(got, want))

    return (lambda: nvfp4.quantize(xd)), ok


def pairs(g):
    """Each operation and form twice, the second with other shapes (and other group shapes)."""
    return [
        gemm_case(g, 128, 1, 1536, gemv=True),
        gemm_case(g, 512, 1, 4096, gemv=True),
        gemm_case(g, 128, 256, 256),  # one launch of the small kernel
        gemm_case(g, 256, 7168, 2048),  # the skeleton
        gemm_case(g, 40, 72, 48),  # the fallback (K % 32 != 0)
        gemm_case(g, 96, 136, 80),
        dual_case(g, 256, 512, 256),
        dual_case(g, 512, 768, 1024),
        grouped_case(g, [(40, 512, 256), (56, 384, 256)]),
        grouped_case(g, [(384, 256, 512), (512, 128, 256)]),
        grouped_case(g, [(40, 72, 48), (64, 96, 80)]),  # the fallback's descriptor table
        grouped_case(g, [(72, 40, 80), (96, 64, 48)]),
        moe_case(g, 256, 512, [40, 40, 100, 172]),
        moe_case(g, 384, 1024, [9, 300, 300, 371]),
        quantize_case(300, 512, 1),
        quantize_case(64, 2048, 2),
    ]


def test_back_to_back_on_a_busy_stream(g):
    cases = pairs(g)
    side = torch.cuda.Stream()
    for _ in range(2):
        keep = make_busy(side)
        with torch.cuda.stream(side):
            outs = [call() for call, _ in cases]
        side.synchronize()
        for i, ((_, ok), got) in enumerate(zip(cases, outs)):
            assert ok(got), i
        del keep


def test_cycling_the_bound_cache_on_a_busy_stream(g):
    """More distinct grouped and MoE calls than the binding caches per stream (256), each with its
    own output, all queued behind the busy work: evicted operations must not free what their
    queued launches read."""
    calls = [grouped_case(g, [(8 + i % 7, 64, 256), (16, 32 + 8 * (i % 5), 256)]) for i in range(150)]
    calls += [moe_case(g, 64, 256, [3 + i % 5, 3 + i % 5, 16, 16 + i % 3]) for i in range(150)]
    side = torch.cuda.Stream()
    keep = make_busy(side, products=10)
    with torch.cuda.stream(side):
        outs = [call() for call, _ in calls]
    side.synchronize()
    for i, ((_, ok), got) in enumerate(zip(calls, outs)):
        assert ok(got), i
    del keep


def test_bound_inside_a_capture_then_replayed(g):
    cases = pairs(g)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        outs = [call() for call, _ in cases]
    # Later calls outside the graph bind, upload and free: none may land in what the graph reads.
    later = pairs(torch.Generator().manual_seed(99))
    for call, ok in later:
        assert ok(call())
    for _ in range(2):
        for o in outs:
            for t in o if isinstance(o, (list, tuple)) else [o]:
                t.view(torch.uint8).fill_(0xFF)
        graph.replay()
        torch.cuda.synchronize()
        for i, ((_, ok), got) in enumerate(zip(cases, outs)):
            assert ok(got), i
