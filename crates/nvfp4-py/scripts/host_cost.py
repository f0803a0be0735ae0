"""Host cost of the binding: 1000 eager calls of a small GEMM with one synchronization, and the
same calls replayed from a CUDA graph. Prints one JSON line per measurement.

Usage: python3 host_cost.py [M N K]   (default 128 256 256)
"""

import json
import statistics
import sys
import time

import torch

import nvfp4
import nvfp4.torch  # noqa: F401  (registers torch.ops.nvfp4)

CALLS = 1000


def operands(m, n, k):
    a = torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, device="cuda")
    b = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
    sa = torch.full((m, k // 16), 0x38, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    sb = torch.full((n, k // 16), 0x38, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    return a, sa, b, sb


def host_us(fn):
    """Host microseconds per call over CALLS calls issued back to back, then one sync; the median
    of 5 rounds. Also the wall time per call including the final sync."""
    host, wall = [], []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) / CALLS * 1e6)
        wall.append((t2 - t0) / CALLS * 1e6)
    return statistics.median(host), statistics.median(wall)


def main():
    m, n, k = (int(v) for v in sys.argv[1:4]) if len(sys.argv) == 4 else (128, 256, 256)
    a, sa, b, sb = operands(m, n, k)
    out = torch.empty(m, n, dtype=torch.float16, device="cuda")
    cases = {
        "gemm(out=)": lambda: nvfp4.gemm(a, sa, b, sb, out=out),
        "gemm(new)": lambda: nvfp4.gemm(a, sa, b, sb),
        "torch.ops.nvfp4.gemm": lambda: torch.ops.nvfp4.gemm(a, sa, b, sb, None),
        "torch.empty only": lambda: torch.empty(m, n, dtype=torch.float16, device="cuda"),
    }
    for fn in cases.values():
        fn()
    for name, fn in cases.items():
        h, w = host_us(fn)
        print(json.dumps({"case": name, "shape": [m, n, k], "calls": CALLS, "host_us_per_call": round(h, 2),
                          "wall_us_per_call": round(w, 2)}), flush=True)
    # Graph replay: the same 1000 launches captured once; replay has no host work per launch.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        nvfp4.gemm(a, sa, b, sb, out=out)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            nvfp4.gemm(a, sa, b, sb, out=out)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        graph.replay()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        times.append(((t1 - t0) / CALLS * 1e6, (t2 - t0) / CALLS * 1e6))
    h = statistics.median(t[0] for t in times)
    w = statistics.median(t[1] for t in times)
    print(json.dumps({"case": "graph replay", "shape": [m, n, k], "calls": CALLS, "host_us_per_call": round(h, 3),
                      "wall_us_per_call": round(w, 2)}), flush=True)


if __name__ == "__main__":
    main()
