"""The peer bench's report: one row per (case, mode) from a case's measurements, the JSON file
(rewritten after every case, so a run cut short keeps what it measured), merging the files of
several runs, and the printed table. Pure (no torch).

A case's measurements (``run_case.measure``) are a dict: ``impls`` maps an implementation's name
to {"check": {...} or None, "graph_us", "graph_min_us", "eager_us", "error", "graph_error"}
(missing numbers are None, with the reason in "error"/"graph_error"), ``read`` holds the read
ceiling's {"graph_us", "eager_us", "bytes", "config"}, ``sets``/``calls`` the graph protocol's
weight sets and captured calls, and ``error`` what stopped the case before anything ran.
"""

import json
import os
import re

# Implementation names (keys of ``impls``).
NVFP4_W4A16 = "nvfp4_w4a16"
NVFP4_W4A4 = "nvfp4_w4a4"  # the call as a user makes it: quantize the activations, then the GEMM
NVFP4_W4A4_KERNEL = "nvfp4_w4a4_kernel"  # the GEMM alone, on activations quantized beforehand
HUMMING = "humming"
TORCH = "torch"  # cuBLAS BF16 (dense) or torch._grouped_mm BF16 (MoE), on dequantized weights

MODES = ("w4a16", "w4a4")


def card_name(device_name):
    """H100 or H200 (the lent GPU may be either), else the device name made file-safe."""
    upper = device_name.upper()
    for card in ("H200", "H100", "H800", "H20"):
        if card in upper:
            return card
    return re.sub(r"[^A-Za-z0-9]+", "-", device_name).strip("-") or "unknown"


def default_path(out_dir, card):
    return os.path.join(out_dir, f"{card}-peers.json")


def _ratio(num, den):
    if num is None or den is None or den <= 0:
        return None
    return round(num / den, 4)


def _us(value):
    return None if value is None else round(value, 3)


def case_fields(case, routing=None):
    """The case's identity: op, shape, and for MoE the model, phase, projection and routing."""
    fields = {"op": case.op, "case": case.key}
    if case.op == "moe":
        fields.update(
            model=case.model.name,
            phase=case.phase,
            proj=case.proj,
            tokens=case.tokens,
            top_k=case.model.top_k,
            experts=case.experts,
            experts_total=case.model.experts_total,
            rows=routing.rows,
            experts_active=routing.active,
            experts_empty=case.experts - routing.active,
            experts_forced_empty=list(routing.forced_empty),
        )
    else:
        fields.update(m=case.m, source=case.source)
    fields.update(n=case.n, k=case.k)
    return fields


def make_rows(case, meas, card, routing=None, dtype="bfloat16"):
    """The two rows (W4A16, W4A4) of one case. Times are µs per call: ``*_us`` under the graph
    protocol, ``*_eager_us`` one eager call per rep. W4A4 rows: ``nvfp4_us`` is the user's call
    (activation quantization included), ``nvfp4_kernel_us`` the GEMM alone; Humming and the torch
    peer have no NVFP4-activation path on Hopper, so their W4A16 times stand beside it."""
    impls = meas.get("impls", {})
    read = meas.get("read", {})
    hum = impls.get(HUMMING, {})
    peer = impls.get(TORCH, {})
    rows = []
    for mode in MODES:
        nv = impls.get(NVFP4_W4A16 if mode == "w4a16" else NVFP4_W4A4, {})
        row = {**case_fields(case, routing), "mode": mode, "dtype": dtype, "card": card}
        row.update(
            nvfp4_us=_us(nv.get("graph_us")),
            humming_us=_us(hum.get("graph_us")),
            speedup_vs_humming=_ratio(hum.get("graph_us"), nv.get("graph_us")),
            nvfp4_eager_us=_us(nv.get("eager_us")),
            humming_eager_us=_us(hum.get("eager_us")),
            eager_speedup_vs_humming=_ratio(hum.get("eager_us"), nv.get("eager_us")),
            read_us=_us(read.get("graph_us")),
            read_eager_us=_us(read.get("eager_us")),
            read_fraction=_ratio(read.get("graph_us"), nv.get("graph_us")),
            read_eager_fraction=_ratio(read.get("eager_us"), nv.get("eager_us")),
            read_bytes=read.get("bytes"),
            torch_peer=meas.get("torch_peer"),
            torch_us=_us(peer.get("graph_us")),
            torch_eager_us=_us(peer.get("eager_us")),
            speedup_vs_torch=_ratio(peer.get("graph_us"), nv.get("graph_us")),
        )
        if mode == "w4a4":
            kern = impls.get(NVFP4_W4A4_KERNEL, {})
            row.update(
                nvfp4_kernel_us=_us(kern.get("graph_us")),
                nvfp4_kernel_eager_us=_us(kern.get("eager_us")),
                humming_mode="w4a16",
            )
        names = [NVFP4_W4A16, HUMMING, TORCH] if mode == "w4a16" else [NVFP4_W4A4, NVFP4_W4A4_KERNEL, HUMMING, TORCH]
        row["checks"] = {name: impls.get(name, {}).get("check") for name in names}
        row["errors"] = {
            f"{name}{suffix}": impls[name][key]
            for name in names
            if name in impls
            for key, suffix in (("error", ""), ("graph_error", " (graph)"))
            if impls[name].get(key)
        }
        if read.get("error"):
            row["errors"]["read"] = read["error"]
        if meas.get("error"):
            row["errors"]["case"] = meas["error"]
        row.update(sets=meas.get("sets"), graph_calls=meas.get("calls"), read_config=read.get("config"))
        row["humming_tuning"] = meas.get("humming_tuning")
        rows.append(row)
    return rows


def row_key(row):
    return (row["case"], row["mode"], row.get("dtype"))


def document(meta, rows):
    return {**meta, "rows": rows}


def write(path, meta, rows):
    """Writes the report atomically (a temporary file renamed over ``path``)."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(document(meta, rows), f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def merge(docs):
    """One report from several of the same card (later rows replace earlier ones of the same case
    and mode); the meta of the last, with every run's meta under "runs" (a merged report's own
    runs kept, not collapsed into its last)."""
    cards = {d.get("card") for d in docs}
    if len(cards) != 1:
        raise ValueError(f"cannot merge reports of different cards: {sorted(map(str, cards))}")
    rows = {}
    for d in docs:
        for r in d["rows"]:
            rows[row_key(r)] = r
    meta = {k: v for k, v in docs[-1].items() if k not in ("rows", "runs")}
    meta["runs"] = [
        run for d in docs for run in (d.get("runs") or [{k: v for k, v in d.items() if k not in ("rows", "runs")}])
    ]
    return document(meta, list(rows.values()))


def _shape(row):
    if row["op"] == "moe":
        return f"{row['model']} {row['phase']} {row['proj']} rows={row['rows']} E={row['experts']}"
    return f"{row['source']} m={row['m']}"


def _fmt(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}"


def table(rows):
    """A Markdown table: one line per row, graph protocol first, eager after."""
    head = (
        "| op | shape | n | k | mode | nvfp4 µs | Humming µs | vs Humming | torch µs | read % "
        "| eager nvfp4 µs | eager Humming µs | eager vs Humming | checks |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        nv = r["nvfp4_us"]
        if r["mode"] == "w4a4" and r.get("nvfp4_kernel_us") is not None:
            nv_text = f"{_fmt(nv)} ({_fmt(r['nvfp4_kernel_us'])} kernel)"
        else:
            nv_text = _fmt(nv)
        bad = [name for name, c in (r.get("checks") or {}).items() if c is not None and not c.get("ok")]
        missing = [name for name, c in (r.get("checks") or {}).items() if c is None]
        checks = (
            "ok" if not bad and not missing else " ".join([f"FAIL:{n}" for n in bad] + [f"none:{n}" for n in missing])
        )
        read_pct = None if r["read_fraction"] is None else 100 * r["read_fraction"]
        lines.append(
            f"| {r['op']} | {_shape(r)} | {r['n']} | {r['k']} | {r['mode']} | {nv_text} | {_fmt(r['humming_us'])} "
            f"| {_fmt(r['speedup_vs_humming'], 2)} | {_fmt(r['torch_us'])} | {_fmt(read_pct, 0)} "
            f"| {_fmt(r['nvfp4_eager_us'])} | {_fmt(r['humming_eager_us'])} | {_fmt(r['eager_speedup_vs_humming'], 2)} "
            f"| {checks} |"
        )
    return "\n".join(lines)
