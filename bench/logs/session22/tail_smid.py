"""Are the late SMs of the dense W4A16 decode GEMM the same ones call after call and run after
run? (Session 22's next step 1, for the next session; NOTES.md "Session 22".) Runs session 20's
timeline child (12 calls of the peer bench's graph protocol in one CUDA graph, replayed once)
twice as separate processes, with a kernels folder that printf's, from every CTA at its exit,
"TL cta entry synced first_w mainloop_end epilogue_end smid" (%globaltimer ns; the folder:
session 20's timeline variant with %smid added, `.gpu-carry/kv22/tl`, through NVFP4_KERNELS_DIR).

Per call, each SM's lateness is its CTA's mainloop end minus the call's median mainloop end (µs);
per run, each SM's mean lateness over the calls. Prints the spread of lateness, the correlation of
the SMs' mean lateness between the two runs and between the even and odd calls of one run (near 1:
systematic, the same SMs late; near 0: random), and the latest SMs of each run.

  NVFP4_KERNELS_DIR=.gpu-carry/kv22/tl python tail_smid.py M N K
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "session20"))
from timeline import stamped_calls  # noqa: E402


def calls_of(m, n, k):
    calls, out = stamped_calls(m, n, k)
    if not calls or len(calls[0][0]) != 7:
        sys.exit(f"no 7-field stamps (rc {out.returncode}): is NVFP4_KERNELS_DIR the smid variant? {out.stderr[-400:]}")
    return calls


def lateness(calls):
    """Per call: {smid: mainloop end - the call's median mainloop end, µs}."""
    res = []
    for c in calls:
        med = statistics.median(r[4] for r in c)
        res.append({r[6]: (r[4] - med) / 1e3 for r in c})
    return res


def mean_by_sm(per_call):
    sms = set().union(*per_call)
    return {s: statistics.mean(c[s] for c in per_call if s in c) for s in sms}


def corr(a, b):
    keys = sorted(set(a) & set(b))
    x, y = [a[s] for s in keys], [b[s] for s in keys]
    mx, my = statistics.mean(x), statistics.mean(y)
    sx = sum((v - mx) ** 2 for v in x) ** 0.5
    sy = sum((v - my) ** 2 for v in y) ** 0.5
    return sum((u - mx) * (v - my) for u, v in zip(x, y)) / (sx * sy) if sx and sy else float("nan")


def main(m, n, k):
    runs = [lateness(calls_of(m, n, k)) for _ in range(2)]
    means = [mean_by_sm(r) for r in runs]
    for i, r in enumerate(runs):
        flat = sorted(v for c in r for v in c.values())
        q = lambda f: flat[min(len(flat) - 1, int(f * len(flat)))]  # noqa: E731
        half = [mean_by_sm(r[0::2]), mean_by_sm(r[1::2])]
        late = sorted(means[i], key=means[i].get, reverse=True)[:10]
        print(f"run {i}: {len(r)} calls, {len(means[i])} SMs; lateness µs p10 {q(0.1):.2f} p50 {q(0.5):.2f} "
              f"p90 {q(0.9):.2f} max {flat[-1]:.2f}; even/odd calls corr {corr(*half):.2f}; latest SMs {late}")
    print(f"M={m} N={n} K={k}: the SMs' mean lateness, run 0 against run 1: corr {corr(*means):.2f}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
