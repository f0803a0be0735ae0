"""The operators' Python kernels (what serves ``torch.ops.nvfp4.*`` where the native kernels cannot:
torch < 2.10, another OS, or ``NVFP4_TORCH_NATIVE_KERNELS=0``): the torch test files run again,
in a child process with the native kernels off, so that both kernel sets stay tested."""

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch_ops import PYTHON_KERNELS_ENV  # noqa: E402

HERE = Path(__file__).parent
FILES = ["test_moe_alpha.py", "test_torch_layouts.py", "test_w4a16_torch.py", "test_moe_torch.py"]


def test_native_kernels_serve_the_operators():
    import nvfp4.torch as nvt

    if not sys.platform.startswith("linux"):
        pytest.skip("native kernels: Linux only")
    assert {"gemm", "gemv", "dual_gemm", "grouped_gemm_moe", "grouped_gemm_moe.Tensor", "quantize", "quantize_dequant"} <= set(
        nvt.NATIVE_KERNELS
    )


def test_python_kernels_pass_the_torch_tests():
    code = "import nvfp4.torch as t, sys; sys.exit(1 if t.NATIVE_KERNELS else 0)"
    off = subprocess.run([sys.executable, "-c", code], env=PYTHON_KERNELS_ENV, cwd=HERE, timeout=120)
    assert off.returncode == 0, "NVFP4_TORCH_NATIVE_KERNELS=0 did not turn the native kernels off"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FILES],
        env=PYTHON_KERNELS_ENV,
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
