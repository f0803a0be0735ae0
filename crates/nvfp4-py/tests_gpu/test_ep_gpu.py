"""``nvfp4.torch.ExpertParallelMoE`` on two GPUs (NCCL, one process per GPU, spawned by
``tests/ep_spawn.py``): each rank's outputs against the one-GPU ``MoE`` holding every expert, both
modes, both forms, and the capacity form captured in a CUDA graph and replayed with new tokens.

What bit-identity means on the GPU: the grouped GEMM shares its tiles and k-steps among its CTAs
over the whole launch and picks its tile from T, so where its float32 sums round, a row's bits
can depend on the other rows of the launch (the one-GPU layer's own outputs depend on the batch
likewise). The expert-parallel layer runs other launches (each rank's received rows), so:

- on exact-tier data (every GEMM sum exact in float32 in any order: the layer's weights and tokens
  below are built so), the outputs must be the one-GPU layer's bits, eager and replayed; that the
  data is of that tier is checked first (the one-GPU layer gives the same rows for a rank's tokens
  alone as within every rank's);
- on Gaussian data, the outputs must be within the one-GPU layer's own tolerance against the CPU
  (``tests_gpu/test_hf_gpu``: the three roundings each at most one ulp apart, norm-wise
  3 * 2^-7), and the share of bit-identical elements is reported.

The children run with ``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` and
``NVSHMEM_DISABLE_NVLS=1`` (no NVLink multicast). Each rank writes its findings to a file; the
checks run here, in the parent.
"""

import math
import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))

import ep_spawn  # noqa: E402
import nvfp4.torch as nvt  # noqa: E402

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2 or not torch.distributed.is_nccl_available(),
    reason="needs two CUDA GPUs and NCCL",
)

WORLD = 2
E, H, I, TOPK = 8, 256, 64, 4
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
COUNTS = (6, 3)  # tokens per rank, variable form
STEP = 5  # tokens per rank of the captured decode step
TOLERANCE = 3 * 2.0**-7


def pack(codes):
    """E2M1 codes [.., K] -> packed bytes [.., K/2] (low nibble first)."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)


def exact_layer(mode, g):
    """A layer whose GEMM sums are exact in float32 in any order for ``exact_tokens``: every
    weight scale 1.0, power-of-two global and input scales (gate/up's 1, one for all experts;
    down's 2^-4 or 2^-5, per expert); gate weights 4 or 6 (so gate > 0 and silu(gate) is not
    small), up weights 0, +-4 or +-6, down weights any E2M1 value. Tokens with two nonzeros in
    {1, 2} then give gate/up sums of two terms and SwiGLU values of magnitude 0 or in [16, 620),
    whose down sums (I = 64 terms) stay below 2^22 of their quantum (W4A4 likewise, with the
    SwiGLU values quantized: block scales in [2.5, 104])."""
    gate = torch.tensor([6, 7])[torch.randint(0, 2, (E, I, H), generator=g)]
    up = torch.tensor([0, 6, 7, 14, 15])[torch.randint(0, 5, (E, I, H), generator=g)]
    down = torch.randint(0, 16, (E, H, I), generator=g)
    one = torch.tensor(0x38, dtype=torch.uint8)
    gu = pack(torch.cat([gate, up], dim=1))
    dn = pack(down)
    gus = one.expand(E, 2 * I, H // 16).contiguous().view(torch.float8_e4m3fn)
    dns = one.expand(E, H, I // 16).contiguous().view(torch.float8_e4m3fn)
    gu_g = 1.0
    dn_g = torch.tensor([2.0 ** -(4 + e % 2) for e in range(E)])
    return nvt.MoE(gu, gus, gu_g, dn, dns, dn_g, gate_up_input_scale=0.125, down_input_scale=1.0, mode=mode)


def gaussian_layer(mode, g):
    """Random packed weights, E4M3 scales in [2^-3, 2^2], distinct per-expert global scales."""
    gu = torch.randint(0, 256, (E, 2 * I, H // 2), generator=g, dtype=torch.uint8)
    dn = torch.randint(0, 256, (E, H, I // 2), generator=g, dtype=torch.uint8)
    gus = torch.randint(0x20, 0x48, (E, 2 * I, H // 16), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
    dns = torch.randint(0x20, 0x48, (E, H, I // 16), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
    gu_g = torch.tensor([2.0**-6 * (1 + e / 8) for e in range(E)])
    dn_g = torch.tensor([2.0**-7 * (1 + e / 16) for e in range(E)])
    return nvt.MoE(gu, gus, gu_g, dn, dns, dn_g, gate_up_input_scale=0.02, down_input_scale=0.004, mode=mode)


def routing(g, t, dtype):
    """Top-k of random scores over experts 0..E-2 (expert E-1 gets no token), the last slot of
    the first token sent to id E (held elsewhere: dropped); normalized weights."""
    w, ids = torch.rand(t, E - 1, generator=g).topk(TOPK, dim=1)
    if t:
        ids[0, -1] = E
    return ids, (w / w.sum(dim=1, keepdim=True)).to(dtype)


def exact_tokens(g, t, dtype):
    x = torch.zeros(t, H)
    for i in range(t):
        pos = torch.randperm(H, generator=g)[:2]
        x[i, pos] = torch.tensor([1.0, 2.0])[torch.randint(0, 2, (2,), generator=g)]
    return (x.to(dtype), *routing(g, t, dtype))


def gaussian_tokens(g, t, dtype):
    return ((torch.randn(t, H, generator=g) * 2).to(dtype), *routing(g, t, dtype))


def bits(x):
    return x.contiguous().view(torch.int16)


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def worker(rank, world, folder, cuda=True):
    """One rank: for each (data tier, mode), the one-GPU layer on every rank's tokens, then the
    variable form, the capacity form eager, and the capacity form captured and replayed on three
    new batches; findings saved to a file. (``cuda=False``: the same on the CPU backend with
    gloo, the replays run eagerly: a dry run of this code where no GPU is.)"""
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    found = {}
    for tier in ("exact", "gaussian"):
        for mode in ("w4a16", "w4a4"):
            key = f"{tier}-{mode}"
            g = torch.Generator().manual_seed(11)  # the same layer and tokens on both ranks
            exact = tier == "exact"
            make_layer, make_tokens = (exact_layer, exact_tokens) if exact else (gaussian_layer, gaussian_tokens)
            cpu_layer = make_layer(mode, g)
            full = cpu_layer.to(dev)
            x, ids, w = make_tokens(g, sum(COUNTS), torch.bfloat16)
            want = full(x.to(dev), ids.to(dev), w.to(dev))
            res = {}
            lo = sum(COUNTS[:rank])
            s = slice(lo, lo + COUNTS[rank])
            if tier == "exact":  # the data tier: the one-GPU layer's rows do not depend on the batch
                alone = full(x[s].to(dev), ids[s].to(dev), w[s].to(dev))
                res["batch_invariant"] = torch.equal(bits(alone), bits(want[s]))
            var = nvt.ExpertParallelMoE.from_moe(full)
            got = var(x[s].to(dev), ids[s].to(dev), w[s].to(dev))
            res["variable"] = (torch.equal(bits(got), bits(want[s])), rel(got, want[s]))

            cap = nvt.ExpertParallelMoE.from_moe(full, capacity="worst")
            # The decode step: STEP tokens per rank, static buffers.
            batches = [make_tokens(g, WORLD * STEP, torch.bfloat16) for _ in range(4)]
            mine = slice(rank * STEP, (rank + 1) * STEP)
            sx, sids, sw = (t_[mine].to(dev).clone() for t_ in batches[0])
            eager = cap(sx, sids, sw)
            want0 = full(*(t_.to(dev) for t_ in batches[0]))[mine]
            res["capacity"] = (torch.equal(bits(eager), bits(want0)), rel(eager, want0))

            graph = None
            if cuda:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):  # warm-up before capture: kernels bound, pools warm
                    for _ in range(2):
                        cap(sx, sids, sw)
                torch.cuda.current_stream().wait_stream(side)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    out = cap(sx, sids, sw)
            replays = []
            for bx, bids, bw in batches[1:]:
                sx.copy_(bx[mine].to(dev))
                sids.copy_(bids[mine].to(dev))
                sw.copy_(bw[mine].to(dev))
                if cuda:
                    graph.replay()
                    torch.cuda.synchronize()
                else:
                    out = cap(sx, sids, sw)
                ref = full(bx.to(dev), bids.to(dev), bw.to(dev))[mine]
                replays.append((torch.equal(bits(out), bits(ref)), rel(out, ref)))
            res["replays"] = replays
            res["overflow"] = cap.overflow_count()
            found[key] = res
            del graph

    # Over the capacity on the GPU: one row per (rank, rank) pair, NaN policy, counted.
    g = torch.Generator().manual_seed(5)
    full = gaussian_layer("w4a16", g).to(dev)
    x, ids, w = gaussian_tokens(g, WORLD * STEP, torch.bfloat16)
    mine = slice(rank * STEP, (rank + 1) * STEP)
    small = nvt.ExpertParallelMoE.from_moe(full, capacity=1)
    got = small(x[mine].to(dev), ids[mine].to(dev), w[mine].to(dev))
    per, seen, over = E // WORLD, [0] * WORLD, torch.zeros(STEP, dtype=torch.bool)
    for i, row in enumerate(ids[mine].tolist()):
        for e in row:
            if e < E:
                seen[e // per] += 1
                over[i] |= seen[e // per] > 1
    want = full(x.to(dev), ids.to(dev), w.to(dev))[mine]
    found["over_capacity"] = {
        "count": small.overflow_count(),
        "expected": sum(max(0, c - 1) for c in seen),
        "nan_rows_match": torch.equal(torch.isnan(got).any(dim=1).cpu(), over),
        "others_equal_rel": rel(got[~over.to(dev)], want[~over.to(dev)]) if (~over).any() else 0.0,
    }
    torch.save(found, pathlib.Path(folder) / f"found.{rank}.pt")


@pytest.fixture(scope="module")
def found(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ep-gpu")
    ep_spawn.run(worker, WORLD, (str(folder),), backend="nccl", timeout_s=420, collective_s=180, env=ENV)
    return [torch.load(folder / f"found.{r}.pt") for r in range(WORLD)]


@pytest.mark.parametrize("mode", ["w4a16", "w4a4"])
def test_exact_tier_bit_identical(found, mode):
    for rank, f in enumerate(found):
        res = f[f"exact-{mode}"]
        assert res["batch_invariant"], f"rank {rank}: the data is not of the exact tier (rows depend on the batch)"
        assert res["variable"][0], (rank, "variable form", res["variable"])
        assert res["capacity"][0], (rank, "capacity form, eager", res["capacity"])
        assert all(eq for eq, _ in res["replays"]), (rank, "capacity form, replayed", res["replays"])
        assert res["overflow"] == 0


@pytest.mark.parametrize("mode", ["w4a16", "w4a4"])
def test_gaussian_within_tolerance(found, mode):
    for rank, f in enumerate(found):
        res = f[f"gaussian-{mode}"]
        for what, (_eq, r) in [("variable", res["variable"]), ("capacity", res["capacity"])] + [
            ("replay", x) for x in res["replays"]
        ]:
            assert math.isfinite(r) and r <= TOLERANCE, (rank, what, r)
        assert res["overflow"] == 0
        print(f"rank {rank} {mode}: bit-identical variable {res['variable'][0]}, capacity {res['capacity'][0]}, "
              f"replays {[eq for eq, _ in res['replays']]}")


def test_over_capacity(found):
    for rank, f in enumerate(found):
        res = f["over_capacity"]
        assert res["count"] == res["expected"] and res["expected"] > 0, (rank, res)
        assert res["nan_rows_match"], (rank, res)
        assert res["others_equal_rel"] <= TOLERANCE, (rank, res)
