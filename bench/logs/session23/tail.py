"""Where the dense W4A16 decode GEMM's last microseconds go: per call (session 20's timeline child,
12 calls of the peer bench's graph protocol in one CUDA graph, replayed once; every CTA stamps
"TL cta entry synced first_w mainloop_end epilogue_end smid" at its exit, a kernels folder through
NVFP4_KERNELS_DIR), the medians over the calls of, in µs after the call's first CTA entry: the
median and the last CTA's mainloop end, the median and the last CTA's epilogue end, and the
last epilogue's end minus the last mainloop's end (the fixup after the slowest piece).

  NVFP4_KERNELS_DIR=... python tail.py LABEL M N K [N K ...]
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "session20"))
from timeline import stamped_shapes  # noqa: E402


def main(label, m, shapes):
    for n, k, calls in stamped_shapes(label, m, shapes):
        keys = ("ml_med", "ml_last", "ep_med", "ep_last", "fix_tail")
        stats = {key: [] for key in keys}
        for c in calls:
            t = min(r[1] for r in c)
            ml = [(r[4] - t) / 1e3 for r in c]
            ep = [(r[5] - t) / 1e3 for r in c]
            stats["ml_med"].append(statistics.median(ml))
            stats["ml_last"].append(max(ml))
            stats["ep_med"].append(statistics.median(ep))
            stats["ep_last"].append(max(ep))
            stats["fix_tail"].append(max(ep) - max(ml))
        print(f"{label} M={m} N={n} K={k}: calls {len(calls)}, CTAs/call {len(calls[0])}; µs: "
              + ", ".join(f"{key} {statistics.median(stats[key]):.2f}" for key in keys), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], [(sys.argv[i], sys.argv[i + 1]) for i in range(3, len(sys.argv), 2)])
