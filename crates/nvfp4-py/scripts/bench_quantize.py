"""The GPU quantizer against the copy bandwidth, in the cold single-launch protocol of
`nvfp4 bench` (SPEC §7): L2 flushed before every sample by a write larger than 2x L2, CUDA events
around the one call, warm-up first, median (and min) of the samples.

bytes = input read once + values, scales and global scale written once; the copy ceiling is a
device-to-device copy (bytes read + written) of the same input size under the same protocol.

Usage: python3 bench_quantize.py [ROWS K]   (default 8192 8192, bf16)
"""

import json
import statistics
import sys

import torch

import nvfp4

SAMPLES = 30


def cold(fn):
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        fn()
    times = []
    for _ in range(SAMPLES):
        flush.fill_(1)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times), min(times)


def main():
    rows, k = (int(v) for v in sys.argv[1:3]) if len(sys.argv) == 3 else (8192, 8192)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    values, scales, glob = nvfp4.quantize(x)
    out = (values, scales, glob)
    in_bytes = x.numel() * 2
    q_bytes = in_bytes + values.numel() + scales.numel() + 4
    dst = torch.empty_like(x)
    copy_us, copy_min = cold(lambda: dst.copy_(x))
    copy_bw = 2 * in_bytes / copy_us / 1e3  # GB/s
    rows_out = [{"row": "copy", "us": round(copy_us, 2), "min_us": round(copy_min, 2), "GBps": round(copy_bw, 1)}]
    for name, gs in (("quantize (given global scale)", 0.01), ("quantize (amax global scale)", None)):
        us, mn = cold(lambda: nvfp4.quantize(x, gs, out=out))
        bw = q_bytes / us / 1e3
        rows_out.append({"row": name, "shape": [rows, k], "dtype": "bf16", "us": round(us, 2), "min_us": round(mn, 2),
                         "GBps": round(bw, 1), "copy_fraction": round(bw / copy_bw, 3)})
    for r in rows_out:
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
