"""µs per dense W4A16 call (torch.ops.nvfp4.gemm, bf16 activations, blocked scales, packed
weights as `nvfp4.torch.Linear` holds them), the peer bench's graph protocol in small: weight sets
rotated so that a replay streams more than 3x L2 (no set is L2-hot), 48 calls in one CUDA graph,
median of 15 replays. Random weight bytes, every scale 1.0. The kernels and the plan are the
environment's (NVFP4_KERNELS_DIR, NVFP4_GEMM_SM90), one process per setting.

  python dense_ab.py LABEL [M,M,...]      the SPEC §9 decode projections at those M (16,32,64,128)
  python dense_ab.py ncu N K M             four calls on one weight set (for `ncu -s 3 -c 1`)
  python dense_ab.py check N K M           one call against a float64 reference of the same data
"""
import os
import sys

import torch
import nvfp4
import nvfp4.torch  # noqa: F401

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "session16"))
from moe_time import replay_median_us  # noqa: E402 (session 16's timing loop)

BF16 = torch.bfloat16
SHAPES = [(8192, 8192), (7168, 16384), (4096, 7168), (7168, 2048)]
L2_ROTATE = 3 * 50 * 2**20  # bytes a replay streams at least (3x an H100/H200 L2)
CALLS = 48


def weight_sets(n, k):
    bytes_per = n * k // 2 * 9 // 8 * 2  # values, scales and the packed form beside them
    count = max(2, -(-L2_ROTATE // bytes_per))
    sets = []
    for _ in range(count):
        b = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
        sb = torch.full((n * k // 16,), 0x38, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        sets.append((b, sb, nvfp4.pack(b, sb, dtype=BF16, layout="blocked")))
    return sets


def captured(sets, x, calls=CALLS):
    """A CUDA graph of `calls` gemm calls over the rotated weight sets, every set warmed (bound)
    first on the capture's side stream."""

    def call(i):
        b, sb, pk = sets[i % len(sets)]
        return torch.ops.nvfp4.gemm(x, None, b, sb, 1.0, BF16, "blocked", pk)

    return captured_calls(call, len(sets), calls)


def captured_calls(call, warm, calls=CALLS):
    """A CUDA graph of `call(0) .. call(calls - 1)`, after `call(0) .. call(warm - 1)` on the
    capture's side stream (binding what each call launches)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(warm):
            call(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            call(i)
    return g


def timed(sets, x):
    g = captured(sets, x)
    g.replay()
    torch.cuda.synchronize()
    return replay_median_us(g, CALLS, 15)


def main(label, ms):
    torch.manual_seed(0)
    for n, k in SHAPES:
        sets = weight_sets(n, k)
        row = []
        for m in ms:
            x = torch.randn(m, k, device="cuda").to(BF16)
            row.append(f"M={m} {timed(sets, x):.1f}")
        del sets
        torch.cuda.empty_cache()
        print(f"{label} N={n} K={k}: " + "  ".join(row), flush=True)


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def check(n, k, m):
    """The output against the float64 sum of the decoded weights (every scale 1.0) times x: at
    most one bf16 rounding apart (relative 2^-8) where the sum is not tiny."""
    torch.manual_seed(1)
    b, sb, pk = weight_sets(n, k)[0]
    x = torch.randn(m, k, device="cuda").to(BF16)
    out = torch.ops.nvfp4.gemm(x, None, b, sb, 1.0, BF16, "blocked", pk).double()
    lut = torch.tensor(E2M1 + [-v for v in E2M1], dtype=torch.float64, device="cuda")
    codes = torch.stack([b & 15, b >> 4], dim=-1).reshape(n, k).long()
    ref = x.double() @ lut[codes].T
    err = (out - ref).abs()
    bound = ref.abs() * 2.0**-8 + 1e-3
    bad = int((err > bound).sum())
    print(f"check {n}x{k} M={m}: max err {float(err.max()):.3g}, beyond one rounding: {bad}", flush=True)
    return bad


if __name__ == "__main__":
    if sys.argv[1] == "check":
        sys.exit(1 if check(*map(int, sys.argv[2:5])) else 0)
    if sys.argv[1] == "ncu":
        n, k, m = map(int, sys.argv[2:5])
        b, sb, pk = weight_sets(n, k)[0]
        x = torch.randn(m, k, device="cuda").to(BF16)
        for _ in range(4):
            torch.ops.nvfp4.gemm(x, None, b, sb, 1.0, BF16, "blocked", pk)
        torch.cuda.synchronize()
        sys.exit(0)
    ms = [int(v) for v in sys.argv[2].split(",")] if len(sys.argv) > 2 else [16, 32, 64, 128]
    main(sys.argv[1], ms)
