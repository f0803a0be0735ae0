"""What the binding says about a bad argument: the exception type the README documents, and a
message that names the argument and what is wrong with it in the caller's terms (dtype names,
not DLPack codes; the argument that is wrong, not the one checked next)."""

import numpy as np
import pytest

import nvfp4
from reference import operand


@pytest.fixture
def ab():
    a, sfa = operand(np.random.default_rng(2), 1, 8, 64)
    return a[0], sfa[0]


@pytest.mark.parametrize(
    "dtype,name",
    [(np.float64, "float64"), (np.int64, "int64"), (np.int16, "int16"), (np.bool_, "bool"), (np.complex64, "complex64")],
)
def test_dtype_names_in_messages(ab, dtype, name):
    a, sfa = ab
    with pytest.raises(ValueError, match=rf"^a: packed values must be uint8 or float4_e2m1fn_x2, got {name}$"):
        nvfp4.gemm(a.astype(dtype), sfa, a, sfa)
    with pytest.raises(ValueError, match=rf"^sfb: scales must be float8_e4m3fn or uint8, got {name}$"):
        nvfp4.gemm(a, sfa, a, sfa.astype(dtype))
    with pytest.raises(ValueError, match=rf"^x: quantize takes float32, float16 or bfloat16, got {name}$"):
        nvfp4.quantize(np.zeros((4, 32), dtype))


def test_offsets_dtype_named(ab):
    a, sfa = ab
    b, sfb = operand(np.random.default_rng(4), 2, 16, 64)
    with pytest.raises(ValueError, match="^offsets: must be int32, got int64$"):
        nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=np.array([4, 8], np.int64))


def test_quantize_out_names_what_is_wrong():
    x = np.ones((128, 4096), np.float32)
    values, scales, glob = np.empty((128, 2048), np.uint8), np.empty((128, 256), np.uint8), np.empty(1, np.float32)
    nvfp4.quantize(x, out=(values, scales, glob))  # the right buffers
    # values for K = 2048 (half of x's K): the values are wrong, not the scales checked after them.
    with pytest.raises(ValueError, match=r"^values: must be \[128, 2048\] for x of shape \[128, 4096\], got \[128, 1024\]$"):
        nvfp4.quantize(x, out=(np.empty((128, 1024), np.uint8), np.empty((128, 128), np.uint8), glob))
    with pytest.raises(ValueError, match=r"^values: must be \[128, 2048\] for x of shape \[128, 4096\], got \[128, 10\]$"):
        nvfp4.quantize(x, out=(np.empty((128, 10), np.uint8), scales, glob))
    with pytest.raises(ValueError, match=r"^out= must be a tuple of 3 tensors \(values, scales, global_scale\), got 2$"):
        nvfp4.quantize(x, out=(values, scales))
    with pytest.raises(TypeError, match=r"^out= must be a tuple \(values, scales, global_scale\), got ndarray$"):
        nvfp4.quantize(x, out=values)


@pytest.mark.parametrize("shape", [(0, 8), (8, 0)])
def test_zero_size_arrays_named_by_their_zero_dimension(ab, shape):
    a, sfa = ab
    empty = np.zeros(shape, np.uint8)
    with pytest.raises(ValueError, match=rf"^a: shape \[{shape[0]}, {shape[1]}\] has a zero dimension$"):
        nvfp4.gemm(empty, sfa, a, sfa)
    with pytest.raises(ValueError, match=rf"^x: shape \[{shape[0]}, {16 * shape[1]}\] has a zero dimension$"):
        nvfp4.quantize(np.zeros((shape[0], 16 * shape[1]), np.float32))
    with pytest.raises(ValueError, match=r"^out: the output must have shape \[8, 8\]"):
        nvfp4.gemm(a, sfa, a, sfa, out=np.zeros(shape, np.float16))


def test_big_endian_arrays_are_a_value_error(ab):
    a, sfa = ab
    with pytest.raises(ValueError, match=r"^x: a big-endian \(non-native byte order\) array"):
        nvfp4.quantize(np.ones((4, 32), ">f4"))
    with pytest.raises(ValueError, match=r"^out: a big-endian \(non-native byte order\) array"):
        nvfp4.gemm(a, sfa, a, sfa, out=np.zeros((8, 8), ">f2"))
    # What the message says to do works.
    x = np.ones((4, 32), ">f4")
    v, s, g = nvfp4.quantize(x.astype(x.dtype.newbyteorder("=")))
    assert g[0] == np.float32(1) / np.float32(2688)


def _mem_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def test_host_memory_refusal_is_a_runtime_error():
    """A CPU GEMM whose working memory (an f64 sum per output element beside the output) exceeds
    what the host has is refused before it allocates: RuntimeError, as the README says. The output
    takes a quarter of the available memory, untouched (np.empty), so nothing is really used."""
    avail = _mem_available()
    if avail is None:
        pytest.skip("no MemAvailable in /proc/meminfo")
    m = 1024
    n = max(1, avail // 4 // (2 * m))
    try:
        out = np.empty((m, n), np.float16)
    except MemoryError:
        pytest.skip("the host does not lend an untouched output of a quarter of its memory")
    a = np.zeros((m, 8), np.uint8)
    b = np.zeros((n, 8), np.uint8)
    with pytest.raises(RuntimeError, match="bytes"):
        nvfp4.gemm(a, np.zeros((m, 1), np.uint8), b, np.zeros((n, 1), np.uint8), out=out)
