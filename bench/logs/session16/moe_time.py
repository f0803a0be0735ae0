# µs per MoE call (W4A16), a CUDA graph of 50 calls replayed, median of 20 replays.
import sys, torch, nvfp4, nvfp4.torch  # noqa: F401
torch.manual_seed(0)
for (e, n, k, t) in [(2, 256, 256, 8), (128, 1536, 2048, 256), (128, 2048, 768, 256), (32, 4096, 7168, 38), (32, 7168, 2048, 30), (8, 28672, 4096, 64)]:
    b = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device="cuda")
    sb = torch.full((e, n, k // 16), 0x38, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    x = torch.randn(t, k, device="cuda").to(torch.bfloat16)
    ids = torch.randint(0, e, (t,), device="cuda")
    ends = torch.bincount(ids, minlength=e).cumsum(0).to(torch.int32)
    out = torch.ops.nvfp4.grouped_gemm_moe(x, None, b, sb, ends, alpha=1.0)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            torch.ops.nvfp4.grouped_gemm_moe(x, None, b, sb, ends, alpha=1.0)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(50):
            torch.ops.nvfp4.grouped_gemm_moe(x, None, b, sb, ends, alpha=1.0)
    ts = []
    for _ in range(20):
        a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); z.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(z) * 1000 / 50)
    ts.sort()
    print(f"{sys.argv[1]} E={e} N={n} K={k} T={t}: {ts[len(ts)//2]:.1f} us/call", flush=True)
