"""µs per MoE call (torch.ops.nvfp4.grouped_gemm_moe) at SPEC §9's prefill and decode sizes, W4A16
on packed weights and W4A4 (tokens quantized beforehand): a CUDA graph of C calls replayed, the
median of R replays (prefill C = 4, R = 7; decode C = 50, R = 20). Uniform random routings,
random weight bytes, every scale 1.0, plain scales. The route and the kernels are the
environment's (NVFP4_KERNELS_DIR).

  python moe_sched.py LABEL [prefill|decode|all|few]   (few: the prefill rows but Mixtral's)
  python moe_sched.py one E N K T    three W4A16 packed calls (for `ncu -k regex:w4a16bf16p -s 1 -c 1`)
"""
import os
import sys

import torch
import nvfp4
import nvfp4.torch  # noqa: F401

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "session16"))
from moe_time import operands, replay_median_us  # noqa: E402

BF16 = torch.bfloat16
PREFILL = [(8, 28672, 4096, 8192), (8, 4096, 14336, 8192), (128, 1536, 2048, 16384), (128, 2048, 768, 16384),
           (32, 4096, 7168, 3822), (32, 7168, 2048, 3827)]
DECODE = [(8, 28672, 4096, 64), (8, 4096, 14336, 64), (128, 1536, 2048, 256), (128, 2048, 768, 256),
          (32, 4096, 7168, 38), (32, 7168, 2048, 30)]


def timed(f, calls, replays):
    f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            f()
    g.replay()
    torch.cuda.synchronize()
    return replay_median_us(g, calls, replays)


def main(label, which):
    sets = {"prefill": PREFILL, "decode": DECODE, "all": PREFILL + DECODE, "few": PREFILL[2:]}[which]
    for e, n, k, t in sets:
        torch.manual_seed(0)
        b, sb, x, ends, active = operands(e, n, k, t)
        pk = nvfp4.pack(b, sb, dtype=BF16, layout="plain")
        va, sa, _ = nvfp4.quantize(x)
        calls, replays = (4, 7) if t > 512 else (50, 20)
        res = []
        for name, f in {
            "w16p": lambda: torch.ops.nvfp4.grouped_gemm_moe(x, None, b, sb, ends, 1.0, BF16, "plain", pk),
            "w4a4": lambda: torch.ops.nvfp4.grouped_gemm_moe(va, sa, b, sb, ends, 1.0, BF16, "plain"),
        }.items():
            try:
                us = timed(f, calls, replays)
                tflops = 2 * t * n * k / us / 1e6
                res.append(f"{name} {us:.1f} ({tflops:.0f} TFLOP/s)")
            except Exception as err:  # noqa: BLE001
                res.append(f"{name} ERR {str(err)[:80]}")
        print(f"{label} E={e} N={n} K={k} T={t} active={active}: " + "  ".join(res), flush=True)
        del b, sb, x, pk, va, sa
        torch.cuda.empty_cache()


def one(e, n, k, t):
    torch.manual_seed(0)
    b, sb, x, ends, _ = operands(e, n, k, t)
    pk = nvfp4.pack(b, sb, dtype=BF16, layout="plain")
    for _ in range(3):
        torch.ops.nvfp4.grouped_gemm_moe(x, None, b, sb, ends, 1.0, BF16, "plain", pk)
    torch.cuda.synchronize()


if __name__ == "__main__":
    if sys.argv[1] == "one":
        one(*map(int, sys.argv[2:6]))
    else:
        main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "all")
