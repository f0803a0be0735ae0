"""Where an eager torch.ops.nvfp4 call spends its host time (issue 24): the driver and runtime
API calls and kernels of a few calls, from torch.profiler (CUPTI sees the library's driver
launches too), and host µs per call of the MoE form's pieces. A diagnostic, not the bench.

Usage: python3 op_trace.py [--no-launch | --timings]   (--no-launch: run under NVFP4_PY_NO_LAUNCH=1;
both print the timings only)
"""
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import nvfp4
import nvfp4.torch  # noqa: F401

# host_cost.py's timing (1000 calls, then one sync, median of 5 rounds); found beside this script
# when staged next to it, else in the repository.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "crates", "nvfp4-py",
                                "scripts"))
from host_cost import host_us  # noqa: E402


m, n, k = 128, 256, 256
b = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
sb = torch.full((n, k // 16), 0x38, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
xa = torch.randn(m, k, device="cuda").to(torch.bfloat16)
bs, sbs = torch.stack([b, b]), torch.stack([sb, sb])
offsets = torch.tensor([m // 2, m], dtype=torch.int32, device="cuda")
out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
st = torch.cuda.current_stream().cuda_stream
cases = {
    "ops.gemm W4A16": lambda: torch.ops.nvfp4.gemm.default(xa, None, b, sb, None),
    "ops.grouped_gemm_moe W4A16": lambda: torch.ops.nvfp4.grouped_gemm_moe(xa, None, bs, sbs, offsets, alpha=1.0),
    "ops.grouped_gemm_moe.default W4A16": lambda: torch.ops.nvfp4.grouped_gemm_moe.default(
        xa, None, bs, sbs, offsets, alpha=1.0),
    "native grouped_gemm_moe(out) W4A16": lambda: nvfp4._nvfp4.grouped_gemm_moe(xa, None, bs, sbs, offsets, out, 1.0, None, st),
    "torch.zeros": lambda: torch.zeros(m, n, dtype=torch.bfloat16, device="cuda"),
    "ops.aten.zeros": lambda: torch.ops.aten.zeros.default([m, n], dtype=torch.bfloat16, device=out.device),
    "ops.aten.empty": lambda: torch.ops.aten.empty.memory_format([m, n], dtype=torch.bfloat16, device=out.device),
}
for f in cases.values():
    f()
torch.cuda.synchronize()
tag = "no-launch " if "--no-launch" in sys.argv else ""
for name, f in cases.items():
    print(f"{tag}{name:40s} {host_us(f)[0]:8.2f} us/call", flush=True)
if tag or "--timings" in sys.argv:
    sys.exit(0)
for name in ["ops.gemm W4A16", "ops.grouped_gemm_moe.default W4A16", "native grouped_gemm_moe(out) W4A16"]:
    f = cases[name]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            f()
        torch.cuda.synchronize()
    print(f"\n== {name}: 20 calls")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
