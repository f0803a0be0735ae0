"""NumPy reference for the tests: decode NVFP4 exactly, multiply in float64, round once."""

import numpy as np

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


def e4m3_table():
    t = np.zeros(256)
    for c in range(256):
        e, m = (c >> 3) & 15, c & 7
        if e == 15 and m == 7:
            v = np.nan
        elif e == 0:
            v = m / 8 * 2.0**-6
        else:
            v = (1 + m / 8) * 2.0 ** (e - 7)
        t[c] = -v if c & 0x80 else v
    return t


E4M3 = e4m3_table()
CODE = {0.0: 0x00, 0.5: 0x30, 1.0: 0x38, 2.0: 0x40, 3.0: 0x44}


def decode(values, scales):
    """[.., rows, K/2] u8 + plain [.., rows, K/16] -> float64 [.., rows, K]."""
    v = np.asarray(values, dtype=np.uint8)
    codes = np.stack([v & 15, v >> 4], axis=-1).reshape(v.shape[:-1] + (v.shape[-1] * 2,))
    x = E2M1[codes]
    s = np.repeat(E4M3[np.asarray(scales, dtype=np.uint8)], 16, axis=-1)
    return x * s


def to_blocked(plain):
    """Plain scales [L, rows, K/16] -> blocked [L, R, C, 512] (padding zero), SPEC §2."""
    l, rows, cols = plain.shape
    r, c = -(-rows // 128), -(-cols // 4)
    out = np.zeros(l * r * c * 512, dtype=np.uint8)
    i, j = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    for b in range(l):
        off = b * r * c * 512 + (i // 128) * c * 512 + (j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4
        out[off.ravel()] = plain[b].ravel()
    return out.reshape(l, r, c, 512)


def gemm_ref(a, sfa, b, sfb, alpha=1.0):
    da, db = decode(a, sfa), decode(b, sfb)
    return (np.matmul(da, np.swapaxes(db, -1, -2)) * alpha).astype(np.float16)


def dual_ref(a, sfa, b1, sfb1, b2, sfb2, alpha=1.0):
    da = decode(a, sfa)
    x1 = np.matmul(da, np.swapaxes(decode(b1, sfb1), -1, -2)).astype(np.float32) * np.float32(alpha)
    x2 = np.matmul(da, np.swapaxes(decode(b2, sfb2), -1, -2)).astype(np.float32) * np.float32(alpha)
    return (x1 / (1 + np.exp(-x1.astype(np.float64))) * x2).astype(np.float16)


def operand(rng, l, rows, k, scale_values=(0.0, 1.0, 2.0, 3.0), byte_max=256):
    """GEMM-generator data (SPEC §5): every byte, scales from a small set: exact sums."""
    values = rng.integers(0, byte_max, size=(l, rows, k // 2), dtype=np.uint8)
    codes = np.array([CODE[s] for s in scale_values], dtype=np.uint8)
    scales = codes[rng.integers(0, len(codes), size=(l, rows, k // 16))]
    return values, scales


def within_tolerance(got, ref):
    got, ref = got.astype(np.float64), ref.astype(np.float64)
    return bool(np.all((np.abs(got - ref) <= 1e-3 + 1e-3 * np.abs(ref)) | (np.isnan(got) & np.isnan(ref))))


def bf16_bits(x):
    """float64 -> bfloat16 bits (uint16), rounded once to nearest even: to float32 rounded to odd
    (keeps the sticky bit), then float32 -> bfloat16 to nearest even on the bits. Finite inputs."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore"):
        y = x.astype(np.float32)
    t = y.view(np.uint32).copy()
    inexact = y.astype(np.float64) != x
    away = inexact & (np.abs(y.astype(np.float64)) > np.abs(x))
    t[away] -= 1
    t[inexact] |= 1
    t = t.astype(np.uint64)
    return ((t + 0x7FFF + ((t >> 16) & 1)) >> 16).astype(np.uint16)


# ---- W4A16 (SPEC §8): dense 16-bit activations --------------------------------------------------

LEVELS = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 1.5, -1.5, 2.0, -2.0])


def activation(rng, shape, exps=(-2, -1, 0, 1)):
    """Exact-tier activations, float64: {0, ±0.5, ±1, ±1.5, ±2} times a power of two, exact in
    float16 and bfloat16, so that every product with a weight value and every sum of them is
    exact in float64 (and float32 for the sizes the tests use)."""
    return LEVELS[rng.integers(0, len(LEVELS), shape)] * 2.0 ** rng.choice(exps, shape)


def round_bits(x64, dtype):
    """float64 -> the bits (uint16) of float16 or bfloat16, rounded once to nearest even."""
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return np.asarray(x64, np.float64).astype(np.float16).view(np.uint16)
    return bf16_bits(x64)


def gemm16_ref(x64, w, sfw, alpha=1.0):
    """W4A16 GEMM in float64: x [.., M, K] times the decoded weight [.., N, K] transposed, times
    alpha as the kernels take it (float32)."""
    return np.matmul(x64, np.swapaxes(decode(w, sfw), -1, -2)) * np.float64(np.float32(alpha))


def dual16_gate(x64, w1, s1, w2, s2, alpha=1.0):
    """The W4A16 dual GEMM as SPEC §3 computes it: both products times alpha rounded to float32,
    the gate in float32; as float64."""
    x1 = gemm16_ref(x64, w1, s1, alpha).astype(np.float32)
    x2 = gemm16_ref(x64, w2, s2, alpha).astype(np.float32)
    with np.errstate(over="ignore"):
        return (x1 / (np.float32(1) + np.exp(-x1)) * x2).astype(np.float64)
