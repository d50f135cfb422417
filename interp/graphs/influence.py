"""Influence through an attribution graph, pruning and scores: circuit-tracer 0.5's
``graph.py`` (``normalize_matrix``, ``compute_influence``, ``prune_graph``,
``compute_graph_scores``, ``compute_partial_influences``) as plain functions on tensors.

With ``Â`` the adjacency's absolute values normalised so each row sums to 1 (rows of zeros stay
zero) and ``w`` the logit probabilities on the logit nodes (zero elsewhere), a node's influence
is ``(w Â + w Â² + ...)`` at that node: the share of the logits' probability-weighted input that
reaches it through every path. The graph is acyclic (targets read only earlier sources), so the
series ends after at most as many steps as the longest path.

Only feature and logit nodes have inputs, so every function here works on the graph's rows: a
block ``rows [r n]`` of the adjacency's nonzero rows with ``row_nodes [r]`` their node indices
(any order); a square adjacency with no ``row_nodes`` is every node's row. ``w Â`` is then
``w[row_nodes] R̂``: no ``[n n]`` matrix is built and only nonzero entries are sorted.
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float
from torch import Tensor

__all__ = [
    "RANKING_CLAMP",
    "edge_influence",
    "find_threshold",
    "node_influence",
    "normalise_rows",
    "partial_influences",
    "prune_masks",
    "graph_scores",
]


# the least row sum a row is divided by: circuit-tracer's normalize_matrix (pruning, scores)
# clamps at 1e-10, its compute_partial_influences (the ranking under a cap) at 1e-8, so a row
# whose |entries| sum to less than 1e-8 passes less than all of its influence on when ranking
NORMALISE_CLAMP = 1e-10
RANKING_CLAMP = 1e-8  # the ranking's row-sum clamp (circuit-tracer's compute_partial_influences)


def _row_nodes(rows: Tensor, row_nodes: Tensor | None) -> Tensor:
    if row_nodes is not None:
        return row_nodes
    if rows.shape[0] != rows.shape[1]:
        raise ValueError(f"rows {tuple(rows.shape)} need their row_nodes (the graph's node ids)")
    return torch.arange(rows.shape[0], device=rows.device)


def normalise_rows(
    adjacency: Float[Tensor, "r n"], clamp: float = NORMALISE_CLAMP
) -> Float[Tensor, "r n"]:
    """``|A|`` with each row divided by its sum, at least ``clamp`` (rows of zeros stay zero):
    one new tensor."""
    a = adjacency.abs()
    return a.div_(a.sum(dim=1, keepdim=True).clamp(min=clamp))


def _series(
    normalised: Tensor, weights: Tensor, row_nodes: Tensor, max_iter: int = 1000
) -> Float[Tensor, " n"]:
    current = weights[row_nodes] @ normalised
    influence = current.clone()
    for _ in range(max_iter):
        if not current.any():
            return influence
        current = current[row_nodes] @ normalised
        influence += current
    raise RuntimeError(f"influence did not converge in {max_iter} steps: the graph has a cycle")


def node_influence(
    adjacency: Tensor, weights: Tensor, row_nodes: Tensor | None = None
) -> Float[Tensor, " n"]:
    """Each node's influence on the weighted logits (module docstring)."""
    return _series(normalise_rows(adjacency), weights, _row_nodes(adjacency, row_nodes))


def edge_influence(
    adjacency: Tensor, weights: Tensor, row_nodes: Tensor | None = None
) -> Float[Tensor, "r n"]:
    """Each edge's influence (on the rows given): its normalised weight times its target's
    influence (plus the target's own logit weight)."""
    row_nodes = _row_nodes(adjacency, row_nodes)
    normalised = normalise_rows(adjacency)
    target = _series(normalised, weights, row_nodes) + weights
    return normalised.mul_(target[row_nodes][:, None])


def _descending(values: Float[Tensor, " k"]) -> Float[Tensor, " k"]:
    """``values`` (a tensor of the caller's own) from the largest down: on the host numpy sorts
    them in place (the values alone: no int64 indices twice their size beside them, and ~18x
    faster than torch.sort on 20M float32 values), then one reversed copy; elsewhere
    torch.sort's. Equal values are interchangeable, so the order is torch.sort's bit for bit."""
    if values.device.type != "cpu" or values.dtype not in (torch.float32, torch.float64):
        return torch.sort(values, descending=True).values
    values.detach().numpy().sort()
    return values.flip(0)


def find_threshold(scores: Tensor, threshold: float, size: int | None = None) -> Tensor:
    """The smallest score among the highest ones that together make ``threshold`` of the total
    (scores are >= 0). Only the nonzero scores are sorted: the zeros after them add nothing to
    the cumulative sum, so the result is circuit-tracer's, at a fraction of an N² sort.
    ``size``: how many scores the full set holds (``scores`` and zeros left out; default all)."""
    flat = scores.flatten()
    size = len(flat) if size is None else size
    ordered = _descending(flat[flat > 0])
    if len(ordered) == 0:
        return flat.new_zeros(())
    cumulative = torch.cumsum(ordered, dim=0) / ordered.sum()
    index = int(torch.searchsorted(cumulative, threshold).item())
    if index < len(ordered):
        return ordered[index]
    # past the last nonzero score: circuit-tracer's index runs into the zeros (if any)
    return flat.new_zeros(()) if len(ordered) < size else ordered[-1]


def prune_masks(
    adjacency: Float[Tensor, "r n"],
    weights: Float[Tensor, " n"],
    *,
    n_features: int,
    n_kept_tail: int,
    node_threshold: float,
    edge_threshold: float,
    row_nodes: Tensor | None = None,
) -> tuple[Bool[Tensor, " n"], Bool[Tensor, "r n"], Float[Tensor, " n"], Float[Tensor, " n"]]:
    """circuit-tracer's ``prune_graph``: ``(node_mask, edge_mask, cumulative_scores)``, and
    each node's influence; ``edge_mask`` has the shape of the rows given (every other row's
    edges are none).

    Nodes are kept to ``node_threshold`` of the total influence, then edges (among kept nodes)
    to ``edge_threshold`` of the total edge influence; feature and error nodes without a kept
    outgoing edge, and feature nodes without a kept incoming edge, are dropped until none is
    left. The last ``n_kept_tail`` nodes (tokens and logits) are always kept; every feature
    must have a row."""
    for name, value in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be between 0 and 1, got {value}")
    row_nodes = _row_nodes(adjacency, row_nodes)
    n = adjacency.shape[1]
    normalised = normalise_rows(adjacency)
    influence = _series(normalised, weights, row_nodes)  # node_influence
    node_mask = influence >= find_threshold(influence, node_threshold)
    node_mask[-n_kept_tail:] = True
    # the edge influence of the graph without the dropped nodes, in one copy of the rows (the
    # normalised one's memory, refilled: no second allocation of the rows' size)
    pruned = torch.abs(adjacency, out=normalised)
    pruned[~node_mask[row_nodes]] = 0
    pruned[:, ~node_mask] = 0
    pruned.div_(pruned.sum(dim=1, keepdim=True).clamp(min=NORMALISE_CLAMP))
    target = _series(pruned, weights, row_nodes) + weights
    scores = pruned.mul_(target[row_nodes][:, None])
    edge_mask = scores >= find_threshold(scores, edge_threshold, size=n * n)
    del scores, pruned
    inner = slice(0, n - n_kept_tail)
    feature_rows = row_nodes < n_features

    def narrow(mask: Tensor) -> None:
        mask[inner] &= edge_mask[:, inner].any(0)
        has_output = torch.zeros(n, dtype=torch.bool, device=mask.device)
        has_output[row_nodes[feature_rows]] = edge_mask[feature_rows].any(1)
        mask[:n_features] &= has_output[:n_features]

    old = node_mask.clone()
    narrow(node_mask)
    while not torch.equal(node_mask, old):
        old = node_mask.clone()
        edge_mask[~node_mask[row_nodes]] = False
        edge_mask[:, ~node_mask] = False
        narrow(node_mask)
    ordered, order = torch.sort(influence, descending=True)
    cumulative = torch.zeros_like(influence)
    cumulative[order] = torch.cumsum(ordered, dim=0) / ordered.sum()
    return node_mask, edge_mask, cumulative, influence


def graph_scores(
    adjacency: Tensor,
    weights: Tensor,
    *,
    errors: slice,
    tokens: slice,
    row_nodes: Tensor | None = None,
) -> dict[str, float]:
    """circuit-tracer's ``compute_graph_scores``: ``replacement`` = token influence / (token +
    error influence); ``completeness`` = the share of each node's normalised input not from
    error nodes, averaged with weights (influence + logit weight)."""
    row_nodes = _row_nodes(adjacency, row_nodes)
    normalised = normalise_rows(adjacency)
    influence = _series(normalised, weights, row_nodes)
    token, error = influence[tokens].sum(), influence[errors].sum()
    replacement = token / (token + error)
    non_error = torch.ones_like(influence)  # a node without inputs has none from errors
    non_error[row_nodes] = 1 - normalised[:, errors].sum(dim=-1)
    output = influence + weights
    completeness = (non_error * output).sum() / output.sum()
    return {"replacement": float(replacement), "completeness": float(completeness)}


def partial_influences(
    rows: Float[Tensor, "r n"], logit_p: Tensor, row_nodes: Tensor, max_iter: int = 128
) -> Float[Tensor, " n"]:
    """circuit-tracer's ``compute_partial_influences``: influence through the rows computed so
    far (``row_nodes[i]`` is the node of row ``i``; logits are the last nodes), to rank the
    features still to visit under ``max_feature_nodes``: the dense reference of
    :class:`interp.graphs.ranking.Ranking`, which normalises each row once, as it comes."""
    normalised = normalise_rows(rows, RANKING_CLAMP)
    influence = torch.zeros(rows.shape[1], dtype=rows.dtype, device=rows.device)
    prod = torch.zeros(rows.shape[1], dtype=rows.dtype, device=rows.device)
    prod[-len(logit_p) :] = logit_p
    for _ in range(max_iter):
        prod = prod[row_nodes] @ normalised
        if not prod.any():
            return influence
        influence += prod
    raise RuntimeError("feature influence did not converge")
