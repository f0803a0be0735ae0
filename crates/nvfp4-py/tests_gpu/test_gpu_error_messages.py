"""Argument messages on CUDA torch tensors (the CPU suite's tests/test_error_messages.py covers
NumPy): torch dtypes named as torch names them, a zero-size tensor named by its zero dimension,
a malformed ``quantize(out=)`` named as such."""

import pytest
import torch

import nvfp4
from test_gpu import DEV, operand

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def g():
    return torch.Generator().manual_seed(19)


def test_torch_dtype_and_zero_size_messages(g):
    a, sfa = operand(g, 1, 128, 256)
    with pytest.raises(ValueError, match="^a: packed values must be uint8 or float4_e2m1fn_x2, got float64$"):
        nvfp4.gemm(a.double(), sfa, a, sfa)
    if hasattr(torch, "float8_e5m2"):
        with pytest.raises(ValueError, match="^sfa: scales must be float8_e4m3fn or uint8, got float8_e5m2$"):
            nvfp4.gemm(a, sfa.view(torch.uint8).view(torch.float8_e5m2), a, sfa)
    with pytest.raises(ValueError, match=r"^a: shape \[1, 0, 128\] has a zero dimension$"):
        nvfp4.gemm(a[:, :0], sfa[:, :0], a, sfa)
    with pytest.raises(ValueError, match=r"^out= must be a tuple of 3 tensors"):
        nvfp4.quantize(torch.ones(4, 32, device=DEV), out=(a, sfa))
