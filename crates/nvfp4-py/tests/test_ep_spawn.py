"""``ep_spawn.run``, the expert-parallel tests' launcher, cannot hang a test run: processes stuck
(one rank waiting in a collective the other never joins) are killed at the deadline and the
caller gets a ``TimeoutError``; an exception in one rank comes back with its message."""

import time

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with the gloo backend is unavailable", allow_module_level=True)

import ep_spawn  # noqa: E402


def stuck(rank, world):
    if rank == 0:
        torch.distributed.barrier()  # rank 1 never comes
    else:
        time.sleep(600)


def fails(rank, world):
    if rank == 1:
        raise ValueError("rank 1 gave up")


def test_stuck_ranks_are_killed():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish within 6 s"):
        ep_spawn.run(stuck, 2, timeout_s=6, collective_s=300)
    assert time.monotonic() - start < 60


def test_an_exception_comes_back():
    with pytest.raises(Exception, match="rank 1 gave up"):
        ep_spawn.run(fails, 2, timeout_s=60)
