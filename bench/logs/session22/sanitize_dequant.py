"""The dequantizing pass and the W4A16 GEMM after it, small and ragged, for compute-sanitizer
(memcheck, racecheck): x [29, 2064] bf16 and f32 with a NaN and an infinity, 2064 = 129 16-blocks
(quarters past a CTA's end), amax and given global scales; a W4A4 Linear call (M = 29) on it."""
import torch
import nvfp4
import nvfp4.torch as nvt

torch.manual_seed(1)
for dt in (torch.bfloat16, torch.float32, torch.float16):
    x = torch.randn(29, 2064, device="cuda").to(dt)
    x[3, 17], x[28, 2063] = float("nan"), float("inf")
    for g in (None, 0.37):
        q, gg = torch.ops.nvfp4.quantize_dequant(x, g)
w = torch.randn(512, 2064, device="cuda") * 0.05
wv, ws, wg = nvfp4.quantize(w)
lin = nvt.Linear(wv, ws, wg, input_scale=0.01, mode="w4a4", out_dtype=torch.bfloat16)
y = lin(torch.randn(29, 2064, device="cuda").to(torch.bfloat16))
torch.cuda.synchronize()
print("ok", q.shape, y.shape, bool(y.isfinite().all()))
