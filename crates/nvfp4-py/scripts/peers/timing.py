"""The two timers every implementation and every read ceiling goes through (torch, triton).

- graph: the calls (one per rotating weight set, cycled: ``calls[i]`` reads set i % R, R sets
  together more than 3x L2) captured back to back in one CUDA graph, as a serving stack's decode
  step replays them; every call reads its weights from DRAM and no host cost is paid. All calls run
  once eagerly on a side stream first (JIT compiles, loads modules, fills the allocator), then the
  graph is replayed twice, then ``replays`` times between CUDA events: µs per call = median replay
  time / number of calls (the min too).
- eager: ``triton.testing.do_bench(call, return_mode="median")``, one call per rep between CUDA
  events, L2 cleared before each rep (a 256 MB write): what an eager user sees. The clear runs on
  the GPU ahead of the call, so host cost shows where it outlasts the GPU work plus that clear.

A call that cannot run or be captured (a host synchronization inside it, for example) yields
None with the reason.
"""

import statistics

import torch


def _err(exc):
    return f"{type(exc).__name__}: {exc}".strip()[:500]


def eager_us(call, rep_ms=100):
    import triton

    try:
        return triton.testing.do_bench(call, warmup=25, rep=rep_ms, return_mode="median") * 1e3, None
    except Exception as exc:  # noqa: BLE001 (recorded in the row)
        torch.cuda.synchronize()
        return None, _err(exc)


def graph_us(calls, replays=10):
    """(median µs per call, min µs per call, error)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for call in calls:
                call()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        return None, None, f"warm-up: {_err(exc)}"
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for call in calls:
                call()
    except Exception as exc:  # noqa: BLE001
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001 (the capture's error is the one to report)
            pass
        return None, None, f"capture: {_err(exc)}"
    try:
        graph.replay()
        graph.replay()
        times = []
        for _ in range(replays):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / len(calls))
        return statistics.median(times), min(times), None
    except Exception as exc:  # noqa: BLE001
        return None, None, f"replay: {_err(exc)}"
    finally:
        del graph
