"""One case from operands to measurements (torch): build the operands and the implementations,
run each once and check its output against the float64 reference of its own semantics, time the
ones that passed under both timers, then the row's read ceiling. See report.py for the result."""

import gc

import torch

from peers import impls as impls_mod
from peers import operands, readceil, timing
from peers.cases import case_routing, graph_calls, read_bytes, rotation_sets, weight_set_bytes
from peers.reference import check_dual, check_gemm, check_moe, decode


def _err(exc):
    return f"{type(exc).__name__}: {exc}".strip()[:500]


def _poison_allocator(nbytes, device):
    """Best effort against an output the call leaves partly unwritten: the caching allocator
    hands the block just freed to the next allocation of its size, so fill one with NaN and free
    it before the call (every earlier output stays alive, so none of them can be reused)."""
    if nbytes > 0:
        torch.full((nbytes // 2,), float("nan"), dtype=torch.bfloat16, device=device)


def _tiles(values, scales):
    """W[n0:n1] of an NVFP4 weight [N, K/2] as float64, decoded on demand."""
    return lambda n0, n1: decode(values[n0:n1], scales[n0:n1])


def _check_group(ops, semantics, outputs):
    """Checks ``outputs`` [(name, tensor, profile)] against the reference of ``semantics``."""
    c, ws = ops.case, ops.sets[0]
    if semantics == "w4a16":
        x, alpha = ops.x, ws.glob
    elif semantics == "w4a4":
        x, alpha = decode(*ops.x_q), ops.x_global * ws.glob
    else:
        x, alpha = ops.x, 1.0
    if semantics == "bf16":
        w = ops.bf16_sets[0]
        if c.op == "moe":
            return check_moe(outputs, x, ops.routing.offsets.tolist(), lambda e, a, b: w[e, a:b].double(), alpha, c.n)
        if c.op == "dual":
            return check_dual(outputs, x, lambda a, b: w[0, a:b].double(), lambda a, b: w[1, a:b].double(), alpha, c.n)
        return check_gemm(outputs, x, lambda a, b: w[a:b].double(), alpha, c.n)
    v, s = ws.values, ws.scales
    if c.op == "moe":
        return check_moe(
            outputs, x, ops.routing.offsets.tolist(), lambda e, a, b: decode(v[e, a:b], s[e, a:b]), alpha, c.n
        )
    if c.op == "dual":
        return check_dual(outputs, x, _tiles(v[0], s[0]), _tiles(v[1], s[1]), alpha, c.n)
    return check_gemm(outputs, x, _tiles(v, s), alpha, c.n)


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def run_checks(ops, impls, device):
    """Runs every buildable implementation once on weight set 0 and checks its output; returns
    {name: {"check", "error", "graph_us", "graph_min_us", "eager_us"}} (times not yet taken)."""
    rows = ops.x.shape[0]
    out_bytes = rows * ops.case.n * ops.x.element_size()
    outputs, records = {}, {}
    for impl in impls:
        records[impl.name] = {
            "check": None,
            "error": impl.error,
            "graph_us": None,
            "graph_min_us": None,
            "eager_us": None,
        }
        if impl.make is None:
            continue
        try:
            call = impl.make(0)
            _poison_allocator(out_bytes, device)
            outputs[impl.name] = call()
            _sync(device)
        except Exception as exc:  # noqa: BLE001 (an API the wheel lacks, a peer's refusal: recorded)
            records[impl.name]["error"] = _err(exc)
            outputs.pop(impl.name, None)
            _sync(device)
    for semantics in ("w4a16", "w4a4", "bf16"):
        group = [(i.name, outputs[i.name], i.profile) for i in impls if i.semantics == semantics and i.name in outputs]
        if not group:
            continue
        try:
            for name, result in _check_group(ops, semantics, group).items():
                records[name]["check"] = result
        except Exception as exc:  # noqa: BLE001 (a reference that cannot be computed fails the check)
            for name, _, _ in group:
                records[name]["check"] = {"ok": False, "error": f"reference: {_err(exc)}"}
    return records


def run_timers(impls, records, sets, calls, replays, rep_ms, log):
    """Times, under both timers, every implementation whose check passed."""
    for impl in impls:
        rec = records[impl.name]
        if not (rec["check"] or {}).get("ok"):
            log(f"  {impl.name:18s} not timed: {rec['error'] or rec['check']}")
            continue
        fns = [impl.make(i) for i in range(sets)]
        rec["graph_us"], rec["graph_min_us"], rec["graph_error"] = timing.graph_us(
            [fns[i % sets] for i in range(calls)], replays
        )
        rec["eager_us"], eager_error = timing.eager_us(fns[0], rep_ms)
        if eager_error:
            rec["error"] = f"eager: {eager_error}"
        log(f"  {impl.name:18s} graph {_num(rec['graph_us'])} us  eager {_num(rec['eager_us'])} us")
        del fns
        gc.collect()


def _num(value):
    return "        -" if value is None else f"{value:9.2f}"


def measure(
    case,
    *,
    dtype,
    seed,
    l2_bytes,
    humming=True,
    humming_tuning=None,
    humming_error=None,
    torch_peer=True,
    replays=10,
    rep_ms=100,
    log=print,
):
    """The case's measurements (the dict report.make_rows reads) and its MoE routing."""
    device = "cuda"
    routing = case_routing(case, seed) if case.op == "moe" else None
    sets = rotation_sets(weight_set_bytes(case, routing), l2_bytes)
    calls = graph_calls(sets)
    ops = operands.build(case, sets, dtype, device, seed, peers=torch_peer)
    impls = impls_mod.build(ops, humming, torch_peer, humming_tuning, humming_error)
    records = run_checks(ops, impls, device)
    gc.collect()
    run_timers(impls, records, sets, calls, replays, rep_ms, log)
    read = readceil.measure(read_bytes(case, ops.x.element_size(), routing), sets, calls, replays, rep_ms)
    log(f"  {'read ceiling':18s} graph {_num(read['graph_us'])} us  eager {_num(read['eager_us'])} us")
    meas = {
        "impls": records,
        "read": read,
        "sets": sets,
        "calls": calls,
        "torch_peer": impls_mod.torch_peer_name(case),
        "humming_tuning": humming_tuning,
    }
    del impls, ops
    gc.collect()
    torch.cuda.empty_cache()
    return meas, routing
