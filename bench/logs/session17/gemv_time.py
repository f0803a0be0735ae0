"""µs per dense W4A16 call (torch.ops.nvfp4.gemm, bf16 activations, blocked scales), a CUDA graph
of 50 calls replayed, median of 20 replays (session 16's `timed`); random weight bytes, every
scale 1.0. The kernels are the environment's (NVFP4_KERNELS_DIR). Session 17 ran it on branch
`gemv-packed`, where a packed weight took the packed-weight GEMV; on main both forms of a weight
take the GEMV at M <= 8.

  python gemv_time.py LABEL [plain]   the SPEC §9 decode projections at M = 1, 4, 8, packed weights
                                      (and the weights as they are with `plain`)
  python gemv_time.py ncu N K M packed|plain
                                      one call, three times (for `ncu -s 1 -c 1`)
"""
import os
import sys

import torch
import nvfp4
import nvfp4.torch  # noqa: F401

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session16"))
from moe_time import timed  # noqa: E402  (the graph protocol of session 16's script)

BF16 = torch.bfloat16
SHAPES = [(8192, 8192), (7168, 16384), (4096, 7168), (7168, 2048)]


def operands(n, k, m):
    b = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
    sb = torch.full((n * k // 16,), 0x38, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    x = torch.randn(m, k, device="cuda").to(BF16)
    return b, sb, x


def call(n, k, m, packed):
    torch.manual_seed(0)
    b, sb, x = operands(n, k, m)
    pk = nvfp4.pack(b, sb, dtype=BF16, layout="blocked") if packed else None
    return lambda: torch.ops.nvfp4.gemm(x, None, b, sb, 1.0, BF16, "blocked", pk)


def main(label, plain):
    for n, k in SHAPES:
        for m in (1, 4, 8):
            res = [f"packed {timed(call(n, k, m, True)):.1f}"]
            if plain:
                res.append(f"plain {timed(call(n, k, m, False)):.1f}")
            mb = n * k * 9 / 16 / 1e6
            print(f"{label} N={n} K={k} M={m} ({mb:.1f} MB): " + "  ".join(res), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "ncu":
        n, k, m = map(int, sys.argv[2:5])
        f = call(n, k, m, sys.argv[5] == "packed")
        for _ in range(3):
            f()
        torch.cuda.synchronize()
    else:
        main(sys.argv[1], len(sys.argv) > 2 and sys.argv[2] == "plain")
