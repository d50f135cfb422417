"""The attention's gradient in the frozen replacement model: the value path only, computed on the
rows and positions a backward pass can reach.

With its pattern frozen, an attention layer is linear in its input ``x`` (the norm's output):
``out = sum_h pattern_h (x W_V,h + b_V,h) W_O,h + b_O``. Differentiating the bridge's own
attention would multiply the gradient by every projection the bridge computes (GPT-2 and NeoX
compute q, k and v with one fused matrix, three times the work of ``W_V`` alone, q and k's
gradients being zeros). So the frozen pass detaches what enters the attention
(``attn.hook_in``) and, at its output (``attn.hook_out``, before any post-norm), adds a zero
whose gradient is this map's, with the pattern recorded at ``attn.hook_pattern``: the values
are the bridge's, the gradient two matrix products per position.

A backward pass's targets sit at positions ``<= p`` in its first ``b`` rows (the others carry
no target), and the frozen model is causal, so its gradient is zero at later positions and in
other rows: :class:`Scope` says which, and the value path computes only there.

Each layer's map is checked once against the bridge's output (row 0, biases included) during
the pass; a layer whose weights cannot be read or do not reproduce it (an architecture laid out
otherwise) makes the caller fall back to differentiating the bridge's attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from interp.models.offload import stacked_weight

__all__ = ["Scope", "ValuePath", "value_path_weights", "check_rtol", "rows_miss"]


@dataclass
class Scope:
    """What the current backward pass can reach: its first ``rows`` rows, its first
    ``positions`` positions (None: all)."""

    rows: int | None = None
    positions: int | None = None


@dataclass
class ValuePath:
    """One layer's value path: ``W_V [kv_head d_model d_head]``, ``W_O [head d_head d_model]``
    and their biases (None where the model has none), for checking the map."""

    W_V: Tensor
    W_O: Tensor
    b_V: Tensor | None
    b_O: Tensor | None

    def __post_init__(self) -> None:
        self.last_miss = float("inf")  # the last check's largest miss / tolerance (inf: none)
        n_kv, d_model, d_head = self.W_V.shape
        # the backward's two products as plain matrices, laid out once
        self.V_t = self.W_V.transpose(1, 2).reshape(n_kv * d_head, d_model).contiguous()
        self.O = self.W_O.reshape(-1, d_model).contiguous()  # [head*d_head d_model]

    def check(self, x: Tensor, pattern: Tensor, out: Tensor) -> bool:
        """Whether the map, biases included, gives the bridge's ``out`` on row 0 of ``x``:
        every position's output vector within :func:`check_rtol` of its norm. The largest
        ratio of a position's miss to its tolerance is kept in ``last_miss`` (<= 1: agreed)."""
        work = torch.promote_types(x.dtype, torch.float32)
        x, pattern, want = x.to(work), pattern.to(work), out[0].to(work)
        v = torch.einsum("pd,hde->phe", x[0], self.W_V.to(work))
        if self.b_V is not None:
            v = v + self.b_V.to(work)
        v = v.repeat_interleave(pattern.shape[1] // v.shape[1], dim=1)
        z = torch.einsum("hqk,khe->qhe", pattern[0], v)
        mine = torch.einsum("qhe,hem->qm", z, self.W_O.to(work))
        if self.b_O is not None:
            mine = mine + self.b_O.to(work)
        self.last_miss = rows_miss(mine, want, check_rtol(out.dtype, x.shape[-1]))
        return self.last_miss <= 1.0

    def apply(
        self,
        out: Float[Tensor, "rows pos d_model"],
        x: Float[Tensor, "rows pos d_model"],
        recorded: dict,
        scope: Scope,
    ) -> Float[Tensor, "rows pos d_model"]:
        """``out``'s value with the value path's gradient into ``x``, through the pattern
        ``recorded["pattern"]`` ``[1 head q_pos k_pos]`` (read in the backward pass)."""
        return _Linear.apply(out.detach(), x, self, recorded, scope)


# a bridge rounds each result it computes (the values, their mix by the pattern, the output,
# a bias added) to its dtype, each within half an eps of the vector it rounds; its products
# accumulate in float32 at least, whose rounding grows as the square root of the terms summed
ROUNDINGS = 4
ACCUMULATION = 4.0  # random-walk roundings of the float32 sums, with a margin of 4


def check_rtol(dtype: torch.dtype, n_terms: int) -> float:
    """The relative tolerance of a frozen map's check (:meth:`ValuePath.check`,
    :meth:`interp.graphs.norm_path.NormPath.check`) against the bridge's output computed in
    ``dtype`` from sums of ``n_terms`` products: ``4 u + 4 sqrt(n_terms) u32``, with ``u``
    ``dtype``'s unit roundoff (eps / 2) and ``u32`` that of float32 (or float64, where the
    bridge computes in it). bfloat16 at d_model 64: 0.0157; float16: 0.0020; float32: 2.1e-6.
    Measured on the zoo's architectures, the bridge's outputs are off by at most 1.2 u (half
    precision) and 4.4 u (float32) of a position's vector; one of 4 heads missing is off by
    0.46 of it at least, one of 16 by 0.1 or more (tests/graphs/test_graph_value_path.py)."""
    u = torch.finfo(dtype).eps / 2
    u_sum = torch.finfo(torch.promote_types(dtype, torch.float32)).eps / 2
    return ROUNDINGS * u + ACCUMULATION * math.sqrt(n_terms) * u_sum


def rows_miss(
    mine: Float[Tensor, "pos d_model"], want: Float[Tensor, "pos d_model"], rtol: float
) -> float:
    """The largest ratio, over positions, of ``|mine - want|`` to ``rtol`` times the larger of
    the two vectors' norms (0 where both are zero): a map agrees where it is ``<= 1``."""
    miss = (mine - want).norm(dim=-1)
    scale = torch.maximum(mine.norm(dim=-1), want.norm(dim=-1)) * rtol
    ratio = torch.where(miss > 0, miss / scale.clamp(min=torch.finfo(scale.dtype).tiny), 0.0)
    return float(ratio.max()) if ratio.numel() else 0.0


def _bias(model, name: str) -> Tensor | None:
    try:
        return stacked_weight(model, name).detach()
    except torch.OutOfMemoryError:
        raise
    except (AttributeError, TypeError, RuntimeError):  # a bias-free projection
        return None


def value_path_weights(model, n_layers: int) -> list[ValuePath] | None:
    """Each layer's :class:`ValuePath`, or None when the model's weights cannot be read so."""
    try:
        W_V = stacked_weight(model, "W_V").detach()
        W_O = stacked_weight(model, "W_O").detach()
    except torch.OutOfMemoryError:
        raise
    except (AttributeError, TypeError, RuntimeError, NotImplementedError):
        return None
    n_heads = int(model.cfg.n_heads)
    if W_V.dim() != 4 or W_O.dim() != 4 or W_O.shape[1] != n_heads or n_heads % W_V.shape[1]:
        return None
    b_V, b_O = _bias(model, "b_V"), _bias(model, "b_O")
    return [
        ValuePath(
            W_V[layer],
            W_O[layer],
            None if b_V is None else b_V[layer],
            None if b_O is None else b_O[layer],
        )
        for layer in range(n_layers)
    ]


class _Linear(torch.autograd.Function):
    """Forward: ``out`` as it is. Backward: the value path's transpose, on the scope only."""

    @staticmethod
    def forward(ctx, out, x, path: ValuePath, recorded: dict, scope: Scope):
        ctx.path, ctx.recorded, ctx.scope = path, recorded, scope
        return out.clone()

    @staticmethod
    def backward(ctx, grad: Tensor):
        path, scope = ctx.path, ctx.scope
        pattern = ctx.recorded["pattern"][0]
        rows, n_pos, d_model = grad.shape
        b, p = min(scope.rows or rows, rows), min(scope.positions or n_pos, n_pos)
        gx = _one_position(path, pattern, grad[:b, :p])
        if gx is None:
            gx = _dense(path, pattern, grad[:b, :p])
        if b == rows and p == n_pos:
            return None, gx, None, None, None
        full = grad.new_empty(grad.shape)  # zero past the scope: each element written once
        full[b:].zero_()
        full[:b, p:].zero_()
        full[:b, :p] = gx
        return None, full, None, None, None


def _dense(path: ValuePath, pattern: Tensor, grad: Tensor) -> Tensor:
    """The value path's transpose on ``grad [b p d_model]``."""
    b, p, d_model = grad.shape
    n_kv, _, d_head = path.W_V.shape
    n_heads = path.W_O.shape[0]
    g = grad.reshape(b * p, d_model)
    gz = (g @ path.O.to(grad.dtype).T).view(b, p, n_heads, d_head)
    # heads as the batch of the pattern's product, (rows, d_head) as its columns: the
    # pattern is never repeated over rows
    gz = gz.permute(2, 1, 0, 3).reshape(n_heads, p, b * d_head)
    pat_t = pattern[:, :p, :p].transpose(1, 2).to(grad.dtype)  # [head k_pos q_pos]
    gv = torch.bmm(pat_t, gz)  # [head k_pos (b d_head)]
    if n_kv != n_heads:  # grouped query heads share a key/value head
        gv = gv.view(n_kv, n_heads // n_kv, p, b * d_head).sum(1)
    gv = gv.view(n_kv, p, b, d_head).permute(2, 1, 0, 3).reshape(b * p, n_kv * d_head)
    return (gv @ path.V_t.to(grad.dtype)).view(b, p, d_model)


def _one_position(path: ValuePath, pattern: Tensor, grad: Tensor) -> Tensor | None:
    """The transpose where each row's gradient sits at one position at most (the first
    attention below a target): per row and head, the value path's vector ``[d_model]`` once,
    spread over the keys by that position's pattern row; None where a row has more."""
    b, p, d_model = grad.shape
    where = grad.ne(0).any(-1)  # [b p]: a bool per element, not a float copy of grad
    if b == 0 or int(where.sum(1).max()) > 1:
        return None
    q = where.to(torch.uint8).argmax(1)  # each row's position (0 where none: its g is 0)
    g = grad[torch.arange(b, device=grad.device), q]  # [b d_model]
    n_kv, _, d_head = path.W_V.shape
    n_heads = path.W_O.shape[0]
    gz = (g @ path.O.to(grad.dtype).T).view(b, n_heads, d_head).transpose(0, 1)
    V_t = path.V_t.to(grad.dtype).view(n_kv, d_head, d_model)
    if n_kv != n_heads:  # each head's key/value head
        V_t = V_t.repeat_interleave(n_heads // n_kv, dim=0)
    u = torch.bmm(gz, V_t).transpose(0, 1)  # [b head d_model]
    rows = pattern[:, q, :p].to(grad.dtype).permute(1, 2, 0)  # [b k_pos head]
    return torch.bmm(rows, u)  # [b k_pos d_model]
