"""µs per MoE decode call, W4A16 on packed weights only (session 21's moe_sched.py decode rows
without their W4A4 call): a CUDA graph of 50 calls replayed, the median of 20 replays. The kernels
are the environment's (NVFP4_KERNELS_DIR).

  python moe_decode16.py LABEL
"""
import os
import sys

import torch
import nvfp4
import nvfp4.torch  # noqa: F401

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "session21"))
from moe_sched import BF16, DECODE, operands, timed  # noqa: E402


def main(label):
    row = []
    for e, n, k, t in DECODE:
        torch.manual_seed(0)
        b, sb, x, ends, _ = operands(e, n, k, t)
        pk = nvfp4.pack(b, sb, dtype=BF16, layout="plain")
        us = timed(lambda: torch.ops.nvfp4.grouped_gemm_moe(x, None, b, sb, ends, 1.0, BF16, "plain", pk), 50, 20)
        row.append(f"E={e} N={n} K={k} T={t} {us:.1f}")
        del b, sb, x, pk
        torch.cuda.empty_cache()
    print(f"{label}: " + "  ".join(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
