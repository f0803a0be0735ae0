"""The `_moe` kernels with plain against blocked scales, one process, the same bytes (every scale
1.0, so the layouts hold the same values): µs per call, graph protocol as moe_time.py; W4A16 bf16
tokens, bf16 out, uniform routings. `NVFP4_MOE_GEMV=on python moe_layout.py`."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "session16"))
import torch  # noqa: E402
import moe_time  # noqa: E402

BF16 = torch.bfloat16
for e, n, k, t in [(128, 1536, 2048, 32), (128, 1536, 2048, 256), (128, 2048, 768, 32), (32, 4096, 7168, 8),
                   (32, 7168, 2048, 8), (32, 7168, 2048, 30), (8, 28672, 4096, 2)]:
    torch.manual_seed(0)
    b, sb, x, ends, active = moe_time.operands(e, n, k, t)
    flat = sb.reshape(-1)
    res = []
    for layout, s in (("plain", sb), ("blocked", flat)):
        us = moe_time.timed(lambda: torch.ops.nvfp4.grouped_gemm_moe(x, None, b, s, ends, 1.0, BF16, layout))
        res.append(f"{layout} {us:.1f}")
    print(f"E={e} N={n} K={k} T={t} active={active}: " + "  ".join(res), flush=True)
