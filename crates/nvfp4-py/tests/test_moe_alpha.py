"""The MoE form's per-expert alphas on the CPU (issue 21, item 4): ``alpha`` one float, a
sequence of E floats, or a 1-D float32 array (or CPU torch tensor) of E values. Expert e's rows
are bit-identical to the float64 reference with alpha_e, and to what one float alpha_e gives
them, in W4A4 (NumPy) and W4A16 (float16 NumPy, bfloat16 torch), empty experts and rows past the
last offset included; every form gives the same bits; the ``torch.ops.nvfp4.grouped_gemm_moe``
overloads (a float, a list, a tensor), their fake implementations and torch.compile; and every
error a wrong alpha gets. The torch tests are skipped without torch."""

import re

import numpy as np
import pytest

import nvfp4
from reference import activation, gemm16_ref, gemm_ref, operand, round_bits, to_blocked
from torch_ops import native, op_error

# Expert e owns rows ENDS[e-1]:ENDS[e] of T = 100 tokens: experts 0, 2 and 5 own none, rows 90..99
# belong to no expert.
T, ENDS = 100, [0, 30, 30, 70, 90, 90]
# One factor per expert, distinct (both signs, 0), exact in float32 as the kernels take them.
ALPHAS = [float(np.float32(x)) for x in (0.8125, -1.3, 7.0, 0.0, 3.1e-3, -0.71)]


@pytest.fixture
def rng():
    return np.random.default_rng(41)


def poisoned(shape, dtype=np.float16):
    return np.full(shape, np.nan, dtype=dtype)


def moe_ref(a, sfa, b, sfb, out, alphas):
    """Expert e's rows of the NVFP4 tokens against its weight times alphas[e] (float64, rounded
    once), into a copy of ``out``."""
    want, start = out.copy(), 0
    for e, end in enumerate(ENDS):
        if end > start:
            want[start:end] = gemm_ref(a[start:end], sfa[start:end], b[e], sfb[e], alphas[e])
        start = end
    return want


def forms(alphas):
    """The same per-expert alphas as a list, a tuple and a float32 array."""
    return [list(alphas), tuple(alphas), np.array(alphas, np.float32)]


def test_w4a4_expert_rows_get_their_alpha(rng):
    e, n, k = len(ENDS), 40, 256
    a, sfa = operand(rng, 1, T, k)
    b, sfb = operand(rng, e, n, k)
    a, sfa, offs = a[0], sfa[0], np.array(ENDS, np.int32)
    want = moe_ref(a, sfa, b, sfb, poisoned((T, n)), ALPHAS)
    assert np.isnan(want[90:].astype(np.float32)).all() and not np.isnan(want[:90].astype(np.float32)).any()
    for alpha in forms(ALPHAS):
        got = nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=offs, alpha=alpha, out=poisoned((T, n)))
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16), err_msg=type(alpha).__name__)
        blk = nvfp4.grouped_gemm((a, to_blocked(sfa[None]), b, to_blocked(sfb)), offsets=offs, alpha=alpha)
        np.testing.assert_array_equal(blk[:90].view(np.uint16), want[:90].view(np.uint16))
        assert not blk[90:].view(np.uint16).any()  # zeros in a new output
    # Each expert's rows are those one float gives them.
    for ex, alpha in enumerate(ALPHAS):
        start, end = ([0] + ENDS)[ex], ENDS[ex]
        one = nvfp4.grouped_gemm((a, sfa, b, sfb), offsets=offs, alpha=alpha)
        np.testing.assert_array_equal(one[start:end].view(np.uint16), want[start:end].view(np.uint16))


def test_equal_alphas_are_one_float(rng):
    a, sfa = operand(rng, 1, T, 128)
    b, sfb = operand(rng, len(ENDS), 24, 128)
    offs = np.array(ENDS, np.int32)
    one = nvfp4.grouped_gemm((a[0], sfa[0], b, sfb), offsets=offs, alpha=-0.375)
    # A 0-d array or a NumPy scalar is one float, as before per-expert alphas.
    for alpha in forms([-0.375] * len(ENDS)) + [np.array(-0.375), np.float32(-0.375)]:
        got = nvfp4.grouped_gemm((a[0], sfa[0], b, sfb), offsets=offs, alpha=alpha)
        np.testing.assert_array_equal(got.view(np.uint16), one.view(np.uint16))


def w4a16_case(rng, make):
    """Exact-tier activations made by ``make`` (from float64), weights, and each expert's
    expected rows rounded to the activation's dtype (its name)."""
    e, n, k = len(ENDS), 32, 192
    x64 = activation(rng, (T, k))
    w, sfw = operand(rng, e, n, k)
    x, dtype = make(x64)
    want, start = np.zeros((T, n), np.uint16), 0
    for ex, end in enumerate(ENDS):
        if end > start:
            want[start:end] = round_bits(gemm16_ref(x64[start:end], w[ex], sfw[ex], ALPHAS[ex]), dtype)
        start = end
    return x, w, sfw, want


def test_w4a16_float16_expert_rows_get_their_alpha(rng):
    x, w, sfw, want = w4a16_case(rng, lambda x64: (x64.astype(np.float16), "float16"))
    offs = np.array(ENDS, np.int32)
    for alpha in forms(ALPHAS):
        got = nvfp4.grouped_gemm((x, None, w, sfw), offsets=offs, alpha=alpha)
        assert got.dtype == np.float16
        np.testing.assert_array_equal(got.view(np.uint16), want)


def test_w4a16_bfloat16_torch_tensor_alphas(rng):
    torch = pytest.importorskip("torch")
    x, w, sfw, want = w4a16_case(rng, lambda x64: (torch.from_numpy(x64).to(torch.bfloat16), "bfloat16"))
    offs = torch.tensor(ENDS, dtype=torch.int32)
    for alpha in forms(ALPHAS) + [torch.tensor(ALPHAS, dtype=torch.float32)]:
        got = nvfp4.grouped_gemm((x, None, torch.from_numpy(w), torch.from_numpy(sfw)), offsets=offs, alpha=alpha)
        assert got.dtype == torch.bfloat16
        np.testing.assert_array_equal(got.view(torch.int16).numpy().view(np.uint16), want, err_msg=str(type(alpha)))


def test_wrong_alphas_are_refused(rng):
    t, e, n, k = 24, 3, 16, 64
    a, sfa = operand(rng, 1, t, k)
    b, sfb = operand(rng, e, n, k)
    args = ((a[0], sfa[0], b, sfb),)
    offs = np.array([8, 8, 24], np.int32)

    def call(alpha):
        return nvfp4.grouped_gemm(*args, offsets=offs, alpha=alpha)

    assert call([1.0, 0.0, -2.0]).shape == (t, n)  # any sign and 0
    for alpha in ([1.0, 2.0], [1.0] * 4, np.ones(2, np.float32), np.ones(4, np.float32)):
        with pytest.raises(ValueError, match=rf"{len(alpha)} alphas for E = 3 experts"):
            call(alpha)
    with pytest.raises(nvfp4.DtypeError, match="alpha: per-expert alphas must be float32, got float64"):
        call(np.ones(3))
    with pytest.raises(ValueError, match=re.escape("alpha: per-expert alphas must be 1-D [E]")):
        call(np.ones((1, 3), np.float32))
    with pytest.raises(ValueError, match="contiguous"):
        call(np.ones(6, np.float32)[::2])
    # A sequence's values follow the float's rules, each named by its index.
    for bad, needle in [(float("nan"), "finite"), (1e-50, "rounds to 0"), (1e39, "overflows")]:
        with pytest.raises(ValueError, match=rf"alpha\[1\]: .*{needle}"):
            call([1.0, bad, 1.0])
    # An array's values are checked where they are read (the CPU reference), naming the expert
    # (expert 1 has no tokens and is checked all the same).
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(ValueError, match="expert 1's alpha must be finite"):
            call(np.array([1.0, bad, 1.0], np.float32))
    for bad in ("half", [1.0, "x", 2.0], {1: 2.0}):
        with pytest.raises(TypeError, match="alpha must be a float, a sequence of floats"):
            call(bad)


def torch_case(rng, e=None):
    torch = pytest.importorskip("torch")
    n, k, e = 24, 128, e or len(ENDS)
    x64 = activation(rng, (T, k))
    w, sfw = operand(rng, e, n, k)
    ends = ENDS if e == len(ENDS) else [T - 10] * e
    x = torch.from_numpy(x64).to(torch.float16)
    return torch, (x, None, torch.from_numpy(w), torch.from_numpy(sfw).view(torch.float8_e4m3fn)), ends


def test_torch_op_takes_a_float_a_list_or_a_tensor(rng):
    torch, (x, _, w, sw), ends = torch_case(rng)
    import nvfp4.torch  # noqa: F401 (registers torch.ops.nvfp4)

    offs = torch.tensor(ends, dtype=torch.int32)
    want = nvfp4.grouped_gemm((x, None, w, sw), offsets=offs, alpha=ALPHAS)
    tensor = torch.tensor(ALPHAS, dtype=torch.float32)
    for alpha in (ALPHAS, tuple(ALPHAS), tensor):
        got = torch.ops.nvfp4.grouped_gemm_moe(x, None, w, sw, offs, alpha)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), type(alpha)
        kw = torch.ops.nvfp4.grouped_gemm_moe(x, None, w, sw, offs, alpha=alpha, out_dtype=torch.bfloat16)
        assert kw.dtype == torch.bfloat16
    explicit = torch.ops.nvfp4.grouped_gemm_moe.Tensor(x, None, w, sw, offs, tensor)
    assert torch.equal(explicit.view(torch.int16), want.view(torch.int16))
    for alpha in (0.5, None):
        one = nvfp4.grouped_gemm((x, None, w, sw), offsets=offs, alpha=alpha)
        op = torch.ops.nvfp4.grouped_gemm_moe(x, None, w, sw, offs, alpha)
        assert torch.equal(op.view(torch.int16), one.view(torch.int16)), alpha
    with pytest.raises(op_error("grouped_gemm_moe.Tensor", ValueError), match="5 alphas for E = 6 experts"):
        torch.ops.nvfp4.grouped_gemm_moe(x, None, w, sw, offs, tensor[:5])
    # A 0-d tensor is one alpha for every expert (read on the host), on both kernel sets.
    one = torch.ops.nvfp4.grouped_gemm_moe(x, None, w, sw, offs, torch.tensor(0.5))
    want = nvfp4.grouped_gemm((x, None, w, sw), offsets=offs, alpha=0.5)
    assert torch.equal(one.view(torch.int16), want.view(torch.int16))
    # An element type the operation does not take is refused by the operation's own rule.
    with pytest.raises(op_error("grouped_gemm_moe", TypeError), match="offsets: must be int32, got int64"):
        torch.ops.nvfp4.grouped_gemm_moe(x, None, w, sw, offs.long(), 0.5)


def test_torch_one_expert_tensor_is_the_tensor_overload(rng, monkeypatch):
    # With one expert, a one-element tensor would also parse as a float (a host synchronization
    # on the GPU): it must reach the tensor overload, and the operation the tensor itself.
    torch, (x, _, w, sw), ends = torch_case(rng, e=1)
    import nvfp4.torch  # noqa: F401 (registers torch.ops.nvfp4)

    offs = torch.tensor(ends, dtype=torch.int32)
    seen, real = [], nvfp4.grouped_gemm

    def record(*args, alpha=None, **kw):
        seen.append(alpha)
        return real(*args, alpha=alpha, **kw)

    monkeypatch.setattr(nvfp4, "grouped_gemm", record)
    got = torch.ops.nvfp4.grouped_gemm_moe(x, None, w, sw, offs, torch.tensor([0.75], dtype=torch.float32))
    # The native kernel of .Tensor reads the tensor itself (no Python frame to record): this
    # records the Python kernel's argument (test_torch_python_kernels.py runs it so).
    if not native("grouped_gemm_moe.Tensor"):
        assert len(seen) == 1 and torch.is_tensor(seen[0]), seen
    want = real((x, None, w, sw), offsets=offs, alpha=0.75)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_torch_fakes_and_compile(rng):
    torch, (x, _, w, sw), ends = torch_case(rng)
    import nvfp4.torch as nvt

    offs = torch.tensor(ends, dtype=torch.int32)
    tensor = torch.tensor(ALPHAS, dtype=torch.float32)
    for alpha in (0.5, ALPHAS, tensor):
        for extra in ((), (torch.bfloat16,)):
            real = torch.ops.nvfp4.grouped_gemm_moe(x, None, w, sw, offs, alpha, *extra)
            fake = nvt._grouped_moe_fake(x, None, w, sw, offs, alpha, *extra)
            assert (real.shape, real.dtype) == (fake.shape, fake.dtype)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fx, fw, fs, fo, ft = (mode.from_tensor(v) for v in (x, w, sw, offs, tensor))
        for alpha in (0.5, ALPHAS, ft):
            out = torch.ops.nvfp4.grouped_gemm_moe(fx, None, fw, fs, fo, alpha)
            assert (tuple(out.shape), out.dtype) == ((T, 24), torch.float16)

    def f(x, w, sw, offs, alphas):
        return torch.ops.nvfp4.grouped_gemm_moe(x, None, w, sw, offs, alphas) + torch.ops.nvfp4.grouped_gemm_moe(
            x, None, w, sw, offs, ALPHAS
        )

    eager = f(x, w, sw, offs, tensor)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(x, w, sw, offs, tensor)
    assert torch.equal(eager.view(torch.int16), compiled.view(torch.int16))
