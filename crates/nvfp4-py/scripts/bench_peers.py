"""nvfp4 against the peers a Hopper user would pick instead (SPEC §10, issue 21 item 4), in one
process with one timer: SPEC §9's shapes, both modes, nvfp4 beside Humming, cuBLAS BF16 and
torch._grouped_mm BF16.

Per case (peers/cases.py: dense N = K = 8192 and the contest GEMM shapes, a dense SwiGLU gate/up
where nvfp4's dual GEMM is the operation, the MoE expert projections of Mixtral-8x7B,
Qwen3-30B-A3B and a DeepSeek-V3 expert-parallel rank at decode and prefill):

1. operands (peers/operands.py): standard normal BF16 activations; R weight sets quantized by
   nvfp4.quantize (ModelOpt convention), R chosen so that the sets a call reads exceed 3x L2;
   their BF16 dequantized copies for the torch peer; for MoE, rows routed by a top-k of random
   scores, sorted by expert, a few experts empty.
2. implementations (peers/impls.py): nvfp4 W4A16 (16-bit activation in A's slot), nvfp4 W4A4 as
   a user calls it (activation quantization with the static input_scale included) and its GEMM
   alone, Humming W4A16 (peers/humming_peer.py), the torch peer.
3. check (peers/reference.py, peers/tolerance.py): each output against the float64 reference of
   its own semantics, elementwise within a derived bound and normwise within 2^-6; a failure is
   recorded and that implementation is not timed.
4. timers (peers/timing.py): graph (N >= 20 calls over the R sets in one CUDA graph, µs per call)
   and eager (triton do_bench, one call per rep, L2 cleared); the row's read ceiling
   (peers/readceil.py) under both.
5. rows (peers/report.py): one per (case, mode) in ``<out-dir>/<card>-peers.json``, rewritten
   after every case; the table printed at the end.

Humming's API (humming-kernels 0.1.19, read from its wheel; peers/humming_peer.py has the detail):
``HummingLayer(shape_n=N, shape_k=K, weight_config={"quant_method": "modelopt", "quant_algo":
"NVFP4"}, num_experts=E|None, torch_dtype=torch.bfloat16).cuda()``, then ``load_from_tensors``
of the ModelOpt tensors (``weight`` uint8 [(E,) N, K/2], ``weight_scale`` float8_e4m3fn
[(E,) N, K/16], ``weight_scale_2`` float32 [1] or [E]), then ``transform()``; dense ``layer(x)``,
MoE ``layer(x_sorted, expert_layout=int64 [E+1] offsets with a leading 0,
compute_config={"gemm_type": "grouped_contiguous"})``. Its kernels JIT-compile on first use; its
default path compiles every M interval of a shape at once (about 30 kernels), so each case passes
``tuning_config=`` the configuration Humming's own heuristic gives that case's M (the kernel the
default path would launch), and all of them compile in parallel before the first case
(``--humming-default-path`` restores the default). On Hopper it has no NVFP4-activation path (FP4
activations need sm_120), so W4A4 rows show its W4A16 time (``humming_mode``).

Usage (GPU machine; crates/nvfp4-py/scripts/gpu-peers.sh installs the wheels and runs this):
  python3 bench_peers.py [--quick] [--only dense|linear|dual|moe] [--case TEXT] [--reps N]
                         [--eager-ms MS] [--dtype bfloat16|float16] [--out-dir DIR | --out FILE]
                         [--max-seconds S]
  python3 bench_peers.py --merge A.json B.json [--out FILE]    (no GPU: one report, the table)
"""

import argparse
import gc
import json
import os
import sys
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peers import cases as cases_mod  # noqa: E402
from peers import report  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a few cases touching every path")
    p.add_argument("--only", choices=("dense", "linear", "dual", "moe"), help="one kind of case")
    p.add_argument("--case", action="append", default=[], help="keep cases whose key contains TEXT (repeatable)")
    p.add_argument("--reps", type=int, default=10, help="timed graph replays (default 10)")
    p.add_argument("--eager-ms", type=int, default=100, help="do_bench's rep time in ms (default 100)")
    p.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16", help="activation dtype")
    p.add_argument("--out-dir", default=os.path.join(REPO, "bench"), help="writes <out-dir>/<card>-peers.json")
    p.add_argument("--out", help="the report's path (overrides --out-dir)")
    p.add_argument("--max-seconds", type=float, help="start no case after this many seconds")
    p.add_argument("--seed", type=int, default=21)
    p.add_argument("--no-humming", action="store_true", help="skip Humming")
    p.add_argument(
        "--humming-default-path",
        action="store_true",
        help="let Humming compile every M interval per shape (about 30 kernels each) instead of the one each case runs",
    )
    p.add_argument("--no-torch-peer", action="store_true", help="skip cuBLAS / torch._grouped_mm")
    p.add_argument(
        "--w4a16-plain", action="store_true", help="nvfp4 W4A16 on the weights as they are (default: packed once)"
    )
    p.add_argument("--list", action="store_true", help="print the selected cases and exit")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="merge reports of one card, print the table")
    return p.parse_args(argv)


def selected_cases(args):
    chosen = cases_mod.quick_cases() if args.quick else cases_mod.all_cases()
    chosen = cases_mod.select(chosen, args.only)
    if args.case:
        chosen = [c for c in chosen if any(t in c.key for t in args.case)]
    return chosen


def case_seed(base, case):
    return (base * 1_000_003 + zlib.crc32(case.key.encode())) % (2**31)


def run_merge(args):
    docs = []
    for path in args.merge:
        with open(path) as f:
            docs.append(json.load(f))
    doc = report.merge(docs)
    if args.out:
        report.write(args.out, {k: v for k, v in doc.items() if k != "rows"}, doc["rows"])
    print(report.table(doc["rows"]))


def humming_jobs(chosen, seed_base):
    """Humming's prewarm jobs: {case key: (layer rows, K, experts, M or routed rows)}."""
    jobs = {}
    for case in chosen:
        if case.op == "moe":
            rows = cases_mod.case_routing(case, case_seed(seed_base, case)).rows
            jobs[case.key] = (case.n, case.k, case.experts, rows)
        else:
            jobs[case.key] = (case.weight_rows, case.k, None, case.m)
    return jobs


def humming_status():
    try:
        import humming.layer  # noqa: F401

        from peers.humming_peer import version

        return True, version(), None
    except Exception as exc:  # noqa: BLE001 (no Humming: its columns stay empty, with the reason)
        return False, None, f"{type(exc).__name__}: {exc}"


def main(argv=None):
    args = parse_args(argv)
    if args.merge:
        return run_merge(args)
    chosen = selected_cases(args)
    if args.list:
        for c in chosen:
            print(c.key)
        return 0

    import torch
    import triton

    import nvfp4
    from peers.run_case import measure

    t0 = time.time()
    dtype = getattr(torch, args.dtype)
    props = torch.cuda.get_device_properties(0)
    name = torch.cuda.get_device_name(0)
    card = report.card_name(name)
    path = args.out or report.default_path(args.out_dir, card)
    hum_ok, hum_version, hum_error = (False, None, "--no-humming") if args.no_humming else humming_status()
    from peers import impls

    impls.W4A16_PACKED = not args.w4a16_plain
    meta = {
        "card": card,
        "device": name,
        "sms": props.multi_processor_count,
        "l2_bytes": props.L2_cache_size,
        "dtype": args.dtype,
        "w4a16_weights": "packed" if impls.W4A16_PACKED else "plain",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "nvfp4": getattr(nvfp4, "__version__", None),
        "humming": hum_version,
        "humming_error": hum_error,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "protocol": {
            "graph": "calls over rotating weight sets (> 3x L2) captured in one CUDA graph; median replay / calls",
            "eager": f"triton.testing.do_bench, median, rep {args.eager_ms} ms, L2 cleared per rep",
            "graph_replays": args.reps,
        },
        "skipped": [],
    }
    print(f"{name} ({card}), L2 {props.L2_cache_size >> 20} MiB, {len(chosen)} cases -> {path}", flush=True)
    if hum_error:
        print(f"Humming unavailable: {hum_error}", flush=True)
    warm = {}
    if hum_ok and not args.humming_default_path:
        from peers.humming_peer import prewarm

        t1 = time.time()
        print(f"Humming: compiling the kernels of {len(chosen)} cases in parallel", flush=True)
        try:
            warm = prewarm(humming_jobs(chosen, args.seed), dtype)
        except Exception as exc:  # noqa: BLE001 (then each case compiles its own Humming kernel)
            meta["humming_prewarm_error"] = f"{type(exc).__name__}: {exc}"[:500]
            print(f"Humming prewarm failed: {meta['humming_prewarm_error']}", flush=True)
        failed = {k: e for k, (_, e) in warm.items() if e}
        meta["humming_prewarm_s"] = round(time.time() - t1, 1)
        print(f"Humming: {meta['humming_prewarm_s']} s, {len(failed)} failed", flush=True)
        for k, e in failed.items():
            print(f"  {k}: {e}", flush=True)
    rows = []
    for i, case in enumerate(chosen):
        if args.max_seconds is not None and time.time() - t0 > args.max_seconds:
            meta["skipped"] = [c.key for c in chosen[i:]]
            print(f"time budget spent: {len(meta['skipped'])} cases not run", flush=True)
            break
        print(f"[{i + 1}/{len(chosen)}] {case.key} ({time.time() - t0:.0f} s)", flush=True)
        seed = case_seed(args.seed, case)
        try:
            meas, routing = measure(
                case,
                dtype=dtype,
                seed=seed,
                l2_bytes=props.L2_cache_size,
                humming=hum_ok,
                humming_tuning=warm.get(case.key, (None, None))[0],
                humming_error=warm.get(case.key, (None, None))[1],
                torch_peer=not args.no_torch_peer,
                replays=args.reps,
                rep_ms=args.eager_ms,
                log=lambda s: print(s, flush=True),
            )
        except Exception as exc:  # noqa: BLE001 (the case's failure is its rows' record)
            meas = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            routing = cases_mod.case_routing(case, seed) if case.op == "moe" else None
            print(f"  case failed: {meas['error']}", flush=True)
            del exc
            gc.collect()
            try:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            except Exception as sticky:  # noqa: BLE001 (a broken context: nothing after it can run)
                rows += report.make_rows(case, meas, card, routing, args.dtype)
                meta["skipped"] = [c.key for c in chosen[i + 1 :]]
                meta["aborted"] = f"CUDA context unusable after {case.key}: {sticky}"[:500]
                report.write(path, meta, rows)
                print(meta["aborted"], flush=True)
                break
        rows += report.make_rows(case, meas, card, routing, args.dtype)
        meta["seconds"] = round(time.time() - t0, 1)
        report.write(path, meta, rows)
    print(report.table(rows), flush=True)
    print(f"wrote {path} ({len(rows)} rows, {time.time() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
