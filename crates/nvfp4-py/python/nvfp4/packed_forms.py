"""``PackedForms``: the base of the layers that keep packed forms of their NVFP4 weights
(``nvfp4.pack``: W4A16 on CUDA) beside the weights, in ``self._packed``. The packed forms are
made from the weights as they were: moving or casting the layer (``.to``, ``.cuda``, ``.cpu``)
and loading a state dict drop them, so that they never serve other weights."""

import os

import torch

# W4A4 layers on CUDA run as the W4A16 GEMM of their activations' quantization written back as
# 16-bit numbers (``torch.ops.nvfp4.quantize_dequant``: e2m1 * e4m3 is exact in bfloat16 and
# float16) on the packed weights, with alpha = both global scales: the W4A4 products (SPEC §3,
# §8) on the faster kernels; a Linear's one-row call keeps the W4A4 GEMV (measured faster there:
# NOTES.md, session 22). NVFP4_W4A4_ROUTE (for measurements; the same results up to the order of
# the float32 sums): "nvfp4" keeps the NVFP4 x NVFP4 kernels everywhere, "w4a16" takes the W4A16
# kernels for one row too.
W4A4_ROUTE = os.environ.get("NVFP4_W4A4_ROUTE", "auto")
W4A4_ON_W4A16 = W4A4_ROUTE != "nvfp4"


def w4a4_on_w4a16(rows):
    """Whether a W4A4 GEMM of ``rows`` activation rows on CUDA takes the W4A16 kernels."""
    return W4A4_ON_W4A16 and (rows > 1 or W4A4_ROUTE == "w4a16")


class PackedForms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self._packed = {}

    def _apply(self, fn, *args, **kwargs):
        self._packed = {}
        return super()._apply(fn, *args, **kwargs)

    def _load_from_state_dict(self, *args, **kwargs):
        self._packed = {}
        return super()._load_from_state_dict(*args, **kwargs)

    @staticmethod
    def _may_pack_for(weight, x):
        """Whether forward may pack `weight` for input `x` now: x on the weight's device (else
        the operation refuses the call) and neither a CUDA graph capturing nor torch.compile
        tracing (the packing allocates and launches)."""
        if weight.device != x.device:
            return False
        return not (torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing())
