"""QK attribution: one head's attention score at (query, key) as a sum over pairs of nodes, one on
the query's side and one on the key's.

In the frozen replacement model (:mod:`interp.graphs.frozen`) the attention's input ``x`` at a
position is a sum of what the graph's sources (features, errors, tokens) write there, carried
by the frozen model (residual stream, frozen norms, earlier attention's value paths, transcoder
skips), plus constants: positional embeddings, the biases of earlier layers and norms, the
transcoders' ``b_dec`` and position 0's MLP outputs. A head's query is affine in ``x`` at the
query's position (``x W_Q + b_Q``, then rotary, a fixed rotation per position), its key likewise
at the key's, so with ``Q = sum_n Q_n + Q_const + Q_bias`` and ``K`` the same,

    score = c * Q · K = sum over (query item, key item) of c * Q_i · K_j

with ``c`` the head's scale (``1/sqrt(d_head)``; Gemma 2's ``query_pre_attn_scalar**-0.5``).
The items on each side are the graph's nodes, ``other`` (the sources that are no node of this
graph: features pruned away or never selected), ``constant`` (the constants above, carried to
``x``) and ``bias`` (what the query or key is at ``x = 0``: ``b_Q`` or ``b_K`` after rotary).
Rotary and grouped-query attention enter exactly: the bridge's own projections and rotary are
differentiated (TransformerLens 4.3's bridges run no ``hook_rot_q`` on GPT-NeoX and GPT-J:
GPT-NeoX's rotary is applied from the bridge's ``hook_cos`` and ``hook_sin``, GPT-J's, which
has neither, from its definition). Each call checks that ``softmax(c q·k)`` (capped where the
model caps) is the model's pattern on the query's row, so a scale or layout read wrongly is
refused.

A soft-capped score (Gemma 2) is decomposed before the cap: the model's ``hook_attn_scores`` is
``cap * tanh(score / cap)`` of the sum.

Cost: one frozen pass and ``2 x d_head`` backward rows (a unit vector at each component of the
query and of the key), in chunks of ``batch_size``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from interp.engine import run_cached
from interp.graphs.attention_budget import fit_rows, qk_bytes
from interp.graphs.attention_pass import attention_pass, contract, graph_columns, sources_of
from interp.graphs.frontend import node_ids
from interp.graphs.frozen import no_param_grads

__all__ = ["QK_COLUMNS", "attention_pairs", "qk_attribution", "qk_parts"]

# the columns of qk_attribution's table
QK_COLUMNS = ("query_node", "key_node", "query_id", "key_id", "contribution")
CONSTANTS = ("other", "constant", "bias")  # the named items after the nodes (module docstring)
# the pattern recomputed from q and k against the model's: at least this close (a wrong scale
# is off by far more), and in half precision as close as its roundings allow (_pattern_rtol)
SCALE_RTOL = 1e-3
ROUNDINGS = 4  # the model's roundings of a score and of the pattern's entries, in its dtype
# entries this small are not compared: near float32's underflow, or in float16 within a few
# steps of its subnormals (whose spacing, 6e-8, is no longer relative to the entry)
UNDERFLOW = 1e-30


def _check_args(model, g, layer: int, head: int, query_pos: int, key_pos: int) -> None:
    n_layers, n_heads, n_pos = int(model.cfg.n_layers), int(model.cfg.n_heads), len(g.tokens)
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer {layer} is not one of the model's {n_layers} layers")
    if not 0 <= head < n_heads:
        raise ValueError(f"head {head} is not one of the model's {n_heads} heads")
    if not 0 <= key_pos <= query_pos < n_pos:
        raise ValueError(
            f"need 0 <= key_pos <= query_pos < {n_pos} (the prompt's length), got "
            f"query_pos {query_pos}, key_pos {key_pos}: a query attends only to earlier keys"
        )


def _scale(model, layer: int) -> float:
    attn = model.blocks[layer].attn
    module = getattr(attn, "original_component", None)
    scaling = getattr(module, "scaling", None)
    return float(scaling) if scaling is not None else float(model.cfg.d_head) ** -0.5


def _softcap(model) -> float | None:
    cap = getattr(model.cfg, "attn_scores_soft_cap", None)
    return float(cap) if cap is not None and cap > 0 else None


def qk_parts(
    model,
    tc,
    g,
    layer: int,
    head: int,
    query_pos: int,
    key_pos: int,
    *,
    batch_size: int = 64,
    max_bytes: int | str | None = None,
) -> tuple[Tensor, Tensor, float, list[str]]:
    """The query's and the key's parts ``[item d_head]`` (items: the graph's nodes, then
    ``other``, ``constant``, ``bias``), the scale ``c`` and the item labels; ``c * Q.sum(0) @
    K.sum(0)`` is the score before any cap. Checked against the pattern the model computed."""
    parts = _qk_parts(model, tc, g, layer, head, query_pos, key_pos, batch_size, max_bytes)
    return parts[:4]


def _qk_parts(model, tc, g, layer, head, query_pos, key_pos, batch_size, max_bytes) -> tuple:
    """:func:`qk_parts`, and the :class:`interp.graphs.attention_budget.RowPlan` it ran."""
    _check_args(model, g, layer, head, query_pos, key_pos)
    dtype, device = g.rows.dtype, model.cfg.device
    tokens = g.tokens.to(device)
    tc = tc.to(device=device, dtype=dtype)
    src = sources_of(model, tc, tokens, dtype)
    cols = graph_columns(src, g.nodes, len(tokens))
    d_head, n_heads = int(model.cfg.d_head), int(model.cfg.n_heads)
    # per backward row (a component of the query, then of the key): each source's part, and
    # the part that goes through the attention's input (the rest is the bias)
    values = torch.zeros(2 * d_head, src.n_cols, dtype=dtype)
    through_x = torch.zeros(2 * d_head, dtype=dtype)
    plan = fit_rows(
        model, tc, len(tokens), max(1, min(int(batch_size), 2 * d_head)),
        qk_bytes(src, values, *_reaching(g, layer, query_pos, key_pos)), max_bytes,
        "QK attribution",
    )  # fmt: skip
    with no_param_grads(model):
        fp = attention_pass(model, tokens, tc, plan.rows, qk_layer=layer)
        q_all, k_all = fp.qk["q"], fp.qk["k"]
        kv = head // (n_heads // k_all.shape[2])  # the key/value head of a query head
        for start in range(0, 2 * d_head, plan.rows):
            part = range(start, min(start + plan.rows, 2 * d_head))
            at = [(0, query_pos, head, i) if i < d_head else (1, key_pos, kv, i - d_head)
                  for i in part]  # fmt: skip
            _backward_rows(fp, src, layer, at, values[start:], through_x[start:])
        q_val = q_all[0, query_pos, head].detach().to(dtype).cpu()
        k_val = k_all[0, key_pos, kv].detach().to(dtype).cpu()
        scale = _scale(model, layer)
        _check_scale(model, fp.patterns[layer][head], q_all[0, :, head], k_all[0, :, kv], scale,
                     query_pos)  # fmt: skip
        del fp, q_all, k_all
    items = []
    halves = (slice(0, d_head), slice(d_head, 2 * d_head))
    for half, total in zip(halves, (q_val, k_val), strict=True):
        side, x_part = values[half], through_x[half]
        nodes = torch.zeros(len(g.nodes), d_head, dtype=dtype)
        is_source = cols >= 0
        nodes[is_source] = side.T[cols[is_source]]
        other = side.sum(1) - nodes.sum(0)
        constant = x_part - side.sum(1)
        bias = total - x_part
        items.append(torch.cat([nodes, other[None], constant[None], bias[None]]))
    labels = [*node_ids(g.nodes, int(model.cfg.n_layers)), *CONSTANTS]
    return items[0], items[1], scale, labels, plan


def _reaching(g, layer: int, query_pos: int, key_pos: int) -> tuple[int, int]:
    """How many items can have a part in the query, and in the key: sources below ``layer``
    (features and errors write after their layer's attention) at or before the position,
    and the constants."""
    nodes = g.nodes
    source = nodes["kind"].isin(["token"]) | (
        nodes["kind"].isin(["feature", "error"]) & (nodes["layer"] < layer)
    )
    pos = nodes["pos"].to_numpy()
    return tuple(int((source & (pos <= at)).sum()) + len(CONSTANTS) for at in (query_pos, key_pos))


def _backward_rows(fp, src, layer: int, at: list, values: Tensor, through_x: Tensor) -> None:
    """One backward row per ``(side, pos, head, component)`` of ``at`` (side 0: the query, 1:
    the key): each source's part into ``values``, the part through layer ``layer``'s attention
    input into ``through_x``."""
    sides = (fp.qk["q"], fp.qk["k"])
    inject = [torch.zeros_like(t) for t in sides]
    for row, (side, pos, h, i) in enumerate(at):
        inject[side][row, pos, h, i] = 1
    wrt = [*fp.outputs, fp.embed, fp.xs[layer]]
    got = torch.autograd.grad(sides, wrt, inject, retain_graph=True, allow_unused=True)
    del inject
    b = len(at)
    values[:b] = contract(
        src, [None if t is None else t[:b] for t in got[:-2]],
        None if got[-2] is None else got[-2][:b],
    ).cpu()  # fmt: skip
    x = fp.xs[layer][0].detach().to(values.dtype)
    through_x[:b] = torch.einsum("bpd,pd->b", got[-1][:b].to(values.dtype), x).cpu()


def _pattern_rtol(dtype: torch.dtype, scores: Tensor, pattern: Tensor, capped: bool) -> Tensor:
    """How far each entry of the model's pattern row may be from ours, relative to itself. The
    model rounds each score ``s_i`` (by ``u |s_i|``, ``u`` its dtype's unit roundoff; four times
    where it soft-caps: the product, the division by the cap, tanh, the product by the cap) and
    each entry; softmax turns score errors ``d`` into relative errors ``d_i - sum_j p_j d_j``, so
    entry ``i`` may be off by ``u (ROUNDINGS + n (|s_i| + sum_j p_j |s_j|))`` of itself, ``n``
    the score's roundings; in float32 and float64 never less than :data:`SCALE_RTOL`."""
    u = torch.finfo(dtype).eps / 2
    size = scores.detach().abs()
    bound = u * (ROUNDINGS + (4 if capped else 1) * (size + (pattern * size).sum()))
    return bound.clamp(min=SCALE_RTOL) if dtype in (torch.float32, torch.float64) else bound


def _check_scale(model, pattern, q, k, scale: float, query_pos: int) -> None:
    """The query's row of the pattern from q, k and ``scale`` (soft-capped where the model
    caps), against the model's own: a scale read wrongly, or a score with terms this module
    does not know (an additive position bias), is refused."""
    scores = scale * (k[: query_pos + 1].float() @ q[query_pos].float())
    cap = _softcap(model)
    if cap is not None:
        scores = cap * torch.tanh(scores / cap)
    mine = torch.softmax(scores, dim=-1)
    want = pattern[query_pos, : query_pos + 1].float()
    rtol = _pattern_rtol(pattern.dtype, scores, want, cap is not None)
    info = torch.finfo(pattern.dtype)
    atol = max(UNDERFLOW, ROUNDINGS * info.tiny * info.eps)
    if not bool(((mine - want).abs() <= rtol * torch.maximum(mine, want) + atol).all()):
        raise NotImplementedError(
            f"{type(model).__name__}: the pattern is not softmax(c q·k) with c = {scale:.4g} "
            "(a score with other terms, or a scale read wrongly): QK attribution is not "
            "implemented for this model"
        )


def qk_attribution(
    model,
    tc,
    g,
    layer: int,
    head: int,
    query_pos: int,
    key_pos: int,
    *,
    top: int | None = None,
    batch_size: int = 64,
    max_bytes: int | str | None = None,
) -> pd.DataFrame:
    """Head ``head`` of ``layer``'s score at (``query_pos``, ``key_pos``) over pairs of items
    (module docstring), the largest ``|contribution|`` first.

    Returns a DataFrame ``query_node, key_node`` (indices in ``g.nodes``; -1 for ``other``,
    ``constant`` and ``bias``), ``query_id, key_id`` (node ids as the graph's files write them,
    or those names) and ``contribution``; pairs whose contribution is exactly zero are left out,
    and ``top`` keeps only the largest. Without ``top`` the contributions sum to the score
    before any soft cap, which ``attrs["score"]`` holds (``attrs["capped"]``: after the cap).
    ``max_bytes`` bounds what the call holds (the sources, the frozen pass, the backward rows,
    the parts and the table; not the model or the graph): the batch is halved until the
    estimate (:mod:`interp.graphs.attention_budget`) fits, and a budget the smallest batch
    does not fit is refused (``MemoryBudgetError``) with what it needs. ``attrs`` also holds
    ``batch_size``, ``estimated_bytes`` and ``least_bytes`` (the estimate at the batch used
    and at the smallest).
    """
    Q, K, scale, labels, plan = _qk_parts(
        model, tc, g, layer, head, query_pos, key_pos, batch_size, max_bytes
    )
    # the products of the items with a part on both sides only (the rest are zero)
    q_items = torch.nonzero(Q.abs().amax(1) > 0).flatten()
    k_items = torch.nonzero(K.abs().amax(1) > 0).flatten()
    pairs: Float[Tensor, "item item"] = scale * Q[q_items] @ K[k_items].T
    qi, ki = torch.nonzero(pairs, as_tuple=True)
    value = pairs[qi, ki]
    del pairs
    order = torch.argsort(value.abs(), descending=True)
    if top is not None:
        order = order[: int(top)]
    qi, ki, value = q_items[qi[order]], k_items[ki[order]], value[order]
    n_nodes, names = len(g.nodes), np.asarray(labels, dtype=object)
    table = pd.DataFrame(
        {
            "query_node": torch.where(qi < n_nodes, qi, -1).numpy(),
            "key_node": torch.where(ki < n_nodes, ki, -1).numpy(),
            "query_id": names[qi.numpy()],
            "key_id": names[ki.numpy()],
            "contribution": value.numpy(),
        }
    )
    score = float(scale * Q.sum(0) @ K.sum(0))
    cap = _softcap(model)
    table.attrs = {
        "score": score,
        "capped": score if cap is None else cap * float(torch.tanh(torch.tensor(score / cap))),
        "layer": layer,
        "head": head,
        "query_pos": query_pos,
        "key_pos": key_pos,
        **plan.attrs(),
    }
    return table


def attention_pairs(
    model, g, layer: int, head: int | None = None, *, top: int = 10, skip_first: bool = False
) -> pd.DataFrame:
    """The (query, key) position pairs of ``layer``'s heads (or one ``head``) with the most
    attention: a DataFrame ``layer, head, query_pos, key_pos, attention`` (the pattern's value),
    the largest first, at most ``top`` per head. ``skip_first`` leaves out key position 0 (where
    many heads park their attention)."""
    tokens = g.tokens.to(model.cfg.device)
    name = f"blocks.{layer}.attn.hook_pattern"
    pattern = run_cached(model, tokens[None], hooks=[name])[name][0].float().cpu()
    heads = range(pattern.shape[0]) if head is None else [head]
    frames = []
    for h in heads:
        p = pattern[h].clone()
        if skip_first:
            p[:, 0] = 0
        p = torch.tril(p)
        value, flat = torch.topk(p.flatten(), min(int(top), p.numel()))
        frames.append(
            pd.DataFrame(
                {
                    "layer": layer,
                    "head": h,
                    "query_pos": (flat // p.shape[1]).numpy(),
                    "key_pos": (flat % p.shape[1]).numpy(),
                    "attention": value.numpy(),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)
