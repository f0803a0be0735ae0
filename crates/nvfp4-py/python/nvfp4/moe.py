"""``nvfp4.torch.MoE``: the routed expert FFN of a mixture-of-experts layer (SwiGLU experts) over
NVFP4 expert weights, through the grouped GEMM's MoE form (``torch.ops.nvfp4.grouped_gemm_moe``).

One forward, all on the tensors' device with no host synchronization (so a CUDA graph can capture
it and ``torch.compile`` can trace it):

1. route: the T x k (token, expert) pairs sorted by expert with a stable sort (rows of one expert
   stay in token order); each expert's end row is a ``searchsorted`` of the sorted ids, an int32
   tensor [E] on the device, which only the kernels read;
2. gate/up: one grouped GEMM over the experts' concatenated ``[gate; up]`` weights (N = 2I) with
   each expert's alpha, rounded once to the activation's 16-bit type; then ``silu(gate) * up`` in
   float32, rounded once. Why not the dual GEMM: it has no MoE form (one weight pair per launch),
   and per expert launches would cost E launches and a host-side split. The concatenated form is
   exact up to the same roundings (each GEMM output rounds once; the SwiGLU rounds once), where the
   dual GEMM would keep gate and up in float32 until the SwiGLU: the difference is one bf16/f16
   rounding of gate and up before the SiLU;
3. down: one grouped GEMM of the SwiGLU rows with each expert's alpha;
4. combine: the rows put back in (token, slot) order by the sort's permutation (a copy to unique
   indices: deterministic, no atomics), weighted by the router's weights and summed over the k
   slots in float32 in slot order (one elementwise add per slot, so a token's sum does not depend
   on the batch it came in), then rounded once to the output type.

Each step computes a row from that row alone, which is what lets ``nvfp4.moe_ep`` (the experts
split over the ranks of a process group) give this layer's results bit for bit: always on the CPU
backend; on the GPU wherever the grouped GEMM's float32 sums do not round, since its stream-K
split and tile follow the launch's rows (see ``nvfp4.moe_ep``).

Modes, as ``Linear``: ``"w4a16"`` (the default: the activations stay 16-bit) and ``"w4a4"``
(activations quantized to NVFP4 with the checkpoint's calibrated input scales, one per
projection shared by every expert, as a Blackwell GPU serves a ModelOpt export). Per-expert global
scales (ModelOpt writes one ``weight_scale_2`` per expert) make per-expert alphas: a float32
tensor [E] handed to the grouped GEMM; where every expert's alpha is the same it goes as one
float. On CUDA the W4A4 activations reach the grouped GEMM as ``Linear``'s do: quantized, then
written back as 16-bit numbers for the W4A16 kernels on the packed weights.
"""

import torch

import nvfp4 as _nv
from nvfp4.packed_forms import W4A4_ON_W4A16, PackedForms

MODES = ("w4a16", "w4a4")
_HALF = (torch.float16, torch.bfloat16)


def _alphas(global_scale, input_scale, e, name):
    """Per-expert alphas as float32 [E] (the product taken in float64, then rounded once, as
    ``Linear`` narrows its float alpha), and the one float they all equal, or None."""
    g = torch.as_tensor(global_scale, dtype=torch.float64).reshape(-1)
    if g.numel() == 1:
        g = g.expand(e)
    if g.numel() != e:
        raise ValueError(f"{name}: {g.numel()} global scales for {e} experts")
    if not bool(torch.isfinite(g).all()) or not bool((g > 0).all()):
        raise ValueError(f"{name}: every global scale must be finite and > 0")
    a = g * (1.0 if input_scale is None else float(input_scale))
    a32 = a.to(torch.float32)
    uniform = float(a32[0]) if bool((a32 == a32[0]).all()) else None
    return a32, uniform


def _plain_scales(weight, scale, name):
    """The experts' weight [E, N, K/2] (uint8 or float4_e2m1fn_x2) and plain scales [E, N, K/16]
    (float8_e4m3fn or uint8), as uint8, checked."""
    if weight.dim() != 3:
        raise ValueError(f"{name}: expert weights must be [E, N, K/2], got shape {list(weight.shape)}")
    e, n, half = weight.shape
    if scale.shape != (e, n, 2 * half // 16) or (2 * half) % 16:
        raise ValueError(
            f"{name}_scale: must be [E, N, K/16] = [{e}, {n}, {2 * half // 16}] (plain scales, K a multiple of "
            f"16), got shape {list(scale.shape)}"
        )
    return weight.view(torch.uint8).contiguous(), scale.view(torch.uint8).contiguous()


class MoE(PackedForms):
    """Routed SwiGLU experts with NVFP4 weights: ``forward(hidden_states, top_k_index,
    top_k_weights)`` -> the weighted sum over each token's k experts of
    ``down_e(silu(gate_e(x)) * up_e(x))``, in token order (the call of transformers' fused experts
    modules, which this one replaces for ModelOpt checkpoints: see ``nvfp4.hf``).

    Arguments (E experts, hidden size H, expert intermediate size I; H and I multiples of 16):

    - ``gate_up``, ``gate_up_scale``: [E, 2I, H/2] packed E2M1 and [E, 2I, H/16] plain E4M3
      scales, each expert's gate rows then its up rows;
    - ``gate_up_global``: each expert's global scale (ModelOpt ``weight_scale_2``, which gate and
      up share), a float or E of them (a sequence or a tensor);
    - ``down``, ``down_scale``, ``down_global``: the same for the down projection, [E, H, I/2];
    - ``gate_up_input_scale``, ``down_input_scale``: the activations' calibrated global scales
      (ModelOpt ``input_scale``, one per projection), needed by ``mode="w4a4"`` only;
    - ``mode``: ``"w4a16"`` (default) or ``"w4a4"`` (see ``Linear``);
    - ``out_dtype``: float16 or bfloat16, the type of every rounding; default the input's.

    ``hidden_states`` [T, H] float16/bfloat16; ``top_k_index`` [T, k] integer expert ids (an id
    >= E, transformers' mark of an expert held elsewhere, contributes nothing); ``top_k_weights``
    [T, k] the router's weights. Returns [T, H].
    """

    def __init__(
        self,
        gate_up,
        gate_up_scale,
        gate_up_global,
        down,
        down_scale,
        down_global,
        gate_up_input_scale=None,
        down_input_scale=None,
        mode="w4a16",
        out_dtype=None,
    ):
        super().__init__()
        import nvfp4.torch  # noqa: F401  (registers torch.ops.nvfp4, which forward calls)

        if mode not in MODES:
            raise ValueError(f'mode must be "w4a16" or "w4a4", got {mode!r}')
        if out_dtype is not None and out_dtype not in _HALF:
            raise ValueError(f"out_dtype must be torch.float16 or torch.bfloat16, got {out_dtype}")
        gu, gus = _plain_scales(gate_up, gate_up_scale, "gate_up")
        dn, dns = _plain_scales(down, down_scale, "down")
        e, n2, h_half = gu.shape
        if n2 % 2:
            raise ValueError(f"gate_up: must hold 2I rows per expert ([gate; up]), got {n2}")
        inter = n2 // 2
        if dn.shape != (e, 2 * h_half, inter // 2):
            raise ValueError(
                f"down: must be [E, H, I/2] = [{e}, {2 * h_half}, {inter // 2}] for gate_up {list(gu.shape)}, "
                f"got {list(dn.shape)}"
            )
        if mode == "w4a4" and (gate_up_input_scale is None or down_input_scale is None):
            raise ValueError(
                "mode='w4a4' needs gate_up_input_scale and down_input_scale (the checkpoint's input_scale of "
                "each projection): MoE quantizes the activations with calibrated scales only (an amax scale "
                "would need a host synchronization)"
            )
        self.num_experts, self.hidden_size, self.intermediate_size = e, 2 * h_half, inter
        self.mode, self.out_dtype = mode, out_dtype
        w4a4 = mode == "w4a4"
        self.gate_up_input_scale = None if gate_up_input_scale is None else float(gate_up_input_scale)
        self.down_input_scale = None if down_input_scale is None else float(down_input_scale)
        gu_alpha, self._gate_up_uniform = _alphas(
            gate_up_global, self.gate_up_input_scale if w4a4 else None, e, "gate_up_global"
        )
        dn_alpha, self._down_uniform = _alphas(down_global, self.down_input_scale if w4a4 else None, e, "down_global")
        self.register_buffer("gate_up_weight", gu)
        self.register_buffer("gate_up_weight_scale", gus)
        self.register_buffer("down_weight", dn)
        self.register_buffer("down_weight_scale", dns)
        self.register_buffer("gate_up_alpha", gu_alpha.to(gu.device))
        self.register_buffer("down_alpha", dn_alpha.to(gu.device))
        # The boundaries searched for each expert's end row.
        self.register_buffer("expert_ids", torch.arange(e, device=gu.device), persistent=False)
        # self._packed (PackedForms): (projection, activation dtype) -> packed weights (``pack``)

    def extra_repr(self):
        return (
            f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
            f"intermediate_size={self.intermediate_size}, mode={self.mode!r}"
        )

    def pack(self, dtype=torch.bfloat16):
        """Packs both projections' expert weights (CUDA, W4A16) for ``dtype`` activations
        (``nvfp4.pack``; see ``Linear.pack``): the same results, faster; forward then reads the
        packed form for activations of that dtype. Forward packs each projection on its first CUDA
        call outside graph capture and compilation, as ``Linear`` does; call this after loading to
        have them packed before a capture. Moving the layer or loading a state dict drops the
        packed forms; after writing the weights in place, call this again (it always packs the
        weights as they are now). Returns whether they are packed."""
        if not self.gate_up_weight.is_cuda:
            return False
        for name in ("gate_up", "down"):
            self._pack_one(name, dtype)
        return True

    def _pack_one(self, name, dtype):
        w, s = getattr(self, name + "_weight"), getattr(self, name + "_weight_scale")
        p = _nv.pack(w, s, dtype=dtype)
        self._packed[(name, dtype)] = p
        return p

    def _packed_for(self, name, x):
        """Projection ``name``'s packed weights for x's dtype (each projection reads its own
        activation type: gate/up the input's, down the output's): packed now when allowed (x on
        the weights' device; not while a CUDA graph captures or torch.compile traces: the packing
        allocates and launches)."""
        if not x.is_cuda or x.dtype not in _HALF:  # NVFP4 activations (W4A4) read no packed form
            return None
        p = self._packed.get((name, x.dtype))
        if p is not None and p.device == x.device:
            return p
        if not self._may_pack_for(getattr(self, name + "_weight"), x):
            return None
        return self._pack_one(name, x.dtype)

    def _gemm(self, name, x, sx, offsets, dtype):
        weight, scale = getattr(self, name + "_weight"), getattr(self, name + "_weight_scale")
        alpha, uniform = getattr(self, name + "_alpha"), getattr(self, "_" + name + "_uniform")
        # The overload named, not the packet: the packet tries `.Tensor` first, and a float alpha
        # there costs a failed schema match (12-24 µs of host time per call on an H100 host).
        if uniform is None:
            op, a = torch.ops.nvfp4.grouped_gemm_moe.Tensor, alpha
        else:
            op, a = torch.ops.nvfp4.grouped_gemm_moe.default, uniform
        packed = self._packed_for(name, x)
        return op(x, sx, weight, scale, offsets, alpha=a, out_dtype=dtype, layout="plain", packed=packed)

    def _activations(self, x):
        """The tokens as the gate/up GEMM reads them, one row per token: (x, None) in W4A16; in
        W4A4 the NVFP4 values [T, H/2] and plain scales [T, H/16] (uint8), each token quantized
        once with the calibrated input scale (per row: a row's bits do not depend on the others)."""
        if self.mode == "w4a16":
            return x, None
        q, s, _ = torch.ops.nvfp4.quantize(x, self.gate_up_input_scale)
        return q, s.view(torch.uint8)

    def _experts(self, xa, sa, offsets, dtype):
        """Steps 2 and 3 on rows sorted by expert (``xa``, ``sa`` as ``_activations`` gives them,
        gathered): each row's ``down_e(silu(gate_e(x)) * up_e(x))`` in ``dtype``, zero for rows
        at or past ``offsets[E-1]``. Every step is per row, so a row's result depends only on the
        row and its expert: what lets ``ExpertParallelMoE`` compute rows on other ranks and still
        give this layer's bits."""
        gu = self._gemm("gate_up", xa, sa, offsets, dtype)
        gate, up = gu.float().split(self.intermediate_size, dim=1)
        h = (torch.nn.functional.silu(gate) * up).to(dtype)
        if self.mode == "w4a16":
            ha, sh = h, None
        elif h.is_cuda and W4A4_ON_W4A16:
            ha, sh = torch.ops.nvfp4.quantize_dequant(h, self.down_input_scale)[0], None
        else:
            ha, sh, _ = torch.ops.nvfp4.quantize(h, self.down_input_scale)
        return self._gemm("down", ha, sh, offsets, dtype)

    def _slice(self, lo, hi):
        """A ``MoE`` holding experts ``lo .. hi-1`` of this one (copies, so that this one can be
        freed), with the same mode, input scales, alphas and ``out_dtype``. Where this layer
        passes its alphas as one float, so does the slice; where it passes a tensor, so does the
        slice (the same kernel path, so the same bits)."""
        if not 0 <= lo < hi <= self.num_experts:
            raise ValueError(f"experts {lo}..{hi - 1} are not within the layer's {self.num_experts}")
        new = MoE.__new__(MoE)
        PackedForms.__init__(new)
        new.num_experts, new.hidden_size, new.intermediate_size = hi - lo, self.hidden_size, self.intermediate_size
        new.mode, new.out_dtype = self.mode, self.out_dtype
        new.gate_up_input_scale, new.down_input_scale = self.gate_up_input_scale, self.down_input_scale
        new._gate_up_uniform, new._down_uniform = self._gate_up_uniform, self._down_uniform
        for name in ("gate_up_weight", "gate_up_weight_scale", "down_weight", "down_weight_scale",
                     "gate_up_alpha", "down_alpha"):
            new.register_buffer(name, getattr(self, name)[lo:hi].clone())
        new.register_buffer("expert_ids", torch.arange(hi - lo, device=self.expert_ids.device), persistent=False)
        return new

    def forward(self, hidden_states, top_k_index, top_k_weights):
        x = check_tokens(hidden_states, self.hidden_size)
        t = x.shape[0]
        k = top_k_index.shape[-1]
        dtype = self.out_dtype or x.dtype

        # 1. Route: sorted by expert (stable: token order within an expert), end rows per expert.
        order, offsets = route(top_k_index.reshape(-1), self.expert_ids)
        src = torch.div(order, k, rounding_mode="floor")  # the token of each sorted row

        # 2. and 3. gate/up, SwiGLU, down on the token rows gathered in expert order (in W4A4
        # each token is quantized once, then its rows gathered; on CUDA written back as 16-bit
        # numbers for the W4A16 kernels, `W4A4_ON_W4A16`).
        if self.mode == "w4a4" and x.is_cuda and W4A4_ON_W4A16:
            xq, sq = torch.ops.nvfp4.quantize_dequant(x, self.gate_up_input_scale)[0], None
        else:
            xq, sq = self._activations(x)
        y = self._experts(xq.index_select(0, src), None if sq is None else sq.index_select(0, src), offsets, dtype)

        # 4. Back to (token, slot) order, weighted sum over the k slots.
        rows = torch.empty_like(y).index_copy_(0, order, y)
        return combine(rows, top_k_weights, t, k, dtype)


def check_tokens(hidden_states, hidden_size):
    """``hidden_states`` checked ([T, H], float16 or bfloat16) and made contiguous."""
    x = hidden_states
    if x.dim() != 2 or x.shape[1] != hidden_size:
        raise ValueError(f"hidden_states must be [T, {hidden_size}], got shape {list(x.shape)}")
    if x.dtype not in _HALF:
        raise TypeError(f"MoE takes float16 or bfloat16 hidden states, got {x.dtype}")
    return x.contiguous()


def route(ids, keys):
    """Rows sorted by id with a stable sort (rows of one id stay in their order): the sort's
    permutation (sorted row i is row ``order[i]``) and, for each of ``keys`` (0 .. n-1), the end of
    its rows as int32 [n] (a ``searchsorted``, on the device: no host synchronization). Ids past
    the last key sort after ``offsets[n-1]``, where the MoE form's grouped GEMM computes nothing."""
    sorted_ids, order = torch.sort(ids, stable=True)
    offsets = torch.searchsorted(sorted_ids, keys.to(sorted_ids.dtype), right=True).to(torch.int32)
    return order, offsets


def combine(rows, top_k_weights, t, k, dtype):
    """The layer's output from its expert rows in (token, slot) order ([T * k, H]): each row
    times its router weight in float32, summed over the k slots in slot order starting from +0
    (elementwise adds, one per slot: each token's sum is the same whatever the batch, on every
    backend, unlike a reduction kernel whose order may follow the shape), rounded once to
    ``dtype``."""
    p = rows.view(t, k, rows.shape[1]).float() * top_k_weights.reshape(t, k, 1).float()
    total = p.new_zeros(t, p.shape[2])
    for j in range(k):
        total.add_(p[:, j])
    return total.to(dtype)
