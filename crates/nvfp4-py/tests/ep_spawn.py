"""Runs a function on W fresh processes joined in a ``torch.distributed`` process group, for the
expert-parallel tests (``test_moe_ep``, ``tests_gpu/test_ep_gpu``): spawned (not forked: CUDA and
torch's threads do not survive a fork), rendezvous through a file in a fresh temporary folder (no
port to pick), collectives bounded by a timeout, and the whole run by another: on expiry every
process is killed and joined, and the caller gets a ``TimeoutError``; an exception in a process
comes back as ``torch.multiprocessing.ProcessRaisedException`` with its traceback."""

import datetime
import os
import shutil
import sys
import tempfile
import time


def _entry(rank, fn, world, backend, init_file, env, collective_s, args):
    os.environ.update(env)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    kw = {}
    if backend == "nccl":
        torch.cuda.set_device(rank)
        kw["device_id"] = torch.device("cuda", rank)
    dist.init_process_group(
        backend,
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=collective_s),
        **kw,
    )
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def run(fn, world, args=(), backend="gloo", timeout_s=120, collective_s=60, env=None):
    """``fn(rank, world, *args)`` on ``world`` spawned processes (``fn`` and ``args`` picklable:
    ``fn`` a module-level function), each after ``init_process_group(backend)``; returns once
    every one has exited cleanly."""
    import torch.multiprocessing as mp

    env = dict(env or {})
    if backend == "gloo" and sys.platform.startswith("linux") and "GLOO_SOCKET_IFNAME" not in os.environ:
        # The processes share this host: loopback, whatever the host name resolves to.
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    folder = tempfile.mkdtemp(prefix="nvfp4-ep-")
    init_file = os.path.join(folder, "rendezvous")
    ctx = mp.start_processes(
        _entry,
        args=(fn, world, backend, init_file, env, collective_s, tuple(args)),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                for p in ctx.processes:
                    p.join(10)
                raise TimeoutError(f"{world} processes running {fn.__name__} did not finish within {timeout_s} s")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
