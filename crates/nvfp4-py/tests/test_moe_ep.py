"""``nvfp4.torch.ExpertParallelMoE`` on the CPU backend: two processes joined by ``gloo`` (spawned
once for the whole module, each running every case below and saving its outputs), each rank's
outputs against the one-process ``MoE`` holding every expert on all ranks' tokens, bit for bit.

Cases: both modes, both dtypes, both forms (variable, capacity: ``"worst"`` and a given C), the
layer built from a full ``MoE`` and from this rank's weights only, per-expert alphas (distinct
global scales), uneven token counts (a rank with none), an expert receiving no token, a rank
receiving no row (all tokens routed to the other's experts), ids >= E in every case, k = 1, 2 and
3, and the over-capacity behaviour (NaN and counted; dropped and counted); no host read in the
capacity form (every Python-level read of a tensor refused during a call); then the errors."""

import contextlib
import pathlib

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with the gloo backend is unavailable", allow_module_level=True)

import ep_spawn  # noqa: E402
import nvfp4.torch as nvt  # noqa: E402

H, I, WORLD = 64, 32, 2
BF, F16 = torch.bfloat16, torch.float16

# name: mode, dtype, E, k, tokens per rank, experts the router picks from, capacity, overflow,
# how the rank builds its layer ("moe": from the full MoE; "local": from its weights only),
# the router weights' dtype (None: the tokens').
CASES = {
    "var_w4a16": ("w4a16", BF, 4, 2, (5, 3), (0, 1, 2), None, "nan", "local", None),
    "var_w4a4": ("w4a4", F16, 4, 2, (3, 6), (0, 2, 3), None, "nan", "moe", None),
    "var_k3": ("w4a16", F16, 8, 3, (7, 4), (0, 1, 2, 3, 4, 6, 7), None, "nan", "moe", torch.float32),
    "var_k1_w4a4": ("w4a4", BF, 8, 1, (4, 5), (1, 3, 4, 7), None, "nan", "local", None),
    "var_idle_rank": ("w4a4", BF, 4, 2, (4, 0), (0, 1), None, "nan", "local", None),
    "cap_worst_w4a16": ("w4a16", BF, 8, 3, (6, 6), (0, 1, 2, 3, 4, 5, 6), "worst", "nan", "moe", torch.float32),
    "cap_worst_w4a4": ("w4a4", BF, 4, 2, (5, 5), (1, 2, 3), "worst", "nan", "local", None),
    "cap_given": ("w4a16", F16, 4, 2, (5, 3), (0, 1, 2, 3), 10, "nan", "moe", None),
    "cap_given_w4a4": ("w4a4", F16, 4, 2, (2, 6), (0, 1, 2, 3), 12, "nan", "local", None),
    "cap_idle_rank": ("w4a16", BF, 4, 2, (4, 4), (0, 1), "worst", "nan", "moe", None),
    "cap_over_nan": ("w4a16", BF, 4, 2, (4, 4), (0, 1, 2), 3, "nan", "moe", None),
    "cap_over_drop": ("w4a4", BF, 4, 2, (4, 4), (0, 1, 2), 3, "drop", "local", None),
}


def weights(e, seed):
    """Stacked expert tensors of a layer: random packed values, E4M3 scales in [2^-3, 2^2],
    distinct per-expert global scales (so alphas go as tensors), one input scale per projection."""
    g = torch.Generator().manual_seed(seed)

    def proj(n, k):
        w = torch.randint(0, 256, (e, n, k // 2), generator=g, dtype=torch.uint8)
        s = torch.randint(0x20, 0x48, (e, n, k // 16), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
        return w, s

    gu, gus = proj(2 * I, H)
    dn, dns = proj(H, I)
    gu_g = torch.tensor([2.0**-6 * (1 + j / 8) for j in range(e)])
    dn_g = torch.tensor([2.0**-7 * (1 + 2 * j / 16) for j in range(e)])
    return gu, gus, gu_g, dn, dns, dn_g


def layer(mode, e, seed, lo=0, hi=None):
    """The MoE of experts lo .. hi-1 of the layer (all of them by default), built by the
    constructor as a rank loading only its weights would."""
    hi = e if hi is None else hi
    gu, gus, gu_g, dn, dns, dn_g = (t[lo:hi] for t in weights(e, seed))
    return nvt.MoE(gu, gus, gu_g, dn, dns, dn_g, gate_up_input_scale=0.02, down_input_scale=0.004, mode=mode)


def tokens(name):
    """Every rank's tokens, ids and router weights, concatenated in rank order: top-k of random
    scores over the case's experts, the last slot of the first token and the first slot of every sixth
    token sent to ids >= E (held elsewhere: dropped)."""
    mode, dtype, e, k, counts, picks, *_, wdtype = CASES[name]
    g = torch.Generator().manual_seed(sum(map(ord, name)))  # the same in every process
    t = sum(counts)
    x = (torch.randn(t, H, generator=g) * 2).to(dtype)
    scores = torch.rand(t, len(picks), generator=g)
    w, j = scores.topk(k, dim=1)
    ids = torch.tensor(picks)[j]
    if t:
        ids[0, -1] = e
        ids[::6, 0] = e + 5
    w = (w / w.sum(dim=1, keepdim=True)).to(wdtype or dtype)
    return x, ids, w


def split(name, rank):
    counts = CASES[name][4]
    lo = sum(counts[:rank])
    return slice(lo, lo + counts[rank])


def overflowing(name):
    """The (token, slot) pairs past the capacity, per rank, as the layer defines them: each
    rank's pairs in (token, slot) order, the first C for each receiving rank sent."""
    _mode, _dtype, e, k, counts, _p, cap, *_ = CASES[name]
    _, ids, _ = tokens(name)
    per = e // WORLD
    over = torch.zeros_like(ids, dtype=torch.bool)
    for r in range(WORLD):
        sent = [0] * WORLD
        for i in range(split(name, r).start, split(name, r).stop):
            for j in range(k):
                e_ = int(ids[i, j])
                if e_ < e:
                    d = e_ // per
                    sent[d] += 1
                    over[i, j] = isinstance(cap, int) and sent[d] > cap
    return over


@contextlib.contextmanager
def no_host_reads():
    """Every Python-level read of a tensor's value on the host (``item``, ``tolist``, ``bool``,
    ``int``, ``float``, ``__index__``, ``numpy``) raises inside: what the capacity form must never
    do (on a GPU each would synchronize and fail a CUDA graph capture)."""
    names = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy")
    saved = {n: getattr(torch.Tensor, n) for n in names}

    def refuse(self, *args, **kwargs):
        raise RuntimeError("host read of a tensor")

    for n in names:
        setattr(torch.Tensor, n, refuse)
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.Tensor, n, f)


def worker(rank, world, folder):
    """One rank: every case, then the errors; outputs saved as ``<case>.<rank>.pt``."""
    folder = pathlib.Path(folder)
    for name, (mode, _dtype, e, _k, _c, _p, cap, overflow, build, _w) in CASES.items():
        seed = len(name)
        per = e // world
        if build == "moe":
            ep = nvt.ExpertParallelMoE.from_moe(layer(mode, e, seed), capacity=cap, overflow=overflow)
        else:
            local = layer(mode, e, seed, rank * per, (rank + 1) * per)
            ep = nvt.ExpertParallelMoE(local, e, capacity=cap, overflow=overflow)
        x, ids, w = tokens(name)
        s = split(name, rank)
        out = ep(x[s], ids[s], w[s])
        counts = [ep.overflow_count()]
        try:  # the second call with host reads refused: the capacity form makes none
            with no_host_reads():
                again = ep(x[s], ids[s], w[s])
            refused = None
        except RuntimeError as exc:  # the variable form reads the counts (both ranks, same place)
            again, refused = ep(x[s], ids[s], w[s]), str(exc)
        counts.append(ep.overflow_count())
        ep.reset_overflow()
        counts.append(ep.overflow_count())
        saved = {"out": out, "again": again, "overflow": counts, "refused": refused}
        torch.save(saved, folder / f"{name}.{rank}.pt")

    errors = []

    def expect(fn):
        try:
            fn()
        except Exception as exc:  # recorded, checked by the parent
            errors.append((type(exc).__name__, str(exc)))
        else:
            errors.append(("none", ""))

    two = layer("w4a16", 4, 1, 0, 2)
    expect(lambda: nvt.ExpertParallelMoE(two, 3))
    expect(lambda: nvt.ExpertParallelMoE(two, 8))
    expect(lambda: nvt.ExpertParallelMoE(two, 4, capacity=0))
    expect(lambda: nvt.ExpertParallelMoE(two, 4, capacity=2.5))
    expect(lambda: nvt.ExpertParallelMoE(two, 4, capacity="max"))
    expect(lambda: nvt.ExpertParallelMoE(two, 4, overflow="clip"))
    expect(lambda: nvt.ExpertParallelMoE("experts", 4))
    expect(lambda: nvt.ExpertParallelMoE.from_moe(layer("w4a16", 3, 1)))
    ep = nvt.ExpertParallelMoE(two, 4)
    ids = torch.zeros(3, 2, dtype=torch.long)
    expect(lambda: ep(torch.zeros(3, H + 16, dtype=BF), ids, torch.ones(3, 2)))
    expect(lambda: ep(torch.zeros(3, H), ids, torch.ones(3, 2)))
    expect(lambda: ep(torch.zeros(3, H, dtype=BF), ids, torch.ones(3, 3)))
    expect(lambda: ep(torch.zeros(3, H, dtype=BF), ids[:2], torch.ones(2, 2)))
    torch.save(errors, folder / f"errors.{rank}.pt")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ep")
    ep_spawn.run(worker, WORLD, (str(folder),), backend="gloo", timeout_s=180, collective_s=60)
    return folder


def bits(x):
    return x.contiguous().view(torch.int16)


def single(name, ids=None):
    """The one-process layer holding every expert, on every rank's tokens."""
    mode, _dtype, e, *_ = CASES[name]
    x, ids0, w = tokens(name)
    return layer(mode, e, len(name))(x, ids0 if ids is None else ids, w)


def saved(folder, name, rank):
    return torch.load(folder / f"{name}.{rank}.pt")


@pytest.mark.parametrize("name", [n for n in CASES if "over" not in n])
def test_equals_single_layer(ranks, name):
    want = single(name)
    assert not overflowing(name).any()
    for rank in range(WORLD):
        got = saved(ranks, name, rank)
        s = split(name, rank)
        assert got["out"].dtype == want.dtype and got["out"].shape == want[s].shape
        assert torch.equal(bits(got["out"]), bits(want[s])), (name, rank)
        assert torch.equal(bits(got["again"]), bits(want[s])), (name, rank)
        assert got["overflow"] == [0, 0, 0]
        # The capacity form reads nothing on the host; the variable form reads the counts.
        assert got["refused"] == (None if CASES[name][6] is not None else "host read of a tensor"), got["refused"]


def test_cases_cover():
    """The cases hold what the module docstring says: an expert with no token, ranks with no
    token and receiving no row, dropped ids, overflow on both ranks."""
    for name in ("var_w4a16", "cap_worst_w4a4"):
        e = CASES[name][2]
        _, ids, _ = tokens(name)
        assert set(range(e)) - set(ids.flatten().tolist())
        assert (ids >= e).any()
    for name in ("var_idle_rank", "cap_idle_rank"):
        _, ids, _ = tokens(name)
        assert (ids < 2).any() and not ((ids >= 2) & (ids < 4)).any()  # rank 1's experts get none
    assert CASES["var_idle_rank"][4][1] == 0
    over = overflowing("cap_over_nan")
    assert over[split("cap_over_nan", 0)].any() and over[split("cap_over_nan", 1)].any()


def test_the_check_can_fail(ranks):
    """Other routing gives other bits: the equalities above compare something."""
    name = "var_w4a16"
    _, ids, _ = tokens(name)
    other = single(name, (ids + 1) % 4)
    got = saved(ranks, name, 0)["out"]
    assert not torch.equal(bits(got), bits(other[split(name, 0)]))


def test_over_capacity_nan(ranks):
    """Pairs past the capacity: their tokens' outputs are NaN, every other token's are the single
    layer's bits, and the count is on the device, per call, until reset (the second call made no
    host read)."""
    name = "cap_over_nan"
    over = overflowing(name)
    want = single(name)
    for rank in range(WORLD):
        s = split(name, rank)
        got = saved(ranks, name, rank)
        bad = over[s].any(dim=1)
        assert bad.any() and not bad.all()
        assert torch.isnan(got["out"][bad]).all()
        assert torch.equal(bits(got["out"][~bad]), bits(want[s][~bad]))
        n = int(over[s].sum())
        assert got["overflow"] == [n, 2 * n, 0] and got["refused"] is None


def test_over_capacity_drop(ranks):
    """``overflow="drop"``: the pairs past the capacity count as an expert held nowhere (the
    single layer with their ids set to E gives the same bits), and are counted."""
    name = "cap_over_drop"
    e = CASES[name][2]
    over = overflowing(name)
    _, ids, _ = tokens(name)
    want = single(name, torch.where(over, e, ids))
    for rank in range(WORLD):
        s = split(name, rank)
        got = saved(ranks, name, rank)
        assert not torch.isnan(got["out"]).any()
        assert torch.equal(bits(got["out"]), bits(want[s]))
        assert got["overflow"] == [int(over[s].sum()), 2 * int(over[s].sum()), 0] and got["refused"] is None


def test_errors(ranks):
    expected = [
        ("ValueError", "3 experts do not split evenly over 2 ranks"),
        ("ValueError", "local holds 2 experts; 8 experts over 2 ranks are 4 per rank"),
        ("ValueError", "capacity must be >= 1"),
        ("TypeError", "capacity must be None"),
        ("TypeError", "capacity must be None"),
        ("ValueError", 'overflow must be "nan" or "drop"'),
        ("TypeError", "local must be an nvfp4.torch.MoE"),
        ("ValueError", "3 experts do not split evenly over 2 ranks"),
        ("ValueError", "hidden_states must be [T, 64]"),
        ("TypeError", "float16 or bfloat16"),
        ("ValueError", "top_k_weights must have top_k_index's shape"),
        ("ValueError", "top_k_index must be [T, k] = [3, k]"),
    ]
    for rank in range(WORLD):
        got = torch.load(ranks / f"errors.{rank}.pt")
        assert len(got) == len(expected)
        for (kind, msg), (want_kind, want_msg) in zip(got, expected):
            assert kind == want_kind and want_msg in msg, (kind, msg, want_kind, want_msg)


def test_needs_a_process_group():
    """In this (parent) process no group is initialized: a clear error, not a hang."""
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="needs an initialized torch.distributed process group"):
        nvt.ExpertParallelMoE(layer("w4a16", 4, 1, 0, 2), 4)
    with pytest.raises(ValueError, match="needs an initialized torch.distributed process group"):
        nvt.ExpertParallelMoE.from_moe(layer("w4a16", 4, 1))
