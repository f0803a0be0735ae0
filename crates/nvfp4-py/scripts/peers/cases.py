"""The peer bench's cases (SPEC §9), their MoE routing and their byte counts. Pure: NumPy only,
no torch, so the CPU tests read it as the GPU run does.

Dense (op "linear"): N = K = 8192 at M in {1, 4, 16, 32, 64, 128, 256, 1024, 4096}, and the contest
GEMM shapes N x K = 7168x16384, 4096x7168, 7168x2048 at M in {1, 16, 128}.

Gated dual (op "dual"): the SwiGLU gate/up projection of a dense model, where nvfp4's dual GEMM is
the operation (the peers run one GEMM of N = 2 x intermediate, then silu(gate) * up): Llama-3-70B's
MLP (hidden 8192, intermediate 28672) at M in {1, 16, 128, 1024}.

MoE (op "moe"): the expert projections of public model configurations, tokens sorted by expert
with cumulative offsets, routed by a top-k of random scores; a few experts are kept empty (their
scores set to -inf), the rest are ragged:
  - Mixtral-8x7B: 8 experts, hidden 4096, intermediate 14336, top-2;
  - Qwen3-30B-A3B: 128 experts, hidden 2048, intermediate 768, top-8;
  - DeepSeek-V3, one expert-parallel rank: 32 of its 256 experts, hidden 7168, intermediate 2048,
    top-8 over all 256 (about 1/8 of the routed rows land on the rank),
each at decode (32 tokens: tens to a few hundred routed rows) and prefill (thousands of routed
rows), for the gate/up projection (N = 2 x intermediate, K = hidden) and the down projection
(N = hidden, K = intermediate). And the small decode batches a single user runs: "decode-4" (4
tokens) for every model, "decode-1" (one token) where a token routes at least 2 rows to this GPU
on average (Mixtral, Qwen3; the DeepSeek-V3 rank gets 1/4 row).
"""

from dataclasses import dataclass

import numpy as np

DENSE_SQUARE_M = (1, 4, 16, 32, 64, 128, 256, 1024, 4096)
CONTEST_NK = ((7168, 16384), (4096, 7168), (7168, 2048))
CONTEST_M = (1, 16, 128)
DUAL_M = (1, 16, 128, 1024)
LLAMA70B = {"hidden": 8192, "intermediate": 28672}


@dataclass(frozen=True)
class MoeModel:
    name: str
    experts: int  # experts on this GPU (the rank's, for expert parallelism)
    experts_total: int  # experts the router picks from
    hidden: int
    intermediate: int
    top_k: int
    decode_tokens: int
    prefill_tokens: int


MOE_MODELS = (
    MoeModel("Mixtral-8x7B", 8, 8, 4096, 14336, 2, 32, 4096),
    MoeModel("Qwen3-30B-A3B", 128, 128, 2048, 768, 8, 32, 2048),
    MoeModel("DeepSeek-V3 EP rank", 32, 256, 7168, 2048, 8, 32, 4096),
)


@dataclass(frozen=True)
class Dense:
    """A dense projection: y [M, N] = x [M, K] @ W^T. For op "dual", n is each half's width (the
    intermediate size): nvfp4 reads two weights [n, K], the peers one [2n, K]."""

    op: str  # "linear" or "dual"
    m: int
    n: int
    k: int
    source: str

    @property
    def key(self):
        return f"{self.op} {self.source} m={self.m} n={self.n} k={self.k}"

    @property
    def weight_rows(self):
        return 2 * self.n if self.op == "dual" else self.n


@dataclass(frozen=True)
class Moe:
    """An expert projection of a MoE layer: routed rows [rows, K] sorted by expert, experts'
    weights [E, N, K], E cumulative end offsets."""

    model: MoeModel
    phase: str  # "decode", "decode-1", "decode-4" or "prefill"
    proj: str  # "gate_up" or "down"
    op: str = "moe"

    @property
    def tokens(self):
        small = {"decode-1": 1, "decode-4": 4}
        if self.phase in small:
            return small[self.phase]
        return self.model.decode_tokens if self.phase == "decode" else self.model.prefill_tokens

    @property
    def n(self):
        return 2 * self.model.intermediate if self.proj == "gate_up" else self.model.hidden

    @property
    def k(self):
        return self.model.hidden if self.proj == "gate_up" else self.model.intermediate

    @property
    def experts(self):
        return self.model.experts

    @property
    def weight_rows(self):
        return self.n

    @property
    def empty(self):
        """Experts kept empty on purpose (more may be empty by chance at decode)."""
        return max(1, self.model.experts // 16)

    @property
    def key(self):
        return f"moe {self.model.name} {self.phase} {self.proj} n={self.n} k={self.k}"


def all_cases():
    """Every case, grouped so that cases sharing one weight shape (one Humming kernel set) run
    one after the other."""
    cases = [Dense("linear", m, 8192, 8192, "square") for m in DENSE_SQUARE_M]
    for n, k in CONTEST_NK:
        cases += [Dense("linear", m, n, k, "contest") for m in CONTEST_M]
    cases += [Dense("dual", m, LLAMA70B["intermediate"], LLAMA70B["hidden"], "Llama-3-70B MLP") for m in DUAL_M]
    for model in MOE_MODELS:
        for proj in ("gate_up", "down"):
            cases += [Moe(model, phase, proj) for phase in moe_phases(model)]
    return cases


def moe_phases(model):
    """SPEC §9's decode and prefill, and the small decode batches (see the module's note)."""
    one_token_rows = model.top_k * model.experts / model.experts_total
    return ("decode-1",) * (one_token_rows >= 2) + ("decode-4", "decode", "prefill")


def quick_cases():
    """A few cases that touch every code path (each op, decode and prefill, a contest shape)."""
    keep = {
        "linear square m=1 n=8192 k=8192",
        "linear square m=4096 n=8192 k=8192",
        "linear contest m=16 n=7168 k=16384",
        "dual Llama-3-70B MLP m=16 n=28672 k=8192",
        "moe Mixtral-8x7B decode gate_up n=28672 k=4096",
        "moe Qwen3-30B-A3B prefill down n=2048 k=768",
        "moe DeepSeek-V3 EP rank decode down n=7168 k=2048",
    }
    return [c for c in all_cases() if c.key in keep]


def select(cases, only=None):
    """``only``: "dense" (linear and dual), "linear", "dual" or "moe"."""
    if only is None:
        return list(cases)
    if only == "dense":
        return [c for c in cases if c.op in ("linear", "dual")]
    if only in ("linear", "dual", "moe"):
        return [c for c in cases if c.op == only]
    raise ValueError(f"--only must be dense, linear, dual or moe, got {only!r}")


@dataclass(frozen=True)
class Routing:
    """Routed rows of one MoE layer on this GPU, sorted by expert (then token)."""

    token: np.ndarray  # [rows] int64: the token each routed row reads
    expert: np.ndarray  # [rows] int64, non-decreasing
    counts: np.ndarray  # [E] rows per expert
    offsets: np.ndarray  # [E] int64: cumulative end row of each expert (nvfp4's, torch._grouped_mm's)
    forced_empty: tuple  # experts whose scores were -inf

    @property
    def rows(self):
        return int(self.token.shape[0])

    @property
    def layout(self):
        """Humming's ``expert_layout``: [E + 1] cumulative offsets with a leading 0."""
        return np.concatenate([[0], self.offsets]).astype(np.int64)

    @property
    def active(self):
        """Experts that own at least one row."""
        return int(np.count_nonzero(self.counts))


def route(tokens, experts, experts_total, top_k, empty, seed):
    """Top-k of standard normal scores per token over ``experts_total`` experts, of which this GPU
    holds the first ``experts``; ``empty`` of those get -inf scores (never picked)."""
    if not 0 < top_k <= experts_total - empty or not 0 <= empty <= experts <= experts_total:
        raise ValueError(f"route: top_k={top_k}, empty={empty}, experts={experts} of {experts_total}")
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal((tokens, experts_total))
    forced = np.sort(rng.choice(experts, size=empty, replace=False))
    scores[:, forced] = -np.inf
    picked = np.argpartition(-scores, top_k - 1, axis=1)[:, :top_k]
    token = np.repeat(np.arange(tokens, dtype=np.int64), top_k)
    expert = picked.reshape(-1).astype(np.int64)
    mine = expert < experts
    token, expert = token[mine], expert[mine]
    order = np.lexsort((token, expert))
    token, expert = token[order], expert[order]
    counts = np.bincount(expert, minlength=experts).astype(np.int64)
    return Routing(token, expert, counts, np.cumsum(counts), tuple(int(e) for e in forced))


def case_routing(case, seed):
    m = case.model
    return route(case.tokens, m.experts, m.experts_total, m.top_k, case.empty, seed)


def nvfp4_bytes(rows, k):
    """Packed E2M1 values and E4M3 scales of a [rows, K] NVFP4 tensor."""
    return rows * k // 2 + rows * k // 16


def weight_set_bytes(case, routing=None):
    """NVFP4 weight bytes one call reads: every weight of a dense case, the experts that own rows
    of a MoE case (an empty expert's weights need not be read)."""
    if case.op == "moe":
        return routing.active * nvfp4_bytes(case.n, case.k)
    return nvfp4_bytes(case.weight_rows, case.k)


def activation_rows(case, routing=None):
    return routing.rows if case.op == "moe" else case.m


def read_bytes(case, act_bytes=2, routing=None):
    """The row's input bytes, what its read ceiling reads: the NVFP4 weights the call needs, the
    16-bit activations (both modes' user calls take them) and, for MoE, the int32 offsets."""
    total = weight_set_bytes(case, routing) + activation_rows(case, routing) * case.k * act_bytes
    if case.op == "moe":
        total += 4 * case.experts
    return total


def rotation_sets(set_bytes, l2_bytes):
    """Weight sets for the graph protocol: together more than 3x L2, and at least 2, so that each
    call reads its weights from DRAM."""
    return max(2, 3 * l2_bytes // max(set_bytes, 1) + 1)


def graph_calls(sets, at_least=20):
    """Calls captured in one graph: at least ``at_least``, a multiple of the number of sets."""
    return sets * -(-at_least // sets)
