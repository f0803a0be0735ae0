# One MoE call shape (argv: E N K T [blocked]) a few times, W4A16 bf16: for ncu.
import sys, torch, nvfp4, nvfp4.torch  # noqa: F401
torch.manual_seed(0)
e, n, k, t = map(int, sys.argv[1:5])
b = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device="cuda")
sb = torch.full((e, n, k // 16), 0x38, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
x = torch.randn(t, k, device="cuda").to(torch.bfloat16)
ids = torch.randint(0, e, (t,), device="cuda")
ends = torch.bincount(ids, minlength=e).cumsum(0).to(torch.int32)
for _ in range(3):
    torch.ops.nvfp4.grouped_gemm_moe(x, None, b, sb, ends, alpha=1.0)
torch.cuda.synchronize()
