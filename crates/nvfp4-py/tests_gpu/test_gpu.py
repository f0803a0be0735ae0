"""GPU suite of the Python package (torch on a CUDA machine): every operation against a float64
torch dequantize-and-matmul reference (bit-identical where SPEC §4 says so), the GPU quantizer
bit-identical to the CPU one, torch.compile, CUDA graph capture, two streams, Linear against its
dequantized twin, and the errors only a GPU can show."""

import re

import pytest
import torch

import nvfp4
import nvfp4.torch as nvt

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEV = "cuda"
E4M3 = {0.0: 0x00, 0.5: 0x30, 1.0: 0x38, 2.0: 0x40, 3.0: 0x44}


def operand(g, l, rows, k, scales=(0.0, 1.0, 2.0, 3.0), byte_max=256, mask=0xFF):
    v = (torch.randint(0, byte_max, (l, rows, k // 2), generator=g, dtype=torch.int32) & mask).to(torch.uint8)
    codes = torch.tensor([E4M3[s] for s in scales], dtype=torch.uint8)
    s = codes[torch.randint(0, len(codes), (l, rows, k // 16), generator=g)]
    return v.to(DEV), s.view(torch.float8_e4m3fn).to(DEV)


def deq(v, s):
    return nvt.dequantize(v, s, dtype=torch.float64)


def ref_gemm(a, sfa, b, sfb, alpha=1.0):
    return (deq(a, sfa) @ deq(b, sfb).transpose(-1, -2) * alpha).to(torch.float16)


def to_blocked(plain):
    l, rows, cols = plain.shape
    r, c = -(-rows // 128), -(-cols // 4)
    out = torch.zeros(l * r * c * 512, dtype=torch.uint8, device=plain.device)
    i = torch.arange(rows, device=plain.device)[:, None]
    j = torch.arange(cols, device=plain.device)[None, :]
    for b in range(l):
        off = b * r * c * 512 + (i // 128) * c * 512 + (j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4
        out[off.reshape(-1)] = plain[b].view(torch.uint8).reshape(-1)
    return out.view(l, r, c, 512).view(torch.float8_e4m3fn)


def close(got, ref):
    got, ref = got.double(), ref.double()
    ok = ((got - ref).abs() <= 1e-3 + 1e-3 * ref.abs()) | (got.isnan() & ref.isnan())
    return bool(ok.all())


def bits(t):
    return t.view(torch.int16)


def to_bf16(x64):
    """float64 -> bfloat16 rounded once, for values float32 holds exactly (asserted): torch's
    float64 -> bfloat16 goes through float32, a second rounding otherwise."""
    x32 = x64.float()
    assert torch.equal(x32.double(), x64), "not exact in float32"
    return x32.to(torch.bfloat16)


def close_bf16(got, ref):
    """SPEC §4's rule with bfloat16's resolution: |got - ref| <= 1e-3 + 2^-7 |ref| (one bf16 ulp
    at most, and the tiny values that an approximate e^-x flushes a little earlier)."""
    got, ref = got.double(), ref.double()
    return bool(((got - ref).abs() <= 1e-3 + ref.abs() / 128).all())


def poison(shape):
    return torch.full(shape, float("nan"), dtype=torch.float16, device=DEV)


@pytest.fixture
def g():
    return torch.Generator().manual_seed(11)


@pytest.mark.parametrize(
    "m,n,k,l", [(128, 256, 256, 1), (128, 1536, 7168, 1), (256, 7168, 2048, 1), (40, 72, 512, 2), (7, 9, 48, 1)]
)
def test_gemm_bit_identical(g, m, n, k, l):
    a, sfa = operand(g, l, m, k)
    b, sfb = operand(g, l, n, k)
    ref = ref_gemm(a, sfa, b, sfb)
    got = nvfp4.gemm(a, sfa, b, sfb, out=poison((l, m, n)))
    assert torch.equal(bits(got), bits(ref))
    blk = nvfp4.gemm(a, to_blocked(sfa), b, to_blocked(sfb))
    assert torch.equal(bits(blk), bits(ref))
    # uint8 views and float4_e2m1fn_x2 values are the same bytes.
    f4 = nvfp4.gemm(a.view(torch.float4_e2m1fn_x2), sfa.view(torch.uint8), b, sfb)
    assert torch.equal(bits(f4), bits(ref))


@pytest.mark.parametrize("m,k,l", [(128, 1536, 1), (512, 4096, 2), (7, 48, 3)])
def test_gemv_bit_identical(g, m, k, l):
    a, sfa = operand(g, l, m, k, (0.0, 1.0, 2.0), byte_max=4)
    b, sfb = operand(g, l, 1, k, (0.0, 1.0, 2.0), byte_max=4)
    got = nvfp4.gemv(a, sfa, b, sfb, out=poison((l, m, 1)))
    assert torch.equal(bits(got), bits(ref_gemm(a, sfa, b, sfb)))


@pytest.mark.parametrize("m,n,k", [(256, 512, 256), (512, 768, 7168), (100, 40, 160)])
def test_dual_gemm_tolerance(g, m, n, k):
    a, sfa = operand(g, 1, m, k, (0.5, 1.0), mask=0xBB)
    b1, sfb1 = operand(g, 1, n, k, (0.5, 1.0), mask=0xBB)
    b2, sfb2 = operand(g, 1, n, k, (0.5, 1.0), mask=0xBB)
    x1 = (deq(a, sfa) @ deq(b1, sfb1).transpose(-1, -2)).float()
    x2 = (deq(a, sfa) @ deq(b2, sfb2).transpose(-1, -2)).float()
    ref = (x1.double() / (1 + torch.exp(-x1.double())) * x2.double()).to(torch.float16)
    got = nvfp4.dual_gemm(a, sfa, b1, sfb1, b2, sfb2, out=poison((1, m, n)))
    assert close(got, ref)


def test_grouped_gemm_bit_identical(g):
    shapes = [(40, 512, 256), (56, 384, 256), (384, 256, 512), (512, 128, 256)]
    groups, refs = [], []
    for m, n, k in shapes:
        a, sfa = operand(g, 1, m, k, (1.0, 2.0), mask=0xBB)
        b, sfb = operand(g, 1, n, k, (1.0, 2.0), mask=0xBB)
        groups.append((a[0], sfa[0], b[0], sfb[0]))
        refs.append(ref_gemm(a[0], sfa[0], b[0], sfb[0], alpha=0.5))
    outs = nvfp4.grouped_gemm(groups, alpha=0.5, out=[poison((m, n)) for m, n, _ in shapes])
    for got, ref in zip(outs, refs):
        assert torch.equal(bits(got), bits(ref))


def ref_moe(a, sfa, b, sfb, offsets, out, alpha=1.0):
    """Each expert's rows of a against its weight (float64 dequantize-and-matmul), written into a
    copy of ``out``: rows routed to no expert keep what ``out`` held."""
    want = out.clone()
    start = 0
    for e, end in enumerate(offsets.tolist()):
        if end > start:
            want[start:end] = ref_gemm(a[start:end], sfa[start:end], b[e], sfb[e], alpha)
        start = end
    return want


@pytest.mark.parametrize(
    "t,ends",
    [
        (300, [40, 40, 100, 172, 172, 250, 251, 290]),  # empty experts; rows 290.. routed to none
        (200, [0, 0, 200, 200, 200, 200, 200, 200]),  # one expert with every token
        (33, [33] * 8),
    ],
)
def test_moe_bit_identical_and_same_as_cpu(g, t, ends):
    e, n, k = 8, 256, 512
    a, sfa = operand(g, 1, t, k)
    b, sfb = operand(g, e, n, k)
    offs = torch.tensor(ends, dtype=torch.int32, device=DEV)
    got = nvfp4.grouped_gemm((a[0], sfa[0], b, sfb), offsets=offs, alpha=0.5, out=poison((t, n)))
    assert torch.equal(bits(got), bits(ref_moe(a[0], sfa[0], b, sfb, offs, poison((t, n)), alpha=0.5)))
    new = nvfp4.grouped_gemm((a, to_blocked(sfa), b, to_blocked(sfb)), offsets=offs, alpha=0.5)
    assert new.shape == (1, t, n)
    cpu = nvfp4.grouped_gemm(tuple(x.cpu() for x in (a, sfa, b, sfb)), offsets=offs.cpu(), alpha=0.5)
    assert torch.equal(bits(new.cpu()), bits(cpu))  # zeros past the last offset on both
    op = torch.ops.nvfp4.grouped_gemm_moe(a[0], sfa[0], b, sfb, offs, 0.5)
    assert torch.equal(bits(op), bits(new[0]))


def test_moe_graph_capture_with_changing_offsets(g):
    t, e, n, k = 256, 4, 384, 256
    a, sfa = operand(g, 1, t, k)
    b, sfb = operand(g, e, n, k)
    a, sfa = a[0], sfa[0]
    offs = torch.tensor([64, 128, 192, 256], dtype=torch.int32, device=DEV)
    out = torch.empty(t, n, dtype=torch.float16, device=DEV)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture
        nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=offs, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=offs, out=out)
    for ends in ([10, 10, 200, 250], [0, 256, 256, 256], [100, 120, 140, 160]):
        offs.copy_(torch.tensor(ends, dtype=torch.int32))
        a2, sfa2 = operand(g, 1, t, k)
        a.copy_(a2[0])
        sfa.copy_(sfa2[0])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(bits(out), bits(ref_moe(a, sfa, b, sfb, offs, poison((t, n))))), ends
        cpu = nvfp4.grouped_gemm((a.cpu(), sfa.cpu(), b.cpu(), sfb.cpu()), offsets=offs.cpu(), out=poison((t, n)).cpu())
        assert torch.equal(bits(out.cpu()), bits(cpu)), ends


def test_moe_errors_on_gpu(g):
    t, e, n, k = 64, 2, 128, 256
    a, sfa = operand(g, 1, t, k)
    b, sfb = operand(g, e, n, k)
    a, sfa = a[0], sfa[0]
    offs = torch.tensor([32, 64], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="offsets is on cpu"):
        nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=offs.cpu())
    with pytest.raises(ValueError, match="int32"):
        nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=offs.long())
    with pytest.raises(ValueError, match="offsets: must be"):
        nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=offs[:1])
    b2, sfb2 = operand(g, e, n, 2 * k)
    with pytest.raises(ValueError, match="reduction lengths"):
        nvfp4.grouped_gemm((a, sfa, b2, sfb2), offsets=offs)
    with pytest.raises(ValueError, match="cuda|cpu"):
        nvfp4.grouped_gemm((a, sfa, b.cpu(), sfb.cpu()), offsets=offs)
    # K = 48 is correct on the CPU but not a shape the one-launch MoE kernel takes: a typed error.
    a3, sfa3 = operand(g, 1, t, 48)
    b3, sfb3 = operand(g, e, n, 48)
    with pytest.raises(ValueError, match="moe gemm: no kernel takes it"):
        nvfp4.grouped_gemm((a3[0], sfa3[0], b3, sfb3), offsets=offs)


@pytest.mark.parametrize("m,n,k,l", [(128, 256, 256, 1), (128, 3072, 1536, 1), (512, 512, 2048, 1), (40, 72, 512, 2), (7, 9, 48, 1)])
def test_bf16_gemm_gemv_grouped_bit_identical(g, m, n, k, l):
    a, sfa = operand(g, l, m, k)
    b, sfb = operand(g, l, n, k)
    ref = to_bf16(deq(a, sfa) @ deq(b, sfb).transpose(-1, -2) * 0.5)
    out = torch.full((l, m, n), float("nan"), dtype=torch.bfloat16, device=DEV)
    got = nvfp4.gemm(a, sfa, b, sfb, alpha=0.5, out=out)
    assert got is out and torch.equal(bits(got), bits(ref))
    # The same memory as float16: the bound-op cache keys on the output's dtype too.
    as16 = nvfp4.gemm(a, sfa, b, sfb, alpha=0.5, out=out.view(torch.float16))
    assert torch.equal(bits(as16), bits(ref_gemm(a, sfa, b, sfb, alpha=0.5)))
    assert torch.equal(bits(nvfp4.gemm(a, sfa, b, sfb, alpha=0.5, out=out)), bits(ref))
    blk = nvfp4.gemm(a, to_blocked(sfa), b, to_blocked(sfb), alpha=0.5, out_dtype=torch.bfloat16)
    assert blk.dtype == torch.bfloat16 and torch.equal(bits(blk), bits(ref))
    op = torch.ops.nvfp4.gemm(a, sfa, b, sfb, 0.5, torch.bfloat16)
    assert torch.equal(bits(op), bits(ref))
    v, sv = operand(g, l, 1, k, (0.0, 1.0, 2.0), byte_max=4)
    gv = nvfp4.gemv(a, sfa, v, sv, out_dtype=torch.bfloat16)
    assert torch.equal(bits(gv), bits(to_bf16(deq(a, sfa) @ deq(v, sv).transpose(-1, -2))))
    if l == 1:
        groups = [(a[0], sfa[0], b[0], sfb[0]), (b[0], sfb[0], a[0], sfa[0])]
        outs = nvfp4.grouped_gemm(groups, alpha=2.0, out_dtype=torch.bfloat16)
        for o, (x, sx, y, sy) in zip(outs, groups):
            assert torch.equal(bits(o), bits(to_bf16(deq(x, sx) @ deq(y, sy).T * 2.0)))
        # One launch, each group in its own output's dtype.
        mixed = [
            torch.empty(m, n, dtype=torch.float16, device=DEV),
            torch.empty(n, m, dtype=torch.bfloat16, device=DEV),
        ]
        nvfp4.grouped_gemm(groups, alpha=2.0, out=mixed)
        assert torch.equal(bits(mixed[0]), bits(ref_gemm(a[0], sfa[0], b[0], sfb[0], alpha=2.0)))
        assert torch.equal(bits(mixed[1]), bits(outs[1]))


def test_bf16_moe_same_as_cpu(g):
    t, e, n, k = 300, 8, 256, 512
    a, sfa = operand(g, 1, t, k)
    b, sfb = operand(g, e, n, k)
    offs = torch.tensor([40, 40, 100, 172, 172, 250, 251, 290], dtype=torch.int32, device=DEV)
    out = torch.full((t, n), float("nan"), dtype=torch.bfloat16, device=DEV)
    got = nvfp4.grouped_gemm((a[0], sfa[0], b, sfb), offsets=offs, alpha=0.5, out=out)
    host = (a[0].cpu(), sfa[0].cpu(), b.cpu(), sfb.cpu())
    cpu = nvfp4.grouped_gemm(host, offsets=offs.cpu(), alpha=0.5, out_dtype=torch.bfloat16)
    assert torch.equal(bits(got[:290].cpu()), bits(cpu[:290]))  # rows 290.. belong to no expert
    assert got[290:].isnan().all()
    assert torch.equal(bits(got[:40]), bits(to_bf16(deq(a[0, :40], sfa[0, :40]) @ deq(b[0], sfb[0]).T * 0.5)))


def test_bf16_where_f16_overflows_and_dual_gemm(g):
    big = torch.full((128, 8), 0x77, dtype=torch.uint8, device=DEV)  # E2M1 6 in both nibbles
    s448 = torch.full((128, 1), 0x7E, dtype=torch.uint8, device=DEV)
    assert nvfp4.gemm(big, s448, big, s448).isinf().all()
    got = nvfp4.gemm(big, s448, big, s448, out_dtype=torch.bfloat16)
    assert (got.float() == 2.0**18 * 440).all()  # 16 * 2688^2 = 2^18 * 441: a tie, to even
    m, n, k = 256, 512, 1536
    a, sfa = operand(g, 1, m, k, (0.5, 1.0), mask=0xBB)
    b1, sfb1 = operand(g, 1, n, k, (0.5, 1.0), mask=0xBB)
    b2, sfb2 = operand(g, 1, n, k, (0.5, 1.0), mask=0xBB)
    x1 = (deq(a, sfa) @ deq(b1, sfb1).transpose(-1, -2)).float()
    x2 = (deq(a, sfa) @ deq(b2, sfb2).transpose(-1, -2)).float()
    ref = (x1 / (1 + torch.exp(-x1)) * x2).to(torch.bfloat16)  # the gate in float32 (SPEC §3)
    out = torch.full((1, m, n), float("nan"), dtype=torch.bfloat16, device=DEV)
    got = nvfp4.dual_gemm(a, sfa, b1, sfb1, b2, sfb2, out=out)
    assert close_bf16(got, ref)
    compiled = torch.compile(lambda *t: torch.ops.nvfp4.dual_gemm(*t, None, torch.bfloat16), fullgraph=True)
    assert torch.equal(bits(compiled(a, sfa, b1, sfb1, b2, sfb2)), bits(got))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["plain", "blocked"])
def test_quantize_bit_identical_to_cpu(dtype, layout):
    torch.manual_seed(3)
    x = torch.randn(300, 512) * torch.logspace(-6, 4, 512)[None, :]
    x[0, :16] = 0.0
    x[1, :32] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25] * 4)  # E2M1 ties
    x[3, :16] = -0.0
    x = x.to(dtype)  # finite: NaN and infinities have their own test below
    for gs in (None, 0.37, torch.tensor([0.37], device=DEV)):
        gv, gsc, gg = nvfp4.quantize(x.to(DEV), gs, layout)
        cv, csc, cg = nvfp4.quantize(x, gs.cpu() if torch.is_tensor(gs) else gs, layout)
        torch.cuda.synchronize()
        assert torch.equal(gv.cpu(), cv), (dtype, layout, gs)
        assert torch.equal(gsc.view(torch.uint8).cpu(), csc.view(torch.uint8)), (dtype, layout, gs)
        assert torch.equal(gg.cpu(), cg), (dtype, layout, gs)
    # A tensor of tiny values: the global scale is 2**-126 (amax / 2688 underflows), as on the CPU.
    tiny = torch.full((4, 64), 2.0**-133).to(dtype) if dtype != torch.float16 else None
    if tiny is not None:
        gv, gsc, gg = nvfp4.quantize(tiny.to(DEV))
        cv, csc, cg = nvfp4.quantize(tiny)
        assert torch.equal(gv.cpu(), cv) and torch.equal(gsc.view(torch.uint8).cpu(), csc.view(torch.uint8))
        assert gg.item() == cg.item() == 2.0**-126


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quantize_dequant_is_the_quantization_written_back(dtype):
    """torch.ops.nvfp4.quantize_dequant: each element's e2m1 * e4m3 (no global scale) in bfloat16
    (float16 for float16 x), bit-identical to the quantizer's values and scales decoded, on the GPU
    and on the CPU; a block holding a NaN or an infinity is 16 NaNs on the GPU; the outputs
    poisoned first, through a CUDA graph."""
    torch.manual_seed(6)
    x = torch.randn(3, 70, 512) * torch.logspace(-6, 4, 512)[None, None, :]
    x[0, 0, :32] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25] * 4)  # E2M1 ties
    x[1, 3, :16] = -0.0
    x = x.to(dtype)
    want_dt = torch.float16 if dtype == torch.float16 else torch.bfloat16
    for gs in (None, 0.37):
        v, sc, g = nvfp4.quantize(x, gs)
        want = nvt.dequantize(v, sc, dtype=torch.float64).to(want_dt)  # exact in both types
        for dev in ("cpu", DEV):
            got, gg = torch.ops.nvfp4.quantize_dequant(x.to(dev), gs)
            assert got.dtype == want_dt and got.shape == x.shape
            assert torch.equal(got.cpu().view(torch.int16), want.view(torch.int16)), (dtype, gs, dev)
            assert torch.equal(gg.cpu(), g), (dtype, gs, dev)
    bad = x.clone()
    bad[0, 0, 0], bad[2, 69, 511], bad[1, 5, 16] = float("nan"), float("inf"), -float("inf")
    got, _ = torch.ops.nvfp4.quantize_dequant(bad.to(DEV), 0.37)
    v, sc, _ = nvfp4.quantize(torch.where(torch.isfinite(bad), bad, torch.zeros_like(bad)), 0.37)
    want = nvt.dequantize(v, sc, dtype=torch.float64).to(want_dt)
    blocks = (~torch.isfinite(bad.float())).reshape(3, 70, 32, 16).any(-1, keepdim=True).expand(3, 70, 32, 16)
    want[blocks.reshape(3, 70, 512)] = float("nan")
    assert torch.equal(got.cpu().isnan(), want.isnan())
    assert torch.equal(got.cpu()[~want.isnan()], want[~want.isnan()])
    # Captured: new input each replay, outputs poisoned before it.
    xd = x.to(DEV)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.ops.nvfp4.quantize_dequant(xd, 0.37)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _ = torch.ops.nvfp4.quantize_dequant(xd, 0.37)
    xd.copy_(torch.randn_like(xd))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    v, sc, _ = nvfp4.quantize(xd.cpu(), 0.37)
    want = nvt.dequantize(v, sc, dtype=torch.float64).to(want_dt)
    assert torch.equal(out.cpu().view(torch.int16), want.view(torch.int16))


def gpu_rule(x, gs, layout):
    """The GPU quantizer's rule for NaN and infinities (docs/FORMAT.md §1), built from the CPU
    quantizer: a 16-block holding one gets the scale 0x7F (the float8_e4m3fn NaN) and +0 codes,
    every other block is quantized as on the CPU, and the amax global scale ignores them."""
    bad = ~torch.isfinite(x.float())
    blocks = bad.reshape(*x.shape[:-1], -1, 16).any(-1)
    if gs is None:
        _, _, gs = nvfp4.quantize(torch.where(bad, torch.zeros_like(x), x))  # the finite elements' amax
    clean = x.clone()
    clean.reshape(*x.shape[:-1], -1, 16)[blocks] = 0
    v, s, g = nvfp4.quantize(clean, gs)
    s = s.view(torch.uint8)
    s[blocks] = 0x7F
    if layout == "blocked":
        s = to_blocked(s.view(torch.float8_e4m3fn).reshape(-1, *s.shape[-2:])).view(torch.uint8)
    return v, s, g


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["plain", "blocked"])
def test_quantize_nan_and_inf_mark_their_blocks(dtype, layout):
    """On the GPU (no synchronization), a NaN or an infinity gives its 16-block the NaN scale:
    bit-identical to the rule's CPU model, at the first and last elements, both sides of a block
    boundary, and one infinity in a tiny tensor (the other blocks keep their scales)."""
    torch.manual_seed(4)
    nan, inf = float("nan"), float("inf")
    x = torch.randn(2, 150, 512) * torch.logspace(-3, 2, 512)[None, None, :]
    x[0, 0, 0] = nan
    x[-1, -1, -1] = inf
    x[0, 5, 15], x[0, 5, 16] = -inf, nan
    x[1, 77, 300] = nan
    tiny = torch.randn(64, 256) * (2.0**-12 if dtype == torch.float16 else 2.0**-100)
    tiny[10, 100] = inf
    for data in (x.to(dtype), tiny.to(dtype)):
        for gs in (None, 0.37, torch.tensor([0.37], device=DEV)):
            gv, gsc, gg = nvfp4.quantize(data.to(DEV), gs, layout)
            mv, msc, mg = gpu_rule(data, gs.cpu() if torch.is_tensor(gs) else gs, layout)
            torch.cuda.synchronize()
            assert torch.equal(gv.cpu(), mv), (dtype, layout, gs)
            assert torch.equal(gsc.view(torch.uint8).cpu().reshape(-1), msc.reshape(-1)), (dtype, layout, gs)
            assert torch.equal(gg.cpu(), mg), (dtype, layout, gs)
    # The tiny tensor's global scale comes from its finite elements: no block is crushed to zero.
    tiny = tiny.to(dtype)
    gv, gsc, gg = nvfp4.quantize(tiny.to(DEV))
    scales = gsc.view(torch.uint8).cpu()
    assert (scales == 0x7F).sum() == 1 and (scales == 0).sum() == 0
    assert 0 < gg.item() < tiny[torch.isfinite(tiny)].abs().max().item() * 2**-10


def test_nan_blocks_reach_exactly_their_gemm_rows():
    """A block marked by the GPU quantizer makes NaN exactly the GEMM outputs whose sums use it."""
    torch.manual_seed(6)
    x = torch.randn(96, 512, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(256, 512, device=DEV, dtype=torch.bfloat16)
    x[7, 100] = float("nan")
    x[40, 511] = float("inf")
    w[3, 0] = float("-inf")
    xv, xs, xg = nvfp4.quantize(x)
    wv, ws, wg = nvfp4.quantize(w)
    y = nvfp4.gemm(xv, xs, wv, ws, alpha=(xg * wg).item())
    want = torch.zeros(96, 256, dtype=torch.bool, device=DEV)
    want[[7, 40], :] = True
    want[:, 3] = True
    assert torch.equal(y.isnan(), want)
    assert torch.isfinite(y[~want]).all()


def test_quantize_check_finite_raises_naming_the_element():
    """``check_finite=True`` synchronizes and raises as the CPU does: the first NaN or infinity,
    or a device global scale that is not finite and > 0; never under CUDA graph capture."""
    x = torch.randn(3, 40, 64, device=DEV)
    x[2, 0, 0] = float("inf")
    x[1, 7, 33] = float("nan")  # element 1 * 2560 + 7 * 64 + 33, the first
    want = "element 3041 ([l, row, k] = [1, 7, 33]) is NaN: NVFP4 has no NaN or infinity"
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for gs in (None, 0.5, torch.tensor([0.5], device=DEV)):
            with pytest.raises(ValueError, match=re.escape(want)):
                nvfp4.quantize(x.to(dtype), gs, check_finite=True)
            with pytest.raises(ValueError, match=re.escape(want)):
                nvfp4.quantize(x.to(dtype).cpu(), gs.cpu() if torch.is_tensor(gs) else gs)
    clean = torch.nan_to_num(x, nan=1.0, posinf=2.0)
    gv, gsc, gg = nvfp4.quantize(clean, check_finite=True)
    cv, csc, cg = nvfp4.quantize(clean.cpu())
    assert torch.equal(gv.cpu(), cv) and torch.equal(gg.cpu(), cg)
    # A device global scale of 0: every scale NaN and the global NaN without the check; refused with it.
    zero = torch.zeros(1, device=DEV)
    gv, gsc, gg = nvfp4.quantize(clean, zero)
    assert (gsc.view(torch.uint8) == 0x7F).all() and (gv == 0).all() and gg.isnan().all()
    with pytest.raises(ValueError, match=re.escape("the global scale on the device is 0: it must be finite and > 0")):
        nvfp4.quantize(clean, zero, check_finite=True)
    # Under capture the check cannot wait for the stream: refused before anything is enqueued.
    vals = torch.empty(3, 40, 32, dtype=torch.uint8, device=DEV)
    scales = torch.empty(3, 40, 4, dtype=torch.uint8, device=DEV)
    glob = torch.empty(1, dtype=torch.float32, device=DEV)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        nvfp4.quantize(clean, 0.5, out=(vals, scales, glob), check_finite=True)  # warm-up
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="graph capture"):
        with torch.cuda.graph(graph):
            vals.zero_()
            nvfp4.quantize(clean, 0.5, out=(vals, scales, glob), check_finite=True)



def test_quantize_device_global_scale_under_capture():
    """A one-float CUDA tensor as the global scale is read by the kernel, not by the host: a
    captured graph follows a new value written into it between replays."""
    torch.manual_seed(5)
    x = torch.randn(256, 512, device=DEV, dtype=torch.bfloat16)
    gs = torch.tensor([0.37], device=DEV)
    vals = torch.empty(256, 256, dtype=torch.uint8, device=DEV)
    scales = torch.empty(256, 32, dtype=torch.uint8, device=DEV)
    glob = torch.empty(1, dtype=torch.float32, device=DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        nvfp4.quantize(x, gs, out=(vals, scales, glob))  # warm-up (compiles, binds)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        nvfp4.quantize(x, gs, out=(vals, scales, glob))
    for value in (0.37, 0.011, 2.5):
        gs.fill_(value)
        vals.fill_(0xAB)
        graph.replay()
        torch.cuda.synchronize()
        cv, csc, cg = nvfp4.quantize(x.cpu(), value)
        assert torch.equal(vals.cpu(), cv), value
        assert torch.equal(scales.cpu(), csc.view(torch.uint8)), value
        assert glob.item() == cg.item() == torch.tensor(value).item()

def test_torch_compile(g):
    a, sfa = operand(g, 1, 128, 256)
    b, sfb = operand(g, 1, 256, 256)

    def f(x, w, ws):
        q, s, gx = torch.ops.nvfp4.quantize(x, 0.01)
        return torch.ops.nvfp4.gemm(q, s, w, ws, 0.5) * 2

    x = torch.randn(64, 256, device=DEV, dtype=torch.bfloat16)
    eager = f(x, b[0], sfb[0])
    compiled = torch.compile(f, fullgraph=True)(x, b[0], sfb[0])
    assert torch.equal(bits(eager), bits(compiled))
    cg = torch.compile(lambda *t: torch.ops.nvfp4.gemm(*t), fullgraph=True)
    assert torch.equal(bits(cg(a, sfa, b, sfb, None)), bits(ref_gemm(a, sfa, b, sfb)))


def test_cuda_graph_capture(g):
    a, sfa = operand(g, 1, 128, 512)
    b, sfb = operand(g, 1, 384, 512)
    x = torch.randn(128, 512, device=DEV, dtype=torch.bfloat16)
    out = torch.empty(1, 128, 384, dtype=torch.float16, device=DEV)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: kernels compiled and workspaces made outside capture
        for _ in range(2):
            nvfp4.gemm(a, sfa, b, sfb, out=out)
            nvfp4.quantize(x, 0.02)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        nvfp4.gemm(a, sfa, b, sfb, out=out)
        qv, qs, qg = nvfp4.quantize(x, 0.02)
    for _ in range(2):
        a2, sfa2 = operand(g, 1, 128, 512)
        a.copy_(a2)
        sfa.copy_(sfa2)
        x.copy_(torch.randn_like(x))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(bits(out), bits(ref_gemm(a, sfa, b, sfb)))
        cv, cs, _ = nvfp4.quantize(x.cpu(), 0.02)
        assert torch.equal(qv.cpu(), cv) and torch.equal(qs.view(torch.uint8).cpu(), cs.view(torch.uint8))


def test_two_streams(g):
    ops = []
    for _ in range(2):
        a, sfa = operand(g, 1, 256, 2048)
        b, sfb = operand(g, 1, 512, 2048)
        ops.append((a, sfa, b, sfb, torch.cuda.Stream()))
    outs = []
    for a, sfa, b, sfb, s in ops:
        s.wait_stream(torch.cuda.current_stream())
    for _ in range(20):
        outs = []
        for a, sfa, b, sfb, s in ops:
            with torch.cuda.stream(s):
                outs.append(nvfp4.gemm(a, sfa, b, sfb))
    torch.cuda.synchronize()
    for (a, sfa, b, sfb, _), o in zip(ops, outs):
        assert torch.equal(bits(o), bits(ref_gemm(a, sfa, b, sfb)))


@pytest.mark.parametrize("m", [1, 16, 64, 200])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_w4a4_exact_tier_is_bit_identical(g, m, dtype):
    """The exact tier through ``Linear(mode="w4a4")`` on both its routes (one row: the W4A4 GEMV;
    more: the W4A16 kernels on the quantization written back): activations on the e2m1 grid with
    a 6 in every 16-block and input_scale 1 (so quantizing them is exact), weight scales 0..3, sums
    exact in float32: the output equals the float64 product rounded once, bit for bit."""
    n, k = 512, 2048
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0])
    x = grid[torch.randint(0, len(grid), (m, k), generator=g)]
    x.view(m, k // 16, 16)[:, :, 0] = 6.0 * torch.where(torch.rand(m, k // 16, generator=g) < 0.5, -1.0, 1.0)
    wv, ws = operand(g, 1, n, k)
    wv, ws = wv[0], ws[0]
    layer = nvt.Linear(wv, ws, 1.0, input_scale=1.0, mode="w4a4")
    want = (x.double() @ deq(wv, ws).cpu().T).to(torch.float16)
    y = layer(x.to(dtype).to(DEV))
    assert y.dtype == torch.float16 and y.shape == (m, n)
    assert torch.equal(bits(y.cpu()), bits(want)), (m, dtype)


@pytest.mark.parametrize("convention", ["modelopt", "compressed-tensors"])
def test_linear_w4a4_matches_dequantized_twin(convention):
    torch.manual_seed(5)
    n, k = 384, 1024
    w = torch.randn(n, k, device=DEV) * 0.05
    x = torch.randn(4, 33, k, device=DEV, dtype=torch.bfloat16)
    wv, ws, wg = nvfp4.quantize(w)
    input_scale = float(x.float().abs().max()) / 2688.0
    if convention == "modelopt":
        sd = {"weight": wv, "weight_scale": ws, "weight_scale_2": wg[0], "input_scale": torch.tensor(input_scale)}
    else:
        sd = {
            "weight_packed": wv,
            "weight_scale": ws,
            "weight_global_scale": 1.0 / wg[0],
            "input_global_scale": torch.tensor(1.0 / input_scale),
        }
    layer = nvt.Linear.from_state_dict(sd, out_dtype=torch.bfloat16, mode="w4a4")
    y = layer(x)
    assert y.shape == (4, 33, n) and y.dtype == torch.bfloat16
    # The twin: the same NVFP4 activations and weight, dequantized, in float64.
    xv, xs, _ = nvfp4.quantize(x.reshape(-1, k), layer.input_scale)
    xd = deq(xv, xs) * layer.input_scale
    wd = deq(wv, ws) * layer.weight_global
    twin = (xd @ wd.T).to(torch.float16).reshape(4, 33, n)
    alpha = layer.input_scale * layer.weight_global
    g16 = nvfp4.gemm(xv, xs, layer.weight, layer.weight_scale, alpha=alpha)
    assert close(g16.reshape(4, 33, n), twin)
    # The layer's route on CUDA: the activations' quantization written back as bfloat16, then the
    # W4A16 GEMM on the packed weight, rounding once to bfloat16 (not float16 first).
    xq, _ = torch.ops.nvfp4.quantize_dequant(x.reshape(-1, k), layer.input_scale)
    assert torch.equal(xq.double(), deq(xv, xs))
    packed = layer._packed[torch.bfloat16]
    gq = nvfp4.gemm(xq, None, layer.weight, layer.weight_scale, alpha=alpha, out_dtype=torch.bfloat16, packed=packed)
    assert torch.equal(y, gq.reshape(4, 33, n))
    assert close_bf16(y, (xd @ wd.T).float().to(torch.bfloat16).reshape(4, 33, n))
    # The NVFP4 x NVFP4 GEMM of the same operands: the same products, another float32 order.
    gbf = nvfp4.gemm(xv, xs, layer.weight, layer.weight_scale, alpha=alpha, out_dtype=torch.bfloat16)
    assert close_bf16(gbf.reshape(4, 33, n), (xd @ wd.T).float().to(torch.bfloat16).reshape(4, 33, n))
    dense = x.double().reshape(-1, k) @ w.double().T
    rel = (y.double().reshape(-1, n) - dense).norm() / dense.norm()
    assert rel < 0.2  # NVFP4 W4A4 is lossy; the exactness is in the twin comparison above


def test_errors_on_gpu(g):
    a, sfa = operand(g, 1, 128, 256)
    with pytest.raises(ValueError, match="cuda|cpu"):
        nvfp4.gemm(a, sfa, a.cpu(), sfa.cpu())
    with pytest.raises(ValueError, match="contiguous"):
        nvfp4.gemm(a[:, :, ::2], sfa[:, :, ::2], a[:, :, ::2], sfa[:, :, ::2])
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4.gemm(a[..., :4].contiguous(), sfa[..., :1].contiguous(), a[..., :4].contiguous(), sfa[..., :1].contiguous())
    with pytest.raises(ValueError):
        nvfp4.gemm(a, sfa, a, sfa, out=torch.empty(1, 128, 128, device=DEV, dtype=torch.float32))
    with pytest.raises(ValueError):
        nvfp4.quantize(torch.zeros(4, 32, device=DEV, dtype=torch.int32))
    off = a.view(-1)[8 : 8 + 128 * 120].view(1, 128, 120)  # 8 bytes past a 16-byte boundary
    with pytest.raises(ValueError, match="aligned"):
        nvfp4.gemm(off, sfa[:, :, :15].contiguous(), a[:, :, :120].contiguous(), sfa[:, :, :15].contiguous())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_device_and_mixed_devices(g):
    a, sfa = operand(g, 1, 128, 256)
    b, sfb = operand(g, 1, 64, 256)
    a1, sfa1, b1, sfb1 = (t.to("cuda:1") for t in (a, sfa, b, sfb))
    got = nvfp4.gemm(a1, sfa1, b1, sfb1)
    assert got.device == torch.device("cuda:1")
    assert torch.equal(bits(got.cpu()), bits(ref_gemm(a, sfa, b, sfb).cpu()))
    assert torch.cuda.current_device() == 0
    with pytest.raises(ValueError, match="cuda:1"):
        nvfp4.gemm(a, sfa, b1, sfb1)
    # The skeleton (pre-pass, workspace) on the second device, beside a launch on the first.
    a, sfa = operand(g, 1, 128, 2048)
    b, sfb = operand(g, 1, 512, 2048)
    got1 = nvfp4.gemm(*(t.to("cuda:1") for t in (a, sfa, b, sfb)))
    got0 = nvfp4.gemm(a, sfa, b, sfb)
    want = bits(ref_gemm(a, sfa, b, sfb).cpu())
    assert torch.equal(bits(got1.cpu()), want) and torch.equal(bits(got0.cpu()), want)
    # The quantizer on the second device, bit-identical to the CPU one.
    x = torch.randn(64, 512, generator=g).to(torch.bfloat16)
    gv, gsc, gg = nvfp4.quantize(x.to("cuda:1"))
    cv, csc, cg = nvfp4.quantize(x)
    assert gv.device == torch.device("cuda:1")
    assert torch.equal(gv.cpu(), cv) and torch.equal(gsc.view(torch.uint8).cpu(), csc.view(torch.uint8))
    assert torch.equal(gg.cpu(), cg)
    assert torch.cuda.current_device() == 0
