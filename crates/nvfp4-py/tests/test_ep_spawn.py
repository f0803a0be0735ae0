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
    # Both ranks have joined the group first: a rank 0 that returned at once could close its end
    # while rank 1 still connects, and rank 1 would then fail in the rendezvous instead.
    torch.distributed.barrier()
    if rank == 1:
        raise ValueError("rank 1 gave up")
    # Rank 0 waits, in no collective (one would fail on its own when rank 1's end closes, and its
    # error could come back first), until the launcher stops it.
    time.sleep(60)


def test_stuck_ranks_are_killed():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish within 6 s"):
        ep_spawn.run(stuck, 2, timeout_s=6, collective_s=300)
    assert time.monotonic() - start < 60


def test_an_exception_comes_back():
    with pytest.raises(Exception, match="rank 1 gave up"):
        ep_spawn.run(fails, 2, timeout_s=60)
