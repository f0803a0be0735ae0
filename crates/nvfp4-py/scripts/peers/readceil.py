"""The read ceiling of a row (SPEC §7): a pure streaming read of exactly the row's input bytes,
under the same two timers as the implementations; the best of a few grids (triton).

The kernel reads an int32 buffer of the row's byte count (rounded up to 64 B, so that Triton can
prove the bound check uniform over each 16-byte load) in 16-byte loads, grid-stride, and sums what
it reads into one word per program (stored, so no load is dead). Under the graph protocol the calls
rotate over as many buffers as the implementations rotate weight sets.
"""

import torch
import triton
import triton.language as tl

from peers.timing import eager_us, graph_us

# (words per program per step, warps, programs per SM)
CONFIGS = ((2048, 4, 4), (4096, 8, 2), (4096, 8, 4), (8192, 8, 2))


@triton.jit
def _read(src, out, n_words, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(pid * BLOCK, n_words, step):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(src + offs, mask=offs < n_words, other=0)
    tl.store(out + pid, tl.sum(acc, axis=0))


def buffers(nbytes, count, device="cuda"):
    words = -(-nbytes // 64) * 16
    return [torch.empty(words, dtype=torch.int32, device=device) for _ in range(count)]


def read_call(buf, block, warps, per_sm, sms):
    programs = min(sms * per_sm, -(-buf.numel() // block))
    out = torch.empty(programs, dtype=torch.int32, device=buf.device)
    n = buf.numel()
    return lambda: _read[(programs,)](buf, out, n, BLOCK=block, num_warps=warps)


def measure(nbytes, sets, calls, replays=10, rep_ms=100):
    """{"bytes", "graph_us", "eager_us", "config", "error"}: the best config under each timer."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bufs = buffers(nbytes, sets)
    best = {"bytes": nbytes, "graph_us": None, "eager_us": None, "config": {}, "error": None}
    for block, warps, per_sm in CONFIGS:
        fns = [read_call(b, block, warps, per_sm, sms) for b in bufs]
        name = f"block={block} warps={warps} programs/SM={per_sm}"
        g, _, gerr = graph_us([fns[i % sets] for i in range(calls)], replays)
        e, eerr = eager_us(fns[0], rep_ms)
        if gerr or eerr:
            best["error"] = gerr or eerr
        if g is not None and (best["graph_us"] is None or g < best["graph_us"]):
            best["graph_us"], best["config"]["graph"] = g, name
        if e is not None and (best["eager_us"] is None or e < best["eager_us"]):
            best["eager_us"], best["config"]["eager"] = e, name
    del bufs
    return best
