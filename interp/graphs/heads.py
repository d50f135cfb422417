"""Head loadings: each edge of an attribution graph split over the attention heads that carry it.

An edge is ``A[t, s] = out_s · J · in_t`` with ``J`` the Jacobian of the frozen replacement
model, a sum over paths from the source's output to the target's input. Every path either stays
at one position without crossing an attention layer (the ``residual`` part: residual stream,
norms, transcoder skips), or crosses one or more attention heads (value paths with the patterns
frozen; a head attending to its own position counts too). A path's whole contribution is given
to the **last** head it crosses, the head that brings it to the target's position (so its query
is the target's position), or with ``by="first"`` to the first, the head that takes it from the
source's position (its key is the source's):

    A[t, s] = residual[t, s] + sum_{l, h} loading[t, s, l, h]
    last:  loading[t, s, l, h] = out_s · J_full(source -> x_l) · H_{l,h}^T · J_direct(l -> target)
    first: loading[t, s, l, h] = out_s · J_direct(source -> x_l) · H_{l,h}^T · J_full(l -> target)

with ``x_l`` the attention's input, ``H_{l,h}`` head ``h``'s value path (``pattern_h`` times
``W_V,h W_O,h``; a query head of a grouped-query model uses its key/value head's ``W_V``), and
``J_direct`` the Jacobian with every attention layer closed. The identity is exact (every path
has exactly one last head, and one first head, or none), so the loadings sum to the edge; an
edge between two positions has no residual part. Loadings are signed, like edges. The two
splits agree on every path that crosses one head.

Computed on demand, by two kinds of backward passes through :mod:`interp.graphs.attention_pass`:
one row per target with the attention closed (``J_direct`` at every attention output, and the
residual part), then one row per (target, layer, head) injecting ``H_{l,h}^T g`` at ``x_l`` with
the attention open (``by="first"``: the other way round).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.graphs.attention_budget import fit_rows, heads_bytes
from interp.graphs.attention_pass import (
    AttentionPass,
    attention_pass,
    contract,
    graph_columns,
    sources_of,
)
from interp.graphs.frozen import no_param_grads
from interp.graphs.nodes import Sources
from interp.graphs.value_path import ValuePath

__all__ = ["HEAD_LOADING_COLUMNS", "head_loadings", "head_transpose"]

# the columns of head_loadings's table
HEAD_LOADING_COLUMNS = ("target", "source", "layer", "head", "weight")
RESIDUAL = -1  # layer and head of the residual (no-head) part of an edge


def head_transpose(
    path: ValuePath,
    pattern: Float[Tensor, "head q_pos k_pos"],
    grad: Float[Tensor, "rows q_pos d_model"],
) -> Float[Tensor, "rows head k_pos d_model"]:
    """Each head's value path transposed: a gradient at the attention's output carried, head by
    head, to the attention's input (``pattern_h^T grad W_O,h^T W_V,h^T``)."""
    n_heads = path.W_O.shape[0]
    n_kv = path.W_V.shape[0]
    W_O, W_V = path.W_O.to(grad.dtype), path.W_V.to(grad.dtype)
    W_V = W_V.repeat_interleave(n_heads // n_kv, dim=0)  # a query head's key/value head
    gz = torch.einsum("bqm,hem->bhqe", grad, W_O)
    gv = torch.einsum("hqk,bhqe->bhke", pattern.to(grad.dtype), gz)
    return torch.einsum("bhke,hde->bhkd", gv, W_V)


def _targets(g, tc, model, index: Int[Tensor, " target"]):
    """Each target node's layer (``n_layers`` for a logit), position and input vector."""
    nodes = g.nodes.iloc[index.numpy()]
    W_U = model.W_U.detach()
    layers, positions, vectors = [], [], []
    for node in nodes.itertuples():
        if node.kind == "feature":
            vectors.append(tc.W_enc(int(node.layer))[int(node.feature)])
            layers.append(int(node.layer))
        elif node.kind == "logit":
            tok = int(node.token_id)
            vectors.append(W_U[:, tok] - W_U.mean(dim=1))
            layers.append(tc.n_layers)
        else:
            raise ValueError(f"node {int(node.Index)} is a {node.kind} node, which has no inputs")
        positions.append(int(node.pos))
    return layers, positions, torch.stack(vectors)


def _inject(fp, layers, positions, vectors, dtype) -> tuple[list, list]:
    """The outputs and gradients of a backward pass with one target per row."""
    outs, grads = [], []
    n_layers = len(fp.inputs)
    for layer in sorted(set(layers)):
        site = fp.final if layer == n_layers else fp.inputs[layer]
        grad = torch.zeros(site.shape, dtype=site.dtype, device=site.device)
        for row, (lay, pos) in enumerate(zip(layers, positions, strict=True)):
            if lay == layer:
                grad[row, pos] = vectors[row].to(site.dtype)
        outs.append(site)
        grads.append(grad)
    return outs, grads


def _edge_list(g, edges) -> Int[Tensor, "edge 2"]:
    kinds = g.nodes["kind"].to_numpy()
    if edges is not None:
        pairs = torch.as_tensor(edges, dtype=torch.long).reshape(-1, 2)
        bad = (pairs < 0) | (pairs >= len(kinds))
        if bad.any():
            raise ValueError(f"edges name nodes outside 0..{len(kinds) - 1}: {pairs[bad.any(1)]}")
        for s in pairs[:, 1].tolist():
            if kinds[s] == "logit":
                raise ValueError(f"node {s} is a logit node, which is no edge's source")
        return pairs
    if g.kept_edges is not None:
        pairs = torch.nonzero(g.kept_edges)
    else:  # from the rows, never the dense [n n] adjacency
        row, source = torch.nonzero(g.rows, as_tuple=True)
        pairs = torch.stack([g.row_nodes[row], source], dim=1)
        pairs = pairs[torch.argsort(pairs[:, 0] * len(kinds) + pairs[:, 1])]
    keep = [kinds[int(s)] in ("feature", "error", "token") for s in pairs[:, 1]]
    return pairs[torch.tensor(keep, dtype=torch.bool)] if len(pairs) else pairs


BY = ("last", "first")  # which head of a path that crosses several gets it


@dataclass
class _Work:
    """What every chunk of targets reads and fills: the targets' layers, positions and input
    vectors, the sources, the columns needed, the passes, and the loadings and residual parts
    (``[target layer head needed]``, ``[target needed]``)."""

    t_layers: list[int]
    t_pos: list[int]
    t_vecs: Tensor
    src: Sources
    needed: Tensor
    loads: Tensor
    residual: Tensor
    rows: int
    by: str
    closed: AttentionPass | None = None  # every attention layer closed
    opened: AttentionPass | None = None


def head_loadings(
    model,
    tc,
    g,
    edges=None,
    *,
    by: str = "last",
    batch_size: int = 32,
    max_bytes: int | str | None = None,
) -> pd.DataFrame:
    """Each edge split over (layer, head), as the module docstring defines it.

    Args:
        model, tc: the model and transcoders the graph ``g`` was built from.
        edges: ``(target, source)`` pairs of node indices in ``g.nodes``; None: every kept
            edge of a pruned graph (every nonzero edge of an unpruned one) from a feature, error
            or token.
        by: ``"last"`` (a path's loading on the last head it crosses) or ``"first"``.
        batch_size: rows per backward pass.
        max_bytes: a budget for what the call holds (the sources, the two frozen passes, the
            backward passes, the loadings and the table; not the model or the graph): the
            batch is halved until the estimate (:mod:`interp.graphs.attention_budget`) fits,
            and a budget the smallest batch does not fit is refused (``MemoryBudgetError``)
            with what it needs.

    Returns a DataFrame ``target, source, layer, head, weight`` (node indices, the head's
    loading), with one more row ``layer == head == -1`` for the residual part of an edge
    whose ends share a position; rows of weight exactly zero (a head below the source, at
    or above the target) are left out. Per edge the weights sum to ``g.adjacency[target,
    source]``. ``attrs``: ``batch_size`` (the rows per pass used), ``estimated_bytes`` and
    ``least_bytes`` (the estimate at that batch and at the smallest).
    """
    if by not in BY:
        raise ValueError(f"by must be one of {BY}, got {by!r}")
    pairs = _edge_list(g, edges)
    empty = pd.DataFrame({c: pd.Series(dtype="int64") for c in HEAD_LOADING_COLUMNS[:-1]})
    if len(pairs) == 0:
        return empty.assign(weight=pd.Series(dtype="float64"))
    dtype, device = g.rows.dtype, model.cfg.device
    tokens = g.tokens.to(device)
    tc = tc.to(device=device, dtype=dtype)
    n_layers, n_heads, n_pos = tc.n_layers, int(model.cfg.n_heads), len(tokens)
    targets = pairs[:, 0].unique()
    src = sources_of(model, tc, tokens, dtype)
    cols = graph_columns(src, g.nodes, n_pos)
    # per target: [layer head needed column] loadings and [needed column] residual part, for
    # the columns of the edges' sources only (a graph's sources may be many thousands)
    needed, where = cols[pairs[:, 1]].unique(return_inverse=True)
    loads = torch.zeros(len(targets), n_layers, n_heads, len(needed), dtype=dtype)
    residual = torch.zeros(len(targets), len(needed), dtype=dtype)
    plan = fit_rows(
        model, tc, n_pos, max(1, min(int(batch_size), len(targets) * n_heads)),
        heads_bytes(src, loads, residual, len(pairs)), max_bytes, "head loadings",
    )  # fmt: skip
    work = _Work(*_targets(g, tc, model, targets), src, needed, loads, residual, plan.rows, by)
    with no_param_grads(model):
        work.closed = attention_pass(model, tokens, tc, plan.rows, open_attention=False)
        work.opened = attention_pass(model, tokens, tc, plan.rows)
        for start in range(0, len(targets), plan.rows):
            _chunk(work, slice(start, min(start + plan.rows, len(targets))))
        work.closed = work.opened = None
    to_needed = torch.full((len(g.nodes),), -1, dtype=torch.long)
    to_needed[pairs[:, 1]] = where  # a source node -> its needed column
    table = _table(g, pairs, targets, to_needed, loads, residual)
    table.attrs = plan.attrs()
    return table


def _chunk(work: _Work, part: slice) -> None:
    """The residual parts and the loadings of the targets in ``part``."""
    closed, opened, dtype = work.closed, work.opened, work.loads.dtype
    n_layers, b = len(closed.xs), part.stop - part.start
    where = (work.t_layers[part], work.t_pos[part], work.t_vecs[part])
    outs, grads = _inject(closed, *where, dtype)
    wrt = [*closed.deltas, *closed.outputs, closed.embed]
    got = torch.autograd.grad(outs, wrt, grads, retain_graph=True, allow_unused=True)
    work.residual[part] = _values(work.src, got[n_layers:-1], got[-1], b)[:, work.needed]
    # the gradient at each attention output: along the paths that cross no further head
    # (last), or along every path (first: from the open pass)
    after, before = closed, opened
    got = list(got[:n_layers])  # the rest not held through the heads' passes
    if work.by == "first":
        after, before = opened, closed
        outs, grads = _inject(opened, *where, dtype)
        got = list(torch.autograd.grad(outs, opened.deltas, grads, retain_graph=True,
                                       allow_unused=True))  # fmt: skip
    del outs, grads
    for layer in range(n_layers):
        grad, got[layer] = got[layer], None
        if grad is None or not grad[:b].any():
            continue  # no path from this layer's attention (at or above the target)
        # [b head pos d_model]: each head's part of the target's gradient, at x_layer
        per_head = head_transpose(after.paths[layer], after.patterns[layer], grad[:b])
        del grad
        _head_rows(work, before, layer, per_head, part.start)


def _head_rows(work: _Work, before, layer: int, per_head: Tensor, first_target: int) -> None:
    """One backward row per (target, head) of ``per_head`` from layer ``layer``'s attention
    input, contracted with the sources into ``work.loads``."""
    b, n_heads = per_head.shape[:2]
    jobs = [(i, h) for i in range(b) for h in range(n_heads)]
    for first in range(0, len(jobs), work.rows):
        batch = jobs[first : first + work.rows]
        inject = torch.zeros_like(before.xs[layer])
        for row, (i, h) in enumerate(batch):
            inject[row] = per_head[i, h]
        back = torch.autograd.grad(before.xs[layer], [*before.outputs, before.embed], inject,
                                   retain_graph=True, allow_unused=True)  # fmt: skip
        del inject
        values = _values(work.src, back[:-1], back[-1], len(batch))[:, work.needed]
        del back
        for row, (i, h) in enumerate(batch):
            work.loads[first_target + i, layer, h] = values[row]


def _values(src, outputs, embed, b: int) -> Tensor:
    """One backward pass's gradients contracted with every source (its first ``b`` rows)."""
    return contract(
        src, [None if x is None else x[:b] for x in outputs], None if embed is None else embed[:b]
    ).cpu()


def _table(g, pairs, targets, cols, loads, residual) -> pd.DataFrame:
    where = torch.full((len(g.nodes),), -1, dtype=torch.long)
    where[targets] = torch.arange(len(targets))
    t, s = pairs[:, 0], pairs[:, 1]
    i, c = where[t], cols[s]
    weights = loads[i, :, :, c]  # [edge layer head]
    edge, layer, head = torch.nonzero(weights, as_tuple=True)
    pos = torch.tensor(g.nodes["pos"].to_numpy())
    same = torch.nonzero(pos[t] == pos[s]).flatten()
    none = torch.full((len(same),), RESIDUAL, dtype=torch.long)
    table = pd.DataFrame(
        {
            "target": torch.cat([t[edge], t[same]]).numpy(),
            "source": torch.cat([s[edge], s[same]]).numpy(),
            "layer": torch.cat([layer, none]).numpy(),
            "head": torch.cat([head, none]).numpy(),
            "weight": torch.cat([weights[edge, layer, head], residual[i[same], c[same]]]).numpy(),
        }
    )
    return table.sort_values(["target", "source", "layer", "head"], ignore_index=True)
