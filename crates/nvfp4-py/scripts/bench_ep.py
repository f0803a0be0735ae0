"""One MoE layer split over two GPUs (``nvfp4.torch.ExpertParallelMoE``, NCCL) against one GPU
holding every expert (``nvfp4.torch.MoE``), at decode and prefill sizes: tokens per second and
the share of the expert-parallel step spent in the all-to-alls.

Layers (random NVFP4 weights of the real shapes, one MoE layer each, plain scales, top-8):
``qwen3`` (Qwen3-30B-A3B: E=128, H=2048, I=768) and ``deepseek`` (DeepSeek-V3-like: E=256,
H=7168, I=2048; 6.4 GB of expert weights, each rank holding half). Tokens per rank: decode
1, 16, 64, 128; prefill 1024, 4096. Routing: top-8 of uniform random scores (balanced on
average). W4A16 by default (``--mode w4a4`` for the other).

Rows (JSON lines), per layer and tokens per rank T:

- ``one-gpu``: the layer on rank 0's GPU, all 2T tokens (both ranks' batches) in one call; and
  ``one-gpu-graph`` (decode sizes): the same call captured in a CUDA graph and replayed;
- ``ep-variable``: both ranks, T tokens each, the variable form (eager: it reads the counts on the
  host); ``ep-capacity``: the capacity form (C = T * k, decode sizes), eager; and
  ``ep-capacity-graph``: the capacity form captured in a CUDA graph and replayed.

``ms`` is the time of one step (median over ``--iters`` steps timed one by one with CUDA events,
after warm-up; for the two-GPU rows the slower rank's median); ``tokens_per_s`` = 2T / step time
in every row (the same tokens either way). ``a2a_ms`` and ``a2a_share`` (eager two-GPU rows): CUDA
events recorded on the calling stream right before and after each ``all_to_all_single`` of the
step (``nvfp4.moe_ep._all_to_all`` wrapped), summed over the step's collectives and divided by the
step's time: the time the step's stream spends in the exchanges, waiting for the other rank
included (its load imbalance shows there); in the variable form the host read of the counts
falls between two collectives and is outside it. Graph rows have no per-collective timing.

Launch: ``python3 bench_ep.py`` (spawns two processes, one per GPU) or
``torchrun --nproc-per-node 2 bench_ep.py``. ``--dry-run``: two CPU processes over gloo with a
tiny layer (E=8, H=64, I=32, top-2) and tiny sizes, to exercise the script without GPUs (timings
meaningless). Children get ``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NVSHMEM_DISABLE_NVLS=1``.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

LAYERS = {
    "qwen3": {"name": "Qwen3-30B-A3B", "E": 128, "H": 2048, "I": 768, "k": 8},
    "deepseek": {"name": "DeepSeek-V3-like", "E": 256, "H": 7168, "I": 2048, "k": 8},
    "tiny": {"name": "tiny (dry run)", "E": 8, "H": 64, "I": 32, "k": 2},
}
DECODE, PREFILL = (1, 16, 64, 128), (1024, 4096)
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def layer(cfg, experts, mode, dev, seed):
    """A MoE of ``experts`` experts with random packed weights, E4M3 scales in [0.5, 2] and a
    global scale that keeps outputs of order one."""
    import nvfp4.torch as nvt

    g = torch.Generator(device=dev).manual_seed(seed)
    h, i = cfg["H"], cfg["I"]

    def proj(n, k):
        w = torch.randint(0, 256, (experts, n, k // 2), generator=g, device=dev, dtype=torch.uint8)
        s = torch.randint(0x30, 0x41, (experts, n, k // 16), generator=g, device=dev, dtype=torch.uint8)
        return w, s.view(torch.float8_e4m3fn)

    gu, gus = proj(2 * i, h)
    dn, dns = proj(h, i)
    return nvt.MoE(gu, gus, 0.5 / h**0.5, dn, dns, 0.5 / i**0.5, gate_up_input_scale=0.01, down_input_scale=0.01,
                   mode=mode)


def tokens(cfg, t, dev, seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(t, cfg["H"], generator=g, device=dev).to(torch.bfloat16)
    w, ids = torch.rand(t, cfg["E"], generator=g, device=dev).topk(cfg["k"], dim=1)
    return x, ids, (w / w.sum(dim=1, keepdim=True)).to(torch.bfloat16)


class Clock:
    """Step timings: CUDA events on the current stream (GPU) or the host clock (CPU dry run)."""

    def __init__(self, cuda):
        self.cuda = cuda

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def ms(self, start, end):
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end)
        return (end - start) * 1e3


def timed(fn, clock, iters, warmup=3):
    """Median and all step times in ms of ``fn()`` (each step between two marks)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a = clock.mark()
        fn()
        b = clock.mark()
        times.append(clock.ms(a, b))
    return statistics.median(times)


def graphed(fn):
    """``fn`` captured in a CUDA graph after a warm-up on a side stream; returns the replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        fn()
    return graph.replay


def slowest(v, dev):
    """The largest of the ranks' values (every rank gets it)."""
    t = torch.tensor([float(v)], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def run_rank(rank, world, args):
    import nvfp4.moe_ep as moe_ep
    import nvfp4.torch as nvt

    cuda = not args.dry_run
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    clock = Clock(cuda)
    names = ["tiny"] if args.dry_run else args.layers.split(",")
    decode = (1, 4) if args.dry_run else tuple(int(v) for v in args.decode.split(",") if v)
    prefill = (16,) if args.dry_run else tuple(int(v) for v in args.prefill.split(",") if v)
    iters = 2 if args.dry_run else args.iters
    device_name = torch.cuda.get_device_name(dev) if cuda else "cpu"

    # Per-collective timing: the layer's one call site, wrapped while ``spans`` is a list.
    spans = None
    plain = moe_ep._all_to_all

    def wrapped(*a, **kw):
        if spans is None:
            return plain(*a, **kw)
        start = clock.mark()
        plain(*a, **kw)
        spans.append((start, clock.mark()))

    moe_ep._all_to_all = wrapped

    def emit(row):
        if rank == 0:
            print(json.dumps(row), flush=True)

    for name in names:
        cfg = LAYERS[name]
        e, k = cfg["E"], cfg["k"]
        per = e // world
        local = layer(cfg, per, args.mode, dev, seed=1000 + rank)
        ep_var = nvt.ExpertParallelMoE(local, e)
        ep_cap = nvt.ExpertParallelMoE(local, e, capacity="worst")
        full = layer(cfg, e, args.mode, dev, seed=7) if rank == 0 else None
        base = {"layer": cfg["name"], "E": e, "H": cfg["H"], "I": cfg["I"], "top_k": k, "mode": args.mode,
                "ranks": world, "device": device_name}
        for t in decode + prefill:
            is_decode = t in decode
            x, ids, w = tokens(cfg, t, dev, seed=10 * t + rank)
            row = dict(base, tokens_per_rank=t, phase="decode" if is_decode else "prefill")

            # One GPU: every rank's tokens on rank 0's GPU (the other rank waits).
            if rank == 0:
                xa, ia, wa = tokens(cfg, world * t, dev, seed=10 * t + 99)
                ms = timed(lambda: full(xa, ia, wa), clock, iters)
                emit(dict(row, form="one-gpu", ms=round(ms, 4), tokens_per_s=round(world * t / ms * 1e3, 1)))
                if cuda and is_decode:
                    ms = timed(graphed(lambda: full(xa, ia, wa)), clock, iters)
                    emit(dict(row, form="one-gpu-graph", ms=round(ms, 4), tokens_per_s=round(world * t / ms * 1e3, 1)))
                del xa, ia, wa
            dist.barrier()

            forms = [("ep-variable", ep_var)] + ([("ep-capacity", ep_cap)] if is_decode else [])
            for form, ep in forms:
                dist.barrier()
                ms = slowest(timed(lambda: ep(x, ids, w), clock, iters), dev)
                # The exchanges of a few more steps, each step's share.
                shares, a2a = [], []
                for _ in range(max(2, iters // 2)):
                    dist.barrier()
                    spans = []
                    a = clock.mark()
                    ep(x, ids, w)
                    b = clock.mark()
                    step = clock.ms(a, b)
                    ex = sum(clock.ms(s, f) for s, f in spans)
                    spans = None
                    a2a.append(ex)
                    shares.append(ex / step if step > 0 else 0.0)
                a2a_ms = slowest(statistics.median(a2a), dev)
                share = slowest(statistics.median(shares), dev)
                emit(dict(row, form=form, ms=round(ms, 4), tokens_per_s=round(world * t / ms * 1e3, 1),
                          a2a_ms=round(a2a_ms, 4), a2a_share=round(share, 3)))
            if cuda and is_decode:
                dist.barrier()
                replay = graphed(lambda: ep_cap(x, ids, w))
                dist.barrier()
                ms = slowest(timed(replay, clock, iters), dev)
                emit(dict(row, form="ep-capacity-graph", ms=round(ms, 4), tokens_per_s=round(world * t / ms * 1e3, 1)))
                if ep_cap.overflow_count():
                    raise RuntimeError("capacity T * k overflowed: a bug")
            dist.barrier()
        del local, ep_var, ep_cap, full
        if cuda:
            torch.cuda.empty_cache()


def spawned(rank, world, args, init_file):
    os.environ.update(ENV)
    if args.dry_run and sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # both processes on this host
    backend = "gloo" if args.dry_run else "nccl"
    kw = {}
    if not args.dry_run:
        torch.cuda.set_device(rank)
        kw["device_id"] = torch.device("cuda", rank)
    else:
        torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world, **kw)
    try:
        run_rank(rank, world, args)
    finally:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="two CPU processes over gloo, a tiny layer")
    p.add_argument("--layers", default="qwen3,deepseek", help="comma-separated: qwen3, deepseek")
    p.add_argument("--mode", default="w4a16", choices=["w4a16", "w4a4"])
    p.add_argument("--decode", default=",".join(map(str, DECODE)), help="tokens per rank, decode sizes")
    p.add_argument("--prefill", default=",".join(map(str, PREFILL)), help="tokens per rank, prefill sizes")
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        os.environ.update(ENV)
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if args.dry_run:
            torch.set_num_threads(1)
            dist.init_process_group("gloo")
        else:
            local = int(os.environ.get("LOCAL_RANK", rank))
            torch.cuda.set_device(local)
            dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        try:
            run_rank(rank, world, args)
        finally:
            dist.destroy_process_group()
        return
    world = 2
    if not args.dry_run and torch.cuda.device_count() < world:
        raise SystemExit(f"needs {world} GPUs (found {torch.cuda.device_count()}); --dry-run runs on the CPU")
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="nvfp4-bench-ep-") as d:
        mp.spawn(spawned, args=(world, args, os.path.join(d, "rendezvous")), nprocs=world, join=True)


if __name__ == "__main__":
    main()
