"""The dense W4A16 GEMV (M = 1: one-row kernels; M = 4, 8: the `_cols` kernels) with plain against
blocked scales, one process, the same bytes (every scale 1.0, so both layouts hold the same
values): µs per call, graph protocol (session 16's `timed`); bf16 activations and output.
`python dense_layout.py`."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session16"))
import torch  # noqa: E402
import nvfp4.torch  # noqa: E402,F401
from moe_time import timed  # noqa: E402

BF16 = torch.bfloat16
for n, k in [(8192, 8192), (7168, 16384), (4096, 7168), (7168, 2048)]:
    torch.manual_seed(0)
    b = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
    sb = torch.full((n, k // 16), 0x38, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    for m in (1, 4, 8):
        x = torch.randn(m, k, device="cuda").to(BF16)
        res = []
        for layout, s in (("plain", sb), ("blocked", sb.reshape(-1))):
            us = timed(lambda: torch.ops.nvfp4.gemm(x, None, b, s, 1.0, BF16, layout))
            res.append(f"{layout} {us:.1f}")
        print(f"N={n} K={k} M={m}: " + "  ".join(res), flush=True)
