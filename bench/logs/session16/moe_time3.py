# µs per MoE call, a CUDA graph of 50 calls replayed, median of 20 replays, blocked scales: W4A16
# bf16 on the weights as they are and packed, W4A4 (tokens quantized beforehand); the route is
# the environment's (NVFP4_MOE_GEMV). argv[1]: a label.
import sys, torch, nvfp4, nvfp4.torch  # noqa: F401
cases = [(2, 256, 256, 8)]
cases += [(128, 1536, 2048, t) for t in (8, 32, 64, 128, 256)]
cases += [(128, 2048, 768, t) for t in (8, 16, 32, 64, 256)]
cases += [(32, 4096, 7168, t) for t in (2, 8, 38)]
cases += [(32, 7168, 2048, t) for t in (2, 8, 30)]
cases += [(8, 28672, 4096, 2), (8, 4096, 14336, 2), (8, 28672, 4096, 16)]

def timed(f):
    f()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(50):
            f()
    ts = []
    for _ in range(20):
        a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); z.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(z) * 1000 / 50)
    ts.sort()
    return ts[len(ts) // 2]

bf16 = torch.bfloat16
for (e, n, k, t) in cases:
    torch.manual_seed(0)
    b = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device="cuda")
    sb = torch.full((e * n * k // 16,), 0x38, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    x = torch.randn(t, k, device="cuda").to(bf16)
    ids = torch.randint(0, e, (t,), device="cuda")
    ends = torch.bincount(ids, minlength=e).cumsum(0).to(torch.int32)
    active = int((torch.bincount(ids, minlength=e) > 0).sum())
    pk = nvfp4.pack(b, sb, dtype=bf16, layout="blocked")
    va, sa, _ = nvfp4.quantize(x, layout="blocked")
    variants = {
        "w16": lambda: torch.ops.nvfp4.grouped_gemm_moe(x, None, b, sb, ends, 1.0, bf16, "blocked"),
        "w16packed": lambda: torch.ops.nvfp4.grouped_gemm_moe(x, None, b, sb, ends, 1.0, bf16, "blocked", pk),
        "w4a4": lambda: torch.ops.nvfp4.grouped_gemm_moe(va, sa, b, sb, ends, 1.0, bf16, "blocked"),
    }
    res = []
    for name, f in variants.items():
        try:
            res.append(f"{name} {timed(f):.1f}")
        except Exception as err:  # noqa: BLE001
            res.append(f"{name} ERR {str(err)[:80]}")
    mb = active * n * k * 9 / 16 / 1e6
    print(f"{sys.argv[1]} E={e} N={n} K={k} T={t} active={active} touched={mb:.1f}MB: " + "  ".join(res), flush=True)
    del b, sb, pk
