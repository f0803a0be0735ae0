"""Where a W4A4 Linear call's time goes on the W4A16 route (session 22): µs per call in a CUDA
graph of 48 calls over weight sets rotated past 3x L2 (session 19's dense_ab protocol), median of
15 replays, bf16 activations, packed weights:

  gemm   the W4A16 GEMM alone (activations already 16-bit)
  dq     torch.ops.nvfp4.quantize_dequant alone
  q      torch.ops.nvfp4.quantize alone (the NVFP4 route's pass)
  pair   quantize_dequant, then the W4A16 GEMM of its output (what Linear(mode="w4a4") runs)

  python w4a4_chain.py LABEL [M,M,...]        8192^2 and 7168 x 2048 at those M (default 16,64)
  python w4a4_chain.py ncu M                  three pairs on 8192^2 (for ncu -k regex:dequant)
"""
import os
import sys

import torch
import nvfp4
import nvfp4.torch  # noqa: F401

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "session19"))
from dense_ab import captured_calls, weight_sets  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "session16"))
from moe_time import replay_median_us  # noqa: E402

BF16 = torch.bfloat16
CALLS = 48
G = 0.37


def calls(kind, sets, x):
    ops = torch.ops.nvfp4

    def gemm(i, a):
        b, sb, pk = sets[i % len(sets)]
        return ops.gemm(a, None, b, sb, 1.0, BF16, "blocked", pk)

    if kind == "gemm":
        return lambda i: gemm(i, x)
    if kind == "dq":
        return lambda i: ops.quantize_dequant(x, G)
    if kind == "q":
        return lambda i: ops.quantize(x, G)
    return lambda i: gemm(i, ops.quantize_dequant(x, G)[0])


def timed(call, n):
    g = captured_calls(call, n, CALLS)
    g.replay()
    torch.cuda.synchronize()
    return replay_median_us(g, CALLS, 15)


def main(label, ms):
    torch.manual_seed(0)
    for n, k in [(8192, 8192), (7168, 2048)]:
        sets = weight_sets(n, k)
        for m in ms:
            x = torch.randn(m, k, device="cuda").to(BF16)
            row = [f"{kind} {timed(calls(kind, sets, x), len(sets)):.1f}" for kind in ("gemm", "dq", "q", "pair")]
            print(f"{label} N={n} K={k} M={m}: " + "  ".join(row), flush=True)
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    if sys.argv[1] == "ncu":
        m = int(sys.argv[2])
        sets = weight_sets(8192, 8192)[:1]
        x = torch.randn(m, 8192, device="cuda").to(BF16)
        call = calls("pair", sets, x)
        for i in range(3):
            call(i)
        torch.cuda.synchronize()
    else:
        main(sys.argv[1], [int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "16,64").split(",")])
