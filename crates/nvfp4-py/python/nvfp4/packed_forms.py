"""``PackedForms``: the base of the layers that keep packed forms of their NVFP4 weights
(``nvfp4.pack``: W4A16 on CUDA) beside the weights, in ``self._packed``. The packed forms are
made from the weights as they were: moving or casting the layer (``.to``, ``.cuda``, ``.cpu``)
and loading a state dict drop them, so that they never serve other weights."""

import torch


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
