"""The peer bench's pure parts (scripts/peers: cases, routing, byte counts, tolerance, report),
NumPy only: the case list against SPEC §9, the routing's invariants, the tolerance against a
simulated FP32 accumulation rounded once (and against wrong outputs), the rows' fields and
ratios, the JSON file, merging and the table."""

import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))

import bench_peers  # noqa: E402
from peers import cases, report, tolerance  # noqa: E402
from reference import bf16_bits  # noqa: E402


def test_cases_cover_spec_9():
    all_ = cases.all_cases()
    keys = [c.key for c in all_]
    assert len(keys) == len(set(keys))
    square = sorted(c.m for c in all_ if c.op == "linear" and (c.n, c.k) == (8192, 8192))
    assert square == [1, 4, 16, 32, 64, 128, 256, 1024, 4096]
    for n, k in ((7168, 16384), (4096, 7168), (7168, 2048)):
        assert sorted(c.m for c in all_ if c.op == "linear" and (c.n, c.k) == (n, k)) == [1, 16, 128]
    moe = [c for c in all_ if c.op == "moe"]
    assert {(c.model.name, c.phase, c.proj) for c in moe} == {
        (m, p, j)
        for m in ("Mixtral-8x7B", "Qwen3-30B-A3B", "DeepSeek-V3 EP rank")
        for p in ("decode-1", "decode-4", "decode", "prefill")
        for j in ("gate_up", "down")
        if (m, p) != ("DeepSeek-V3 EP rank", "decode-1")
    }
    # The small decode batches route rows to this GPU (none would be no case).
    for c in moe:
        assert c.tokens == {"decode-1": 1, "decode-4": 4}.get(c.phase, c.tokens)
        assert cases.case_routing(c, bench_peers.case_seed(21, c)).rows > 0, c.key  # the default --seed
    mix = next(c for c in moe if c.model.name == "Mixtral-8x7B" and c.proj == "gate_up")
    assert (mix.n, mix.k, mix.experts, mix.model.top_k) == (2 * 14336, 4096, 8, 2)
    ds = next(c for c in moe if c.model.name.startswith("DeepSeek") and c.proj == "down")
    assert (ds.n, ds.k, ds.experts, ds.model.experts_total) == (7168, 2048, 32, 256)
    dual = [c for c in all_ if c.op == "dual"]
    assert dual and all(c.weight_rows == 2 * c.n for c in dual)


def test_quick_and_select():
    quick = cases.quick_cases()
    assert {c.op for c in quick} == {"linear", "dual", "moe"}
    assert {c.key for c in quick} <= {c.key for c in cases.all_cases()}
    all_ = cases.all_cases()
    assert {c.op for c in cases.select(all_, "dense")} == {"linear", "dual"}
    assert {c.op for c in cases.select(all_, "moe")} == {"moe"}
    assert len(cases.select(all_, None)) == len(all_)
    with pytest.raises(ValueError, match="--only"):
        cases.select(all_, "gemv")


@pytest.mark.parametrize(
    "tokens,experts,total,top_k,empty", [(32, 8, 8, 2, 1), (200, 32, 256, 8, 2), (7, 128, 128, 8, 8)]
)
def test_route_invariants(tokens, experts, total, top_k, empty):
    r = cases.route(tokens, experts, total, top_k, empty, seed=5)
    assert np.all(np.diff(r.expert) >= 0), "rows sorted by expert"
    assert r.counts.sum() == r.rows and np.array_equal(r.offsets, np.cumsum(r.counts))
    assert np.array_equal(np.bincount(r.expert, minlength=experts), r.counts)
    assert len(r.forced_empty) == empty and all(r.counts[e] == 0 for e in r.forced_empty)
    assert np.all(r.expert < experts) and np.all((0 <= r.token) & (r.token < tokens))
    pairs = set(zip(r.token.tolist(), r.expert.tolist()))
    assert len(pairs) == r.rows, "a token picks an expert once"
    per_token = np.bincount(r.token, minlength=tokens)
    assert per_token.max() <= top_k
    if total == experts:
        assert np.all(per_token == top_k)
    for e in range(experts):  # within an expert, tokens ascend
        toks = r.token[r.expert == e]
        assert np.all(np.diff(toks) > 0)
    assert r.layout[0] == 0 and np.array_equal(r.layout[1:], r.offsets) and r.layout.dtype == np.int64
    again = cases.route(tokens, experts, total, top_k, empty, seed=5)
    assert np.array_equal(again.token, r.token) and np.array_equal(again.expert, r.expert)


def test_route_rank_share_and_refusals():
    r = cases.route(4096, 32, 256, 8, 2, seed=1)
    assert 0.10 < r.rows / (4096 * 8) < 0.15  # about 32/256 of the routed rows
    with pytest.raises(ValueError):
        cases.route(4, 8, 8, 8, 1, seed=0)  # top_k larger than the experts left
    with pytest.raises(ValueError):
        cases.route(4, 8, 4, 2, 0, seed=0)  # more local experts than the router knows


def test_byte_counts():
    assert cases.nvfp4_bytes(8192, 8192) == 8192 * 4096 + 8192 * 512
    dense = cases.Dense("linear", 16, 8192, 8192, "square")
    assert cases.read_bytes(dense) == 8192 * 4096 + 8192 * 512 + 16 * 8192 * 2
    dual = cases.Dense("dual", 4, 100, 64, "t")
    assert cases.weight_set_bytes(dual) == 200 * 32 + 200 * 4
    model = cases.MoeModel("m", 4, 4, 64, 32, 2, 8, 16)
    moe = cases.Moe(model, "decode", "gate_up")
    counts = np.array([3, 0, 2, 0])
    routing = cases.Routing(np.arange(5), np.array([0, 0, 0, 2, 2]), counts, np.cumsum(counts), (1,))
    assert routing.active == 2
    per_expert = cases.nvfp4_bytes(64, 64)
    assert cases.weight_set_bytes(moe, routing) == 2 * per_expert
    assert cases.read_bytes(moe, 2, routing) == 2 * per_expert + 5 * 64 * 2 + 4 * 4


@pytest.mark.parametrize(
    "set_bytes,l2", [(37_748_736, 50 << 20), (37_748_736, 60 << 20), (600 << 20, 50 << 20), (1, 50 << 20)]
)
def test_rotation(set_bytes, l2):
    sets = cases.rotation_sets(set_bytes, l2)
    assert sets >= 2 and sets * set_bytes > 3 * l2
    assert (sets - 1) * set_bytes <= 3 * l2 or sets == 2
    calls = cases.graph_calls(sets)
    assert calls >= 20 and calls % sets == 0 and calls - sets < 20


def bf16_round(x):
    bits = bf16_bits(np.asarray(x, dtype=np.float64)).astype(np.uint32) << 16
    return bits.view(np.float32).astype(np.float64)


def fp32_dot(a, w, alpha):
    """Sequential FP32 sums of exact products, times alpha in FP32 (a kernel's accumulation)."""
    acc = np.zeros(a.shape[0], dtype=np.float32)
    for k in range(a.shape[1]):
        acc = (acc + (a[:, k] * w[:, k]).astype(np.float32)).astype(np.float32)
    return (acc * np.float32(alpha)).astype(np.float64)


def operands(rng, rows, k):
    """BF16 activations and e2m1 x e4m3-like weights (products exact in FP32)."""
    a = bf16_round(rng.standard_normal((rows, k)) * 3)
    e2m1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    w = (
        rng.choice(e2m1, size=(rows, k))
        * rng.choice([-1, 1], size=(rows, k))
        * 2.0 ** rng.integers(-6, 3, size=(rows, k))
    )
    return a, w


@pytest.mark.parametrize("k", [16, 1024, 4096])
def test_gemm_bound_holds_and_rejects(k):
    rng = np.random.default_rng(k)
    a, w = operands(rng, 400, k)
    alpha = 0.0123
    ref = (a * w).sum(axis=1) * alpha
    s = np.abs(a * w).sum(axis=1) * abs(alpha)
    got = bf16_round(fp32_dot(a, w, alpha))
    prof = tolerance.nvfp4_profile("bfloat16", k)
    bound = prof.gemm_bound(np.abs(ref), s)
    assert np.all(np.abs(got - ref) <= bound)
    assert np.max(np.abs(got - ref) / bound) <= 0.5 + 1e-9  # one rounding: at most half the bound
    wrong = bf16_round(fp32_dot(a, w, alpha * 1.25))  # a wrong global scale
    assert np.mean(np.abs(wrong - ref) > bound) > 0.9
    off = got.copy()
    off[17] = bf16_round(ref[17] + 4 * bound[17])
    assert np.flatnonzero(np.abs(off - ref) > bound).tolist() == [17]


def test_fp16_and_peer_profiles():
    p = tolerance.nvfp4_profile("float16", 100)
    assert p.unit == 2.0**-11 and p.acc == 102 * 2.0**-24 and p.out_coef == p.unit and p.inter == 0
    q = tolerance.peer_profile("bfloat16", 100, dual=True)
    assert q.acc == 102 * 2.0**-24 + tolerance.SPLITS * 2.0**-8
    assert q.out_coef == 2 * 2.0**-8 and q.inter == 2.0**-8
    with pytest.raises(ValueError):
        tolerance.Profile("float32", 16)
    with pytest.raises(ValueError):
        tolerance.Profile("bfloat16", 0)


def silu(x):
    return x / (1 + np.exp(-np.clip(x, -700, 700)))


def test_dual_bound_holds_for_a_rounded_peer():
    rng = np.random.default_rng(3)
    k, alpha = 512, 0.01  # halves of order 1, where silu is neither linear nor flat
    a, w1 = operands(rng, 300, k)
    _, w2 = operands(rng, 300, k)
    x1, x2 = (a * w1).sum(axis=1) * alpha, (a * w2).sum(axis=1) * alpha
    s1, s2 = np.abs(a * w1).sum(axis=1) * alpha, np.abs(a * w2).sum(axis=1) * alpha
    ref = silu(x1) * x2
    # a peer: each half rounded to BF16, silu rounded, the product rounded
    h1, h2 = bf16_round(fp32_dot(a, w1, alpha)), bf16_round(fp32_dot(a, w2, alpha))
    got = bf16_round(bf16_round(silu(h1)) * h2)
    peer = tolerance.peer_profile("bfloat16", k, dual=True)
    args = (np.abs(ref), np.abs(x1), np.abs(x2), np.abs(silu(x1)), s1, s2)
    assert np.all(np.abs(got - ref) <= peer.dual_bound(*args))
    # nvfp4's one rounding from FP32 halves passes its own (tighter) bound
    nv = bf16_round(silu(fp32_dot(a, w1, alpha)) * fp32_dot(a, w2, alpha))
    own = tolerance.nvfp4_profile("bfloat16", k).dual_bound(*args)
    assert np.all(np.abs(nv - ref) <= own)
    assert np.mean(np.abs(bf16_round(silu(x2) * x1) - ref) > own) > 0.9  # halves swapped


def fake_meas(hum_graph=100.0):
    def rec(g, e, ok=True):
        return {"check": {"ok": ok, "bad": 0}, "graph_us": g, "graph_min_us": g, "eager_us": e, "error": None}

    return {
        "impls": {
            report.NVFP4_W4A16: rec(50.0, 60.0),
            report.NVFP4_W4A4: rec(80.0, 90.0),
            report.NVFP4_W4A4_KERNEL: rec(70.0, 75.0),
            report.HUMMING: rec(hum_graph, 120.0) if hum_graph else {"check": None, "error": "no humming"},
            report.TORCH: rec(200.0, 210.0),
        },
        "read": {"graph_us": 40.0, "eager_us": 45.0, "bytes": 123, "config": {"graph": "x"}},
        "sets": 4,
        "calls": 20,
        "torch_peer": "cublas_bf16",
    }


def test_rows_fields_and_ratios():
    case = cases.Dense("linear", 16, 8192, 8192, "square")
    w16, w4 = report.make_rows(case, fake_meas(), "H100")
    need = (
        "op",
        "mode",
        "m",
        "n",
        "k",
        "nvfp4_us",
        "humming_us",
        "speedup_vs_humming",
        "nvfp4_eager_us",
        "humming_eager_us",
        "read_us",
        "read_fraction",
        "card",
    )
    for row in (w16, w4):
        assert all(f in row for f in need) and row["card"] == "H100" and row["op"] == "linear"
    assert (w16["mode"], w16["nvfp4_us"], w16["speedup_vs_humming"], w16["read_fraction"]) == ("w4a16", 50.0, 2.0, 0.8)
    assert w16["speedup_vs_torch"] == 4.0 and w16["eager_speedup_vs_humming"] == 2.0
    assert (w4["mode"], w4["nvfp4_us"], w4["nvfp4_kernel_us"], w4["humming_mode"]) == ("w4a4", 80.0, 70.0, "w4a16")
    assert w4["speedup_vs_humming"] == 1.25 and w4["read_fraction"] == 0.5
    assert set(w4["checks"]) == {report.NVFP4_W4A4, report.NVFP4_W4A4_KERNEL, report.HUMMING, report.TORCH}
    none16, _ = report.make_rows(case, fake_meas(hum_graph=None), "H100")
    assert none16["humming_us"] is None and none16["speedup_vs_humming"] is None
    assert none16["errors"] == {report.HUMMING: "no humming"}


def test_moe_rows_and_failed_case():
    model = cases.MOE_MODELS[1]
    case = cases.Moe(model, "decode", "down")
    routing = cases.case_routing(case, 3)
    row = report.make_rows(case, fake_meas(), "H200", routing)[0]
    assert "m" not in row and row["rows"] == routing.rows and row["experts"] == 128
    assert row["experts_empty"] == 128 - routing.active >= len(routing.forced_empty)
    failed = report.make_rows(case, {"error": "OutOfMemoryError: x"}, "H200", routing)
    assert all(r["nvfp4_us"] is None and r["errors"]["case"].startswith("OutOfMemory") for r in failed)


def test_write_merge_table(tmp_path):
    case_a = cases.Dense("linear", 1, 8192, 8192, "square")
    case_b = cases.Dense("linear", 4, 8192, 8192, "square")
    meta = {"card": "H100"}
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    report.write(
        str(pa), meta, report.make_rows(case_a, fake_meas(), "H100") + report.make_rows(case_b, fake_meas(), "H100")
    )
    report.write(str(pb), meta, report.make_rows(case_b, fake_meas(hum_graph=25.0), "H100"))
    merged = report.merge([json.loads(pa.read_text()), json.loads(pb.read_text())])
    assert len(merged["rows"]) == 4 and len(merged["runs"]) == 2
    b16 = next(r for r in merged["rows"] if r["m"] == 4 and r["mode"] == "w4a16")
    assert b16["humming_us"] == 25.0, "the later run's row wins"
    with pytest.raises(ValueError, match="cards"):
        report.merge([{"card": "H100", "rows": []}, {"card": "H200", "rows": []}])
    text = report.table(merged["rows"])
    assert len(text.splitlines()) == 2 + 4 and "| 2.00 |" in text
    out = tmp_path / "m.json"
    bench_peers.main(["--merge", str(pa), str(pb), "--out", str(out)])
    assert len(json.loads(out.read_text())["rows"]) == 4
    # A merged report merged again keeps each of its runs.
    again = report.merge([json.loads(out.read_text()), json.loads(pb.read_text())])
    assert len(again["runs"]) == 3


def test_card_name():
    assert report.card_name("NVIDIA H100 80GB HBM3") == "H100"
    assert report.card_name("NVIDIA H200") == "H200"
    assert report.card_name("Some GPU 9000") == "Some-GPU-9000"
    assert report.default_path("bench", "H100") == os.path.join("bench", "H100-peers.json")


def test_cli_lists_without_torch(capsys):
    assert bench_peers.main(["--list", "--only", "moe", "--case", "Qwen"]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert [ln for ln in lines if ln] == [c.key for c in cases.all_cases() if c.op == "moe" and "Qwen" in c.key]
