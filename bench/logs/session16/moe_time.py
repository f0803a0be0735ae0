"""µs per MoE call (torch.ops.nvfp4.grouped_gemm_moe), a CUDA graph of 50 calls replayed, median
of 20 replays; uniform random routings, random weight bytes, every scale 1.0 (e4m3 0x38). The
route and the kernels are the environment's (NVFP4_MOE_GEMV, NVFP4_KERNELS_DIR).

  python moe_time.py SET LABEL
    run3  W4A16 bf16 tokens, plain scales, f16 out, at SPEC §9's decode sizes (session 16, run 3)
    run8  blocked scales, bf16 out: W4A16, W4A16 packed, W4A4 (tokens quantized beforehand) at
          batch-1 to SPEC decode sizes (run 8)
    run9  run 8's W4A16 and W4A4 at batch-1 to batch-4 sizes (run 9)
  python moe_time.py ncu E N K T
    one W4A16 plain-scale call, three times (for `ncu -s 1 -c 1`)
"""
import sys

import torch
import nvfp4
import nvfp4.torch  # noqa: F401

BF16 = torch.bfloat16
SETS = {
    "run3": [(2, 256, 256, 8), (128, 1536, 2048, 256), (128, 2048, 768, 256), (32, 4096, 7168, 38),
             (32, 7168, 2048, 30), (8, 28672, 4096, 64)],
    "run8": [(2, 256, 256, 8)] + [(128, 1536, 2048, t) for t in (8, 32, 64, 128, 256)]
    + [(128, 2048, 768, t) for t in (8, 16, 32, 64, 256)] + [(32, 4096, 7168, t) for t in (2, 8, 38)]
    + [(32, 7168, 2048, t) for t in (2, 8, 30)] + [(8, 28672, 4096, 2), (8, 4096, 14336, 2), (8, 28672, 4096, 16)],
    "run9": [(2, 256, 256, 8)] + [(128, 1536, 2048, t) for t in (8, 16, 32)] + [(128, 2048, 768, t) for t in (8, 16)]
    + [(32, 4096, 7168, t) for t in (2, 8)] + [(32, 7168, 2048, t) for t in (2, 8)]
    + [(8, 28672, 4096, 2), (8, 4096, 14336, 2)],
}


def operands(e, n, k, t):
    """Weights [E, N, K/2], plain scales [E, N, K/16], bf16 tokens [T, K], end offsets [E]."""
    b = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device="cuda")
    sb = torch.full((e, n, k // 16), 0x38, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    x = torch.randn(t, k, device="cuda").to(BF16)
    counts = torch.bincount(torch.randint(0, e, (t,), device="cuda"), minlength=e)
    return b, sb, x, counts.cumsum(0).to(torch.int32), int((counts > 0).sum())


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
    return replay_median_us(g, 50, 20)


def replay_median_us(g, calls, replays):
    """µs per call of graph `g` (`calls` calls): the median over `replays` timed replays."""
    ts = []
    for _ in range(replays):
        a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        z.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(z) * 1000 / calls)
    ts.sort()
    return ts[len(ts) // 2]


def run3(label):
    torch.manual_seed(0)
    for e, n, k, t in SETS["run3"]:
        b, sb, x, ends, _ = operands(e, n, k, t)
        us = timed(lambda: torch.ops.nvfp4.grouped_gemm_moe(x, None, b, sb, ends, alpha=1.0))
        print(f"{label} E={e} N={n} K={k} T={t}: {us:.1f} us/call", flush=True)


def blocked(which, label, packed):
    for e, n, k, t in SETS[which]:
        torch.manual_seed(0)
        b, sb, x, ends, active = operands(e, n, k, t)
        sb = sb.reshape(-1)  # blocked: the same bytes, flat (N % 128 == 0, K % 64 == 0)
        va, sa, _ = nvfp4.quantize(x, layout="blocked")
        variants = {"w16": lambda: torch.ops.nvfp4.grouped_gemm_moe(x, None, b, sb, ends, 1.0, BF16, "blocked")}
        if packed:
            pk = nvfp4.pack(b, sb, dtype=BF16, layout="blocked")
            variants["w16packed"] = lambda: torch.ops.nvfp4.grouped_gemm_moe(
                x, None, b, sb, ends, 1.0, BF16, "blocked", pk
            )
        variants["w4a4"] = lambda: torch.ops.nvfp4.grouped_gemm_moe(va, sa, b, sb, ends, 1.0, BF16, "blocked")
        res = []
        for name, f in variants.items():
            try:
                res.append(f"{name} {timed(f):.1f}")
            except Exception as err:  # noqa: BLE001
                res.append(f"{name} ERR {str(err)[:80]}")
        mb = active * n * k * 9 / 16 / 1e6
        print(f"{label} E={e} N={n} K={k} T={t} active={active} touched={mb:.1f}MB: " + "  ".join(res), flush=True)


def ncu(e, n, k, t):
    torch.manual_seed(0)
    b, sb, x, ends, _ = operands(e, n, k, t)
    for _ in range(3):
        torch.ops.nvfp4.grouped_gemm_moe(x, None, b, sb, ends, alpha=1.0)
    torch.cuda.synchronize()


if __name__ == "__main__":
    which = sys.argv[1]
    if which == "ncu":
        ncu(*map(int, sys.argv[2:6]))
    elif which == "run3":
        run3(sys.argv[2])
    else:
        blocked(which, sys.argv[2], packed=which == "run8")
