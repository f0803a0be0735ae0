"""``scripts/bench_ep.py --dry-run``: the expert-parallel bench end to end on two CPU processes
over gloo (a tiny layer), so that the script CI cannot time still runs: every row it promises,
with positive timings and exchange shares within [0, 1]. One mode (the default): each run spawns
two processes that import torch, which is most of its time."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with the gloo backend is unavailable", allow_module_level=True)

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "bench_ep.py"


def test_dry_run(mode="w4a16"):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--mode", mode],
        capture_output=True, text=True, timeout=180, env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    seen = {(r["tokens_per_rank"], r["form"]) for r in rows}
    want = {(t, f) for t in (1, 4) for f in ("one-gpu", "ep-variable", "ep-capacity")}
    want |= {(16, "one-gpu"), (16, "ep-variable")}
    assert seen == want, seen
    for r in rows:
        assert r["mode"] == mode and r["ms"] > 0 and r["tokens_per_s"] > 0
        if r["form"].startswith("ep-"):
            assert 0 <= r["a2a_share"] <= 1 and r["a2a_ms"] >= 0
