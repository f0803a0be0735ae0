"""``nvfp4.torch.ExpertParallelMoE``: ``nvfp4.torch.MoE`` with its experts split over the ranks of a
``torch.distributed`` process group (expert parallelism), results equal to the one ``MoE`` holding
every expert (bit for bit on the CPU backend; on the GPU see below).

Layout: E experts over W ranks (W must divide E); rank r holds the contiguous block of experts
``r*E/W .. (r+1)*E/W - 1`` as a ``MoE`` of its own (``local``). Each rank calls the layer with its
own tokens (``hidden_states`` [T, H], ``top_k_index`` and ``top_k_weights`` [T, k], global expert
ids) and gets its own tokens' outputs [T, H]. Every rank of the group must call it the same number
of times, in the same order, with the same dtype, H and mode (it is a collective).

One call:

1. each (token, slot) pair is given to the rank holding its expert (an id >= E goes to none and
   contributes nothing, as in ``MoE``); the pairs are sorted by that rank (stably);
2. dispatch: each pair's row goes to its rank with one ``all_to_all_single`` of bytes: the token
   (W4A16: its float16/bfloat16 values; W4A4: its NVFP4 values and scales, quantized once on the
   sending rank as ``MoE`` does, 9/32 of the bf16 bytes) followed by the 4 bytes of the expert's
   local id;
3. the receiving rank runs the rows it got through its local experts as ``MoE.forward`` does
   (stable sort by local expert, ``torch.ops.nvfp4.grouped_gemm_moe`` for gate/up, SwiGLU, down:
   ``MoE._experts``), with one difference in W4A4 on CUDA: ``MoE.forward`` gives gate/up the
   tokens' quantization written back as 16-bit numbers (the W4A16 kernels), while here gate/up
   takes the received NVFP4 rows (the NVFP4 x NVFP4 kernels): the same products, summed in another
   float32 order;
4. return: the result rows go back by a second ``all_to_all_single`` to the ranks they came from,
   are put back in (token, slot) order and combined with the router weights (``moe.combine``:
   float32, slot order, one rounding).

Each step computes a row from that row alone, and the combine is ``MoE``'s, so the outputs are
``MoE``'s bits whatever the split and whatever the other ranks' tokens, with one limit on the GPU:
there the grouped GEMM shares its tiles and k-steps among its CTAs over the whole launch and picks
its tile from the launch's row count, so where its float32 sums round, a row's last bits follow
the rows it is launched with (the one-GPU layer's outputs for a token likewise depend on the batch
it came in).
A rank's launch holds other rows than the one-GPU layer's (and, in W4A4, another gate/up kernel),
so on the GPU the outputs are its bits where the sums are exact in float32
(``tests_gpu/test_ep_gpu``'s exact-tier data) and otherwise within the roundings' own tolerance
(each of the three roundings at most one ulp apart). On the CPU backend (exact sums, one
rounding) they are always its bits (``tests/test_moe_ep``).

Two forms, chosen by ``capacity``:

- ``capacity=None`` (the variable form): the ranks first exchange how many rows each sends to
  each (one small all-to-all), and the dispatch moves exactly those rows. Any T per rank (0
  included). The counts are read on the host (one synchronization per call), so this form cannot
  be captured in a CUDA graph; it moves the fewest bytes: prefill.
- ``capacity="worst"`` or an int C >= 1 (the capacity form): every rank sends every rank exactly C
  rows (padding rows carry a local id past the last expert: the grouped GEMM computes nothing for
  them), so both all-to-alls have equal splits and fixed shapes and nothing waits on the host: a
  decode step can be captured in a CUDA graph. ``"worst"`` is C = T * k (the call's own T and k),
  which a rank can never exceed: no pair is ever left out. A smaller C moves fewer bytes, and a
  rank whose tokens send more than C rows to one rank cannot send the rest; those pairs are
  counted on the device (``overflow_count()``, ``reset_overflow()``; reading it synchronizes) and,
  by default (``overflow="nan"``), their tokens' outputs are NaN, so that no wrong result passes
  unseen; ``overflow="drop"`` instead leaves them out of the sum (as an expert held nowhere: the
  capacity-factor policy of GShard-style training), still counted. Every rank must use the same
  C: with ``"worst"``, the same T and k on every rank.

Build it from a full ``MoE`` (``ExpertParallelMoE.from_moe(moe, group)``: this rank's experts are
copied out of it) or, the usual case, from a ``MoE`` built from this rank's experts only
(``ExpertParallelMoE(local, num_experts, group)``: each rank loads only its weights).

Ids: ``top_k_index`` holds global ids in [0, E) or >= E (left out); negative ids are outside the
contract (as in ``MoE``, where they would count as expert 0, and here the same).
"""

import numbers

import torch

from .moe import MoE, check_tokens, combine, route

OVERFLOW = ("nan", "drop")


def _all_to_all(output, input, output_split_sizes=None, input_split_sizes=None, group=None):
    """``torch.distributed.all_to_all_single``, the one place the layer calls it (a bench can wrap
    it to time the exchanges)."""
    torch.distributed.all_to_all_single(output, input, output_split_sizes, input_split_sizes, group=group)


def _place(group):
    """This process's rank in ``group`` and the group's size, checked: an initialized group that
    holds this process."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            "ExpertParallelMoE needs an initialized torch.distributed process group "
            "(torch.distributed.init_process_group)"
        )
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of the given process group")
    return rank, dist.get_world_size(group)


class ExpertParallelMoE(torch.nn.Module):
    """The experts of a ``MoE`` split over the ranks of ``group`` (see the module docstring).

    - ``local``: this rank's experts, a ``MoE`` of E/W experts (ids ``rank*E/W ..``);
    - ``num_experts``: E, the experts of the whole layer;
    - ``group``: the process group (default: the default group), initialized;
    - ``capacity``: ``None`` (the variable form), ``"worst"`` (C = T * k) or an int >= 1: rows per
      (sending rank, receiving rank) pair in the capacity form;
    - ``overflow``: ``"nan"`` (default) or ``"drop"``, what a pair past the capacity gives.

    ``forward(hidden_states, top_k_index, top_k_weights)`` as ``MoE.forward``, on this rank's
    tokens.
    """

    def __init__(self, local, num_experts, group=None, capacity=None, overflow="nan"):
        super().__init__()
        if not isinstance(local, MoE):
            raise TypeError(f"local must be an nvfp4.torch.MoE (this rank's experts), got {type(local).__name__}")
        rank, world = _place(group)
        if isinstance(num_experts, bool) or not isinstance(num_experts, numbers.Integral) or num_experts < 1:
            raise TypeError(f"num_experts must be a positive int, got {num_experts!r}")
        if num_experts % world:
            raise ValueError(f"{num_experts} experts do not split evenly over {world} ranks")
        per_rank = int(num_experts) // world
        if local.num_experts != per_rank:
            raise ValueError(
                f"local holds {local.num_experts} experts; {num_experts} experts over {world} ranks "
                f"are {per_rank} per rank"
            )
        if capacity is not None and capacity != "worst":
            if isinstance(capacity, bool) or not isinstance(capacity, numbers.Integral):
                raise TypeError(f'capacity must be None, "worst" or an int, got {capacity!r}')
            if capacity < 1:
                raise ValueError(f"capacity must be >= 1 row, got {capacity}")
        if overflow not in OVERFLOW:
            raise ValueError(f'overflow must be "nan" or "drop", got {overflow!r}')
        self.local = local
        self.group, self.world, self.rank = group, world, rank
        self.num_experts, self.experts_per_rank = int(num_experts), per_rank
        self.capacity = capacity if capacity in (None, "worst") else int(capacity)
        self.overflow = overflow
        dev = local.expert_ids.device
        self.register_buffer("rank_ids", torch.arange(world, device=dev), persistent=False)
        # (token, slot) pairs this rank could not send for the capacity, since the last reset.
        self.register_buffer("overflowed", torch.zeros((), dtype=torch.int64, device=dev), persistent=False)

    @classmethod
    def from_moe(cls, moe, group=None, capacity=None, overflow="nan"):
        """This rank's block of ``moe``'s experts (copied out: ``moe`` can then be freed), split
        over ``group``."""
        if not isinstance(moe, MoE):
            raise TypeError(f"moe must be an nvfp4.torch.MoE, got {type(moe).__name__}")
        rank, world = _place(group)
        if moe.num_experts % world:
            raise ValueError(f"{moe.num_experts} experts do not split evenly over {world} ranks")
        per = moe.num_experts // world
        local = moe._slice(rank * per, (rank + 1) * per)
        return cls(local, moe.num_experts, group=group, capacity=capacity, overflow=overflow)

    def extra_repr(self):
        return (
            f"num_experts={self.num_experts}, rank={self.rank}, world={self.world}, "
            f"capacity={self.capacity!r}, overflow={self.overflow!r}"
        )

    def overflow_count(self):
        """How many of this rank's (token, slot) pairs were past the capacity since the last
        ``reset_overflow()`` (0 in the variable form and with ``"worst"``). Reads the device."""
        return int(self.overflowed)

    def reset_overflow(self):
        self.overflowed.zero_()

    def _payload(self, x):
        """Each token's bytes as sent: [T, B] uint8 (W4A16: its 2H bytes; W4A4: H/2 value bytes
        then H/16 scale bytes, quantized here once per token)."""
        if x.shape[0] == 0:
            per = 2 * x.shape[1] if self.local.mode == "w4a16" else x.shape[1] // 2 + x.shape[1] // 16
            return x.new_empty((0, per), dtype=torch.uint8)
        xq, sq = self.local._activations(x)
        if sq is None:
            return xq.view(torch.uint8)
        return torch.cat([xq, sq], dim=1)

    def _compute(self, recv, width, x_dtype, dtype):
        """The rows this rank received ([N, width + 4] bytes: payload, local expert id) through
        its experts, as ``MoE.forward`` runs them: [N, H] in ``dtype``, in the order received;
        zero for padding rows (local id E/W)."""
        local = self.local
        lid = recv[:, width:].contiguous().view(torch.int32).reshape(-1)
        order, offsets = route(lid, local.expert_ids)
        if local.mode == "w4a16":
            xa, sa = recv[:, :width].view(x_dtype).index_select(0, order), None
        else:
            half = local.hidden_size // 2
            xa = recv[:, :half].index_select(0, order)
            sa = recv[:, half:width].index_select(0, order)
        y = local._experts(xa, sa, offsets, dtype)
        return torch.empty_like(y).index_copy_(0, order, y)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        local = self.local
        x = check_tokens(hidden_states, local.hidden_size)
        t, h = x.shape
        if top_k_index.dim() != 2 or top_k_index.shape[0] != t:
            raise ValueError(f"top_k_index must be [T, k] = [{t}, k], got shape {list(top_k_index.shape)}")
        if top_k_weights.shape != top_k_index.shape:
            raise ValueError(
                f"top_k_weights must have top_k_index's shape {list(top_k_index.shape)}, "
                f"got {list(top_k_weights.shape)}"
            )
        k = top_k_index.shape[1]
        dtype = local.out_dtype or x.dtype
        world, per = self.world, self.experts_per_rank

        # 1. Each pair's rank (world: none) and its expert's id on that rank; pairs sorted by rank.
        ids = top_k_index.reshape(-1).clamp(0, self.num_experts)
        dest = torch.div(ids, per, rounding_mode="floor")
        lid = (ids - dest * per).to(torch.int32)
        sorted_dest, order = torch.sort(dest, stable=True)
        ends = torch.searchsorted(sorted_dest, self.rank_ids.to(sorted_dest.dtype), right=True)
        payload = self._payload(x)
        width = payload.shape[1]
        rows = torch.cat(
            [
                payload.index_select(0, torch.div(order, k, rounding_mode="floor")),
                lid.index_select(0, order).view(torch.uint8).view(-1, 4),
            ],
            dim=1,
        )
        if self.capacity is None:
            back = self._variable(rows, ends, width, x.dtype, dtype, h)
        else:
            back = self._fixed(rows, sorted_dest, ends, t * k, width, x.dtype, dtype, h)
        # 4. (token, slot) order, then MoE's combine.
        out = torch.empty_like(back).index_copy_(0, order, back)
        return combine(out, top_k_weights, t, k, dtype)

    def _variable(self, rows, ends, width, x_dtype, dtype, h):
        """The variable form's exchanges: the result rows of the sorted pairs ([T*k, H]; zero for
        pairs sent nowhere)."""
        counts = torch.diff(ends, prepend=ends.new_zeros(1))
        recv_counts = torch.empty_like(counts)
        _all_to_all(recv_counts, counts, group=self.group)
        both = torch.stack([counts, recv_counts]).tolist()  # the one host synchronization
        send, recv = both
        n_send, n_recv = sum(send), sum(recv)
        got = rows.new_empty((n_recv, rows.shape[1]))
        _all_to_all(got, rows[:n_send], recv, send, group=self.group)
        if n_recv:
            y = self._compute(got, width, x_dtype, dtype)
        else:  # nothing to compute (the grouped GEMM takes no empty operand)
            y = torch.empty((0, h), dtype=dtype, device=rows.device)
        back = torch.zeros((rows.shape[0], h), dtype=dtype, device=rows.device)
        _all_to_all(back[:n_send], y, send, recv, group=self.group)
        return back

    def _fixed(self, rows, sorted_dest, ends, pairs, width, x_dtype, dtype, h):
        """The capacity form's exchanges (fixed shapes, no host synchronization): the result rows
        of the sorted pairs; zero for pairs sent nowhere; NaN (or zero, ``overflow="drop"``) for
        pairs past the capacity, which are counted."""
        world = self.world
        cap = max(1, pairs) if self.capacity == "worst" else self.capacity
        dev = rows.device
        # Each sorted pair's place among those for the same rank; past the capacity: not sent.
        to_rank = sorted_dest < world
        d = sorted_dest.clamp(max=world - 1)
        starts = ends - torch.diff(ends, prepend=ends.new_zeros(1))
        pos = torch.arange(pairs, device=dev) - starts.index_select(0, d)
        sent = to_rank & (pos < cap)
        over = to_rank & (pos >= cap)
        trash, nan_row = world * cap, world * cap + 1
        slot = torch.where(sent, d * cap + pos, trash)
        # The send buffer: C rows per rank, padding rows marked with the local id E/W (computed
        # as no expert's), one more row that catches the pairs not sent.
        buf = torch.zeros((world * cap + 1, rows.shape[1]), dtype=torch.uint8, device=dev)
        pad = torch.full((1,), self.experts_per_rank, dtype=torch.int32, device=dev).view(torch.uint8)
        buf[:, width:] = pad
        buf.index_copy_(0, slot, rows)
        got = torch.empty((world * cap, rows.shape[1]), dtype=torch.uint8, device=dev)
        _all_to_all(got, buf[: world * cap], group=self.group)
        y = self._compute(got, width, x_dtype, dtype)
        back = torch.empty((world * cap + 2, h), dtype=dtype, device=dev)
        _all_to_all(back[: world * cap], y, group=self.group)
        back[trash].zero_()
        back[nan_row].fill_(float("nan") if self.overflow == "nan" else 0.0)
        self.overflowed.add_(over.sum())
        return back.index_select(0, torch.where(sent, slot, torch.where(over, nan_row, trash)))
