"""Per-CTA timeline of the dense W4A16 GEMM (packed weights, bf16) in the peer bench's graph
protocol, from a kernel variant that printf's %globaltimer stamps (a kernels folder through
NVFP4_KERNELS_DIR that prints "TL cta entry synced first_w mainloop_end epilogue_end" from every
4th CTA at its exit). Prints, per shape, the medians over the captured calls (µs after the first
CTA's entry): barriers ready, first W stage landed, mainloop end, epilogue end (median and last
CTA), and the gap from one call's last epilogue to the next call's first entry.

  python timeline.py LABEL M N K [N K ...]
"""
import os
import statistics
import subprocess
import sys

def child():
    import torch
    import nvfp4
    import nvfp4.torch  # noqa: F401

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "session19"))
    from dense_ab import captured, weight_sets  # noqa: E402

    m, n, k = (int(a) for a in sys.argv[2:5])
    sets = weight_sets(n, k)
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    g = captured(sets, x, 12)
    torch.cuda.synchronize()
    print("REPLAY", flush=True)
    g.replay()
    torch.cuda.synchronize()


def stamped_calls(m, n, k):
    """The "TL" stamp rows (integers after "TL") of one child process's replay, grouped by call
    (sorted by entry), and the child's result (for its return code and stderr)."""
    out = subprocess.run([sys.executable, __file__, "--child", str(m), str(n), str(k)], capture_output=True, text=True)
    text = out.stdout.split("REPLAY", 1)[-1]
    rows = [tuple(int(v) for v in ln.split()[1:]) for ln in text.splitlines() if ln.startswith("TL ")]
    if not rows:
        return [], out
    rows.sort(key=lambda r: r[1])
    calls, cur = [], [rows[0]]
    for r in rows[1:]:
        if r[1] - cur[0][1] > 3000:  # a new call: entries more than 3 µs after this call's first
            calls.append(cur)
            cur = [r]
        else:
            cur.append(r)
    calls.append(cur)
    return calls, out


def stamped_shapes(label, m, shapes):
    """(n, k, calls) for each shape whose child printed stamps; a line for each that did not."""
    for n, k in shapes:
        calls, out = stamped_calls(m, n, k)
        if calls:
            yield n, k, calls
        else:
            print(f"{label} M={m} N={n} K={k}: no stamps (rc {out.returncode}) {out.stderr[-400:]}")


def main(label, m, shapes):
    for n, k, calls in stamped_shapes(label, m, shapes):
        stats = {"ready": [], "first_w": [], "ml_end": [], "ep_end": [], "last": [], "entry_spread": [], "gap": []}
        for i, c in enumerate(calls):
            t = min(r[1] for r in c)
            stats["entry_spread"].append((max(r[1] for r in c) - t) / 1e3)
            stats["ready"].append(statistics.median(r[2] - t for r in c) / 1e3)
            stats["first_w"].append(statistics.median(r[3] - t for r in c) / 1e3)
            stats["ml_end"].append(statistics.median(r[4] - t for r in c) / 1e3)
            stats["ep_end"].append(statistics.median(r[5] - t for r in c) / 1e3)
            stats["last"].append((max(r[5] for r in c) - t) / 1e3)
            if i + 1 < len(calls):
                stats["gap"].append((min(r[1] for r in calls[i + 1]) - max(r[5] for r in c)) / 1e3)
        med = {key: statistics.median(v) if v else float("nan") for key, v in stats.items()}
        print(f"{label} M={m} N={n} K={k}: calls {len(calls)}, CTAs/call {len(calls[0])}; µs after the first entry: "
              + ", ".join(f"{key} {val:.2f}" for key, val in med.items()), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child()
    else:
        main(sys.argv[1], sys.argv[2], [(sys.argv[i], sys.argv[i + 1]) for i in range(3, len(sys.argv), 2)])
