"""Humming (PyPI ``humming-kernels``), the W4A16 NVFP4 path vLLM takes on sm_90, fed the ModelOpt
tensors of one of our weight sets. What its API is, as read in humming-kernels 0.1.19:

- ``humming.layer.HummingLayer(shape_n=N, shape_k=K, weight_config={"quant_method": "modelopt",
  "quant_algo": "NVFP4"}, num_experts=E or None, torch_dtype=bf16|f16)`` is a dataclass
  ``nn.Module``; its parameters start on the CPU (``.cuda()`` moves them; a stream-K ``locks``
  buffer is made on the current GPU). With no ``input_config`` the activations stay 16-bit in
  ``torch_dtype`` (W4A16) and the output has that type.
- ``load_from_tensors({...})`` is ``load_state_dict(strict=False)`` of the ModelOpt names:
  ``weight`` uint8 [N, K/2] (low nibble = even k), ``weight_scale`` float8_e4m3fn [N, K/16] (plain
  rows, not swizzled), ``weight_scale_2`` float32 [1] (the global scale, multiplied); for MoE each
  with a leading [E] (``weight_scale_2`` [E]). The scales must arrive as float8_e4m3fn: the copy
  into the parameter converts by value.
- ``transform()`` converts them to Humming's own layout on the GPU (the global scale becomes a
  per-tensor FP32 factor applied in the epilogue).
- ``layer(x)``: x [M, K] in ``torch_dtype`` -> [M, N]. MoE: ``layer(x_sorted,
  expert_layout=offsets, compute_config={"gemm_type": "grouped_contiguous"})`` with x_sorted
  [rows, K] sorted by expert and ``expert_layout`` int64 [E + 1] cumulative offsets with a leading 0
  (``top_k`` matters only to the "indexed" form); output [rows, N].
- The first call per layer configuration (N, K, E, dtype) JIT-compiles, through NVRTC
  (``cuda.bindings``) or nvcc, one kernel per M interval of its heuristic, in parallel on every
  CPU; later calls, and other layers of the same configuration, reuse them (in-process cache,
  cubins on disk under ``HUMMING_CACHE_DIR``, default ~/.humming/cache). Each call builds its
  TMA descriptors on the host and launches on the current torch stream with ``cuLaunchKernelEx``
  (programmatic dependent launch where its heuristic says so), allocating the output and a small
  descriptor buffer through torch: capturable in a CUDA graph once warm.
- Split-K/stream-K partials are added in the output type in global memory (see tolerance.py).

Compiling every M interval costs about 30 kernels per configuration (N, K, E) on sm_90, minutes of
NVRTC each: more than a GPU call allows for the bench's 11 configurations. So each case passes
``tuning_config=`` the configuration Humming's own heuristic (``humming.tune.
get_heuristics_config``, the list the default path compiles) gives the interval holding the case's
M (MoE: its routed rows), which is the kernel the default path launches for that M with the same
SM count, and ``prewarm`` compiles those of every selected case at once, in parallel threads, by
one call of each through a layer of zero weights. ``--humming-default-path`` keeps the default.
"""

import os
from concurrent.futures import ThreadPoolExecutor

import torch

WEIGHT_CONFIG = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
MOE_COMPUTE = {"gemm_type": "grouped_contiguous"}


def version():
    try:
        from importlib.metadata import version as v

        return v("humming-kernels")
    except Exception:  # noqa: BLE001 (not installed: reported, not fatal)
        return None


def layer(values, scales, glob, dtype, experts=None):
    """A transformed HummingLayer for NVFP4 values [.., N, K/2] and scales [.., N, K/16]."""
    from humming.layer import HummingLayer

    n, half = values.shape[-2], values.shape[-1]
    lay = HummingLayer(
        shape_n=n,
        shape_k=2 * half,
        weight_config=dict(WEIGHT_CONFIG),
        num_experts=experts,
        torch_dtype=dtype,
    ).cuda()
    g = torch.full((experts or 1,), glob, dtype=torch.float32, device=values.device)
    lay.load_from_tensors(
        {
            "weight": values.view(torch.uint8).contiguous(),
            "weight_scale": scales.view(torch.float8_e4m3fn).contiguous(),
            "weight_scale_2": g,
        }
    )
    lay.transform()
    return lay


def dense_call(lay, x, tuning=None):
    return lambda: lay(x, tuning_config=tuning)


def dual_call(lay, x, n, tuning=None):
    """Humming's GEMM of the stacked [gate; up] weight, then silu(gate) * up in torch."""

    def call():
        y = lay(x, tuning_config=tuning)
        return torch.nn.functional.silu(y[:, :n]) * y[:, n:]

    return call


def moe_call(lay, x_sorted, layout, tuning=None):
    return lambda: lay(x_sorted, expert_layout=layout, compute_config=MOE_COMPUTE, tuning_config=tuning)


def tuning_for(lay, rows, moe):
    """The configuration Humming's heuristic gives the M interval holding ``rows``."""
    from humming.tune import get_heuristics_config

    gemm_type = MOE_COMPUTE["gemm_type"] if moe else "dense"
    intervals = get_heuristics_config(lay.humming_config, gemm_type=gemm_type, device=torch.cuda.current_device())
    for lo, hi, config in intervals:
        if lo < rows <= hi:
            return dict(config)
    raise ValueError(f"no Humming interval holds M = {rows}: {[(lo, hi) for lo, hi, _ in intervals]}")


def zero_layer(n, k, experts, dtype):
    """A transformed layer of zero weights (unit scales): same configuration, no data to make."""
    lead = (experts,) if experts else ()
    values = torch.zeros(lead + (n, k // 2), dtype=torch.uint8, device="cuda")
    scales = torch.full(lead + (n, k // 16), 0x38, dtype=torch.uint8, device="cuda")  # e4m3 1.0
    return layer(values, scales, 1.0, dtype, experts)


def prewarm(jobs, dtype, workers=None):
    """Compiles the kernel of every job at once. ``jobs``: {key: (n, k, experts or None, rows)}
    with n the layer's rows (a dual GEMM's 2 x intermediate). Returns {key: (tuning, error)}."""
    layers, results, calls = {}, {}, {}
    for key, (n, k, experts, rows) in jobs.items():
        shape = (n, k, experts)
        try:
            if shape not in layers:
                layers[shape] = zero_layer(n, k, experts, dtype)
            lay = layers[shape]
            tuning = tuning_for(lay, rows, bool(experts))
            x = torch.zeros((rows, k), dtype=dtype, device="cuda")
            if experts:
                layout = torch.tensor([0] + [rows] * experts, dtype=torch.int64, device="cuda")
                calls[key] = moe_call(lay, x, layout, tuning)
            else:
                calls[key] = dense_call(lay, x, tuning)
            results[key] = (tuning, None)
        except Exception as exc:  # noqa: BLE001 (recorded for the case)
            results[key] = (None, f"prewarm: {type(exc).__name__}: {exc}"[:500])

    def run(key):
        try:
            calls[key]()
        except Exception as exc:  # noqa: BLE001
            results[key] = (None, f"prewarm: {type(exc).__name__}: {exc}"[:500])

    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        list(pool.map(run, list(calls)))
    torch.cuda.synchronize()
    layers.clear()
    calls.clear()
    torch.cuda.empty_cache()
    return results
