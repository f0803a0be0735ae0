"""Float64 references and the elementwise check of every implementation's output (torch).

The NVFP4 decode here is the bench's own (E2M1 table, low nibble = even k; E4M3 through torch's
float8_e4m3fn conversion), not the package's ``dequantize``. References are computed in tiles of
rows and columns, so a Mixtral-sized expert or a 4096-row prefill never needs its whole float64
weight at once; every output of one semantics is checked against the same tile while it exists.
"""

import math

import torch

from peers.tolerance import NORM_LIMIT

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
DECODE_CHUNK = 1 << 24  # elements decoded at once
TILE_N = 8192
TILE_M = 2048
FIRST_BAD = 5


def decode(values, scales, dtype=torch.float64):
    """NVFP4 [.., rows, K/2] values (uint8) and plain [.., rows, K/16] E4M3 scales -> [.., rows, K]
    e2m1 * e4m3 in ``dtype`` (exact in float32 and float64)."""
    v = values.view(torch.uint8)
    s = scales.view(torch.float8_e4m3fn)
    lead, half = tuple(v.shape[:-1]), v.shape[-1]
    v2, s2 = v.reshape(-1, half), s.reshape(-1, half // 8)
    lut = torch.tensor(E2M1, dtype=dtype, device=v.device)
    out = torch.empty((v2.shape[0], 2 * half), dtype=dtype, device=v.device)
    step = max(1, DECODE_CHUNK // (2 * half))
    for r0 in range(0, v2.shape[0], step):
        chunk = v2[r0 : r0 + step]
        codes = torch.stack((chunk & 15, chunk >> 4), dim=-1).reshape(chunk.shape[0], -1).long()
        out[r0 : r0 + step] = lut[codes] * s2[r0 : r0 + step].to(dtype).repeat_interleave(16, dim=-1)
    return out.reshape(lead + (2 * half,))


class Check:
    """Accumulates one output's comparison with its reference over tiles."""

    def __init__(self, name, out, profile):
        self.name, self.out, self.profile = name, out, profile
        self.bad = 0
        self.nonfinite = 0
        self.max_ratio = 0.0
        self.err2 = 0.0
        self.ref2 = 0.0
        self.first = []
        self.shape_error = None

    def update(self, rows, cols, ref, bound):
        """``rows``/``cols``: the tile's slices of the output; ``ref`` and ``bound`` float64."""
        got = self.out[rows, cols].double()
        diff = (got - ref).abs()
        ok = diff <= bound  # NaN and inf fail here
        nbad = int((~ok).sum())
        if nbad:
            if len(self.first) < FIRST_BAD:
                idx = torch.nonzero(~ok)[: FIRST_BAD - len(self.first)].tolist()
                for i, j in idx:
                    g = float(got[i, j])
                    self.first.append(
                        [rows.start + i, cols.start + j, g if math.isfinite(g) else str(g), float(ref[i, j])]
                    )
            self.bad += nbad
        finite = torch.isfinite(diff)
        self.nonfinite += int((~finite).sum())
        if finite.any():
            self.max_ratio = max(self.max_ratio, float((diff[finite] / bound[finite]).max()))
        self.err2 += float(torch.where(finite, diff, torch.zeros_like(diff)).square().sum())
        self.ref2 += float(ref.square().sum())

    def result(self):
        if self.shape_error:
            return {"ok": False, "error": self.shape_error}
        rel = math.sqrt(self.err2 / self.ref2) if self.ref2 > 0 else math.sqrt(self.err2)
        return {
            "ok": self.bad == 0 and rel <= NORM_LIMIT,
            "bad": self.bad,
            "nonfinite": self.nonfinite,
            "max_ratio": round(self.max_ratio, 4),  # over the finite elements; <= 1 passes
            "rel_rms": float(f"{rel:.3g}"),
            "first_bad": self.first,
            "tolerance": {"splits": self.profile.splits, "rounds_halves": self.profile.rounds_halves},
        }


def _checks(outputs, shape):
    """Check objects for (name, tensor, profile) triples; a wrong shape fails at once."""
    checks = []
    for name, out, profile in outputs:
        c = Check(name, out, profile)
        if tuple(out.shape) != tuple(shape):
            c.shape_error = f"output shape {list(out.shape)}, expected {list(shape)}"
        checks.append(c)
    return checks


def check_gemm(outputs, x, w_tiles, alpha, n):
    """Checks outputs [M, N] of x [M, K] @ W^T * alpha. ``w_tiles(n0, n1)`` returns the float64
    W[n0:n1] (decoded on demand). ``x``: any float tensor (exact in float64)."""
    m = x.shape[0]
    checks = _checks(outputs, (m, n))
    live = [c for c in checks if c.shape_error is None]
    if live:
        for n0 in range(0, n, TILE_N):
            w = w_tiles(n0, min(n, n0 + TILE_N))
            w_abs = w.abs()
            cols = slice(n0, n0 + w.shape[0])
            for m0 in range(0, m, TILE_M):
                xs = x[m0 : m0 + TILE_M].double()
                ref = (xs @ w.T) * alpha
                s = (xs.abs() @ w_abs.T) * abs(alpha)
                rows = slice(m0, m0 + xs.shape[0])
                for c in live:
                    c.update(rows, cols, ref, c.profile.gemm_bound(ref.abs(), s))
    return {c.name: c.result() for c in checks}


def check_dual(outputs, x, w1_tiles, w2_tiles, alpha, n):
    """Checks outputs [M, N] of silu(x @ W1^T * alpha) * (x @ W2^T * alpha)."""
    m = x.shape[0]
    checks = _checks(outputs, (m, n))
    live = [c for c in checks if c.shape_error is None]
    if live:
        for n0 in range(0, n, TILE_N):
            n1 = min(n, n0 + TILE_N)
            w1, w2 = w1_tiles(n0, n1), w2_tiles(n0, n1)
            cols = slice(n0, n1)
            for m0 in range(0, m, TILE_M):
                xs = x[m0 : m0 + TILE_M].double()
                xa = xs.abs()
                x1, x2 = (xs @ w1.T) * alpha, (xs @ w2.T) * alpha
                s1, s2 = (xa @ w1.abs().T) * abs(alpha), (xa @ w2.abs().T) * abs(alpha)
                silu1 = x1 * torch.sigmoid(x1)
                ref = silu1 * x2
                rows = slice(m0, m0 + xs.shape[0])
                for c in live:
                    bound = c.profile.dual_bound(ref.abs(), x1.abs(), x2.abs(), silu1.abs(), s1, s2)
                    c.update(rows, cols, ref, bound)
    return {c.name: c.result() for c in checks}


def check_moe(outputs, x, offsets, w_tiles, alpha, n):
    """Checks outputs [rows, N] of the MoE form: rows offsets[e-1]:offsets[e] of x times expert
    e's W^T. ``w_tiles(e, n0, n1)`` returns expert e's float64 W[n0:n1]; ``offsets`` a list."""
    rows_total = x.shape[0]
    checks = _checks(outputs, (rows_total, n))
    live = [c for c in checks if c.shape_error is None]
    start = 0
    for e, end in enumerate(offsets):
        if end > start and live:
            for n0 in range(0, n, TILE_N):
                w = w_tiles(e, n0, min(n, n0 + TILE_N))
                w_abs = w.abs()
                cols = slice(n0, n0 + w.shape[0])
                for m0 in range(start, end, TILE_M):
                    m1 = min(end, m0 + TILE_M)
                    xs = x[m0:m1].double()
                    ref = (xs @ w.T) * alpha
                    s = (xs.abs() @ w_abs.T) * abs(alpha)
                    for c in live:
                        c.update(slice(m0, m1), cols, ref, c.profile.gemm_bound(ref.abs(), s))
        start = end
    return {c.name: c.result() for c in checks}
