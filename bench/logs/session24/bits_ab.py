"""Bit-identity of two kernel folders on the packed W4A16 GEMM (torch.ops.nvfp4.gemm, bf16,
blocked scales): random weight bytes and random finite E4M3 scales of both signs, several tiles
and schedules; each folder's outputs saved in one process, then compared bit for bit.

  NVFP4_KERNELS_DIR=A python bits_ab.py save FILE
  python bits_ab.py cmp FILE_A FILE_B        exit 1 unless every output is bit-identical
"""
import sys

import torch

BF16 = torch.bfloat16
CASES = [(8192, 8192, 16), (4096, 7168, 29), (7168, 2048, 100), (7168, 16384, 16), (2048, 768, 64), (4096, 7168, 128)]


def save(path):
    import nvfp4
    import nvfp4.torch  # noqa: F401

    torch.manual_seed(7)
    outs = []
    for n, k, m in CASES:
        b = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
        sc = torch.randint(0, 0x7F, (n * k // 16,), dtype=torch.uint8, device="cuda")  # no NaN code
        sc |= torch.randint(0, 2, sc.shape, dtype=torch.uint8, device="cuda") << 7
        sb = sc.view(torch.float8_e4m3fn)
        pk = nvfp4.pack(b, sb, dtype=BF16, layout="blocked")
        x = torch.randn(m, k, device="cuda").to(BF16)
        outs.append(torch.ops.nvfp4.gemm(x, None, b, sb, 0.75, BF16, "blocked", pk).cpu())
    torch.save(outs, path)


def cmp(a, b):
    bad = 0
    for (n, k, m), x, y in zip(CASES, torch.load(a), torch.load(b)):
        diff = int((x.view(torch.int16) != y.view(torch.int16)).sum())
        print(f"bits {n}x{k} M={m}: {diff} of {x.numel()} differ", flush=True)
        bad += diff
    return bad


if __name__ == "__main__":
    if sys.argv[1] == "save":
        save(sys.argv[2])
    else:
        sys.exit(1 if cmp(sys.argv[2], sys.argv[3]) else 0)
