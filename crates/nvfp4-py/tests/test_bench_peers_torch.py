"""The peer bench's checking path on CPU tensors (nvfp4's CPU backend, torch's CPU GEMMs): the
bench's own NVFP4 decode against the package's, the operands, and every implementation the CPU
can run checked against its float64 reference, with wrong, unwritten and misshapen outputs
failing. Skipped without torch (CI's CPU suite is NumPy only)."""

import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))

import nvfp4  # noqa: E402
import nvfp4.torch as nvt  # noqa: E402
from peers import impls as impls_mod  # noqa: E402
from peers import operands, reference, report  # noqa: E402
from peers.cases import Dense, Moe, MoeModel  # noqa: E402
from peers.run_case import run_checks  # noqa: E402
from peers.tolerance import nvfp4_profile  # noqa: E402

TINY = MoeModel("tiny", 6, 12, 64, 32, 3, 10, 40)
CASES = [
    Dense("linear", 5, 40, 64, "t"),
    Dense("dual", 3, 24, 96, "t"),
    Moe(TINY, "decode", "gate_up"),
    Moe(TINY, "prefill", "down"),
]


def test_decode_nibbles_and_package_agree():
    values = torch.tensor([[0x21, 0xF8]], dtype=torch.uint8)  # k0 = 0.5, k1 = 1, k2 = -0, k3 = -6
    scales = torch.tensor([[0x40]], dtype=torch.uint8)  # e4m3 2.0
    got = reference.decode(values.repeat(1, 4), scales)
    assert got[0, :4].tolist() == [1.0, 2.0, -0.0, -12.0]
    gen = torch.Generator().manual_seed(1)
    v = torch.randint(0, 256, (3, 7, 32), dtype=torch.uint8, generator=gen)
    s = torch.randint(0, 0x7F, (3, 7, 4), dtype=torch.uint8, generator=gen)
    ours = reference.decode(v, s)
    theirs = nvt.dequantize(v, s.view(torch.float8_e4m3fn), dtype=torch.float64)
    assert torch.equal(ours, theirs)


def test_dequantize_16_rounds_once():
    gen = torch.Generator().manual_seed(2)
    ws = operands.quantize_weight((2, 9, 48), torch.bfloat16, "cpu", gen)
    got = operands.dequantize_16(ws, torch.bfloat16)
    want = (reference.decode(ws.values, ws.scales) * ws.glob).to(torch.bfloat16)
    assert got.shape == (2, 9, 48) and torch.equal(got, want)


def test_moe_operands_follow_routing():
    case = CASES[2]
    ops = operands.build(case, 2, torch.bfloat16, "cpu", seed=4)
    r = ops.routing
    assert ops.x.shape == (r.rows, case.k) and len(ops.sets) == 2 and len(ops.bf16_sets) == 2
    assert ops.offsets.tolist() == r.offsets.tolist() and ops.offsets.dtype == torch.int32
    assert ops.layout.tolist() == [0] + r.offsets.tolist() and ops.layout.dtype == torch.int64
    gen = torch.Generator(device="cpu").manual_seed(4)
    tokens = torch.randn((case.tokens, case.k), dtype=torch.bfloat16, generator=gen)
    assert torch.equal(ops.x, tokens[torch.from_numpy(r.token)])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.key)
def test_every_cpu_implementation_passes_its_check(case):
    ops = operands.build(case, 2, torch.bfloat16, "cpu", seed=9)
    impls = impls_mod.build(ops, humming=False)
    records = run_checks(ops, impls, "cpu")
    for name in (report.NVFP4_W4A4, report.NVFP4_W4A4_KERNEL, report.TORCH):
        assert records[name]["error"] is None, records[name]
        check = records[name]["check"]
        assert check["ok"] and check["bad"] == 0 and check["max_ratio"] <= 1, (name, check)
    assert records[report.HUMMING]["check"] is None and records[report.HUMMING]["error"]
    w16 = records[report.NVFP4_W4A16]  # the W4A16 API: checked where the installed package has it
    assert w16["error"] is not None or w16["check"]["ok"], w16


def test_wrong_outputs_fail():
    case = CASES[0]
    ops = operands.build(case, 1, torch.bfloat16, "cpu", seed=11)
    ws = ops.sets[0]
    q, sq = ops.x_q
    good = nvfp4.gemm(q, sq, ws.values, ws.scales, alpha=ops.x_global * ws.glob, out_dtype=torch.bfloat16)
    one_off = good.clone()
    one_off[3, 17] = one_off[3, 17] * 1.5 + 1
    unwritten = good.clone()
    unwritten[1, 2:9] = float("nan")
    scaled = good * 1.03  # each element within a few BF16 ulps: only the normwise bound sees it
    prof = nvfp4_profile("bfloat16", case.k)
    x = reference.decode(q, sq)
    outs = [("good", good, prof), ("one_off", one_off, prof), ("unwritten", unwritten, prof), ("scaled", scaled, prof)]
    outs.append(("shape", good[:, :-1], prof))
    tiles = lambda a, b: reference.decode(ws.values[a:b], ws.scales[a:b])  # noqa: E731
    res = reference.check_gemm(outs, x, tiles, ops.x_global * ws.glob, case.n)
    assert res["good"]["ok"]
    assert not res["one_off"]["ok"] and res["one_off"]["bad"] == 1 and res["one_off"]["first_bad"][0][:2] == [3, 17]
    assert not res["unwritten"]["ok"] and res["unwritten"]["bad"] == 7 and res["unwritten"]["nonfinite"] == 7
    assert not res["scaled"]["ok"] and res["scaled"]["rel_rms"] > 2.0**-6
    assert not res["shape"]["ok"] and "shape" in res["shape"]["error"]


def test_moe_check_reads_each_experts_rows():
    case = CASES[3]
    ops = operands.build(case, 1, torch.bfloat16, "cpu", seed=12)
    ws, r = ops.sets[0], ops.routing
    out = impls_mod._nvfp4_w4a4_kernel(ops, 0)()
    prof = nvfp4_profile("bfloat16", case.k)
    x = reference.decode(*ops.x_q)
    tiles = lambda e, a, b: reference.decode(ws.values[e, a:b], ws.scales[e, a:b])  # noqa: E731
    alpha = ops.x_global * ws.glob
    assert reference.check_moe([("ok", out, prof)], x, r.offsets.tolist(), tiles, alpha, case.n)["ok"]["ok"]
    busy = int(np.argmax(r.counts))
    swapped = r.offsets.tolist()  # rows of the busiest expert read as its neighbour's
    if busy + 1 < len(swapped):
        other = busy + 1
    else:
        other = busy - 1
    wrong_tiles = lambda e, a, b: tiles(other if e == busy else e, a, b)  # noqa: E731
    res = reference.check_moe([("wrong", out, prof)], x, swapped, wrong_tiles, alpha, case.n)["wrong"]
    assert not res["ok"] and res["bad"] > 0.5 * r.counts[busy] * case.n
