"""The features to visit next under ``max_feature_nodes``: circuit-tracer's rounds, ranked by
influence through the rows computed so far (its ``compute_partial_influences``), without
normalising every row again each round.

A row never changes once computed, so its normalised ``|row|`` (each row divided by its sum,
clamped at circuit-tracer's ``1e-8``: :data:`interp.graphs.influence.RANKING_CLAMP`) is written
once, as its batch comes, into a buffer of every row to come (:class:`Ranking`), and so is
its ``[row row]`` block at the rows' own nodes; a round runs the series ``w R̂ + w R̂² + ...``
on the block and passes over the buffer once (:meth:`Ranking.influence`). The buffer lives on
the model's device where it is CUDA and the device's free memory holds what the build puts
there (:func:`ranking_device`; the series then runs there, as circuit-tracer's does), else on
the host. The result is :func:`interp.graphs.influence.partial_influences` of the rows so far
to float rounding (the same sum in another order; tests/graphs/test_graph_ranking.py).
"""

from __future__ import annotations

import logging

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.foundation.fallbacks import warn_fallback
from interp.foundation.sizes import format_size
from interp.graphs.budget import free_bytes
from interp.graphs.influence import RANKING_CLAMP

__all__ = ["Ranking", "ranking_device"]

logger = logging.getLogger(__name__)


class Ranking:
    """The rows computed so far, normalised as they come, and the influence through them."""

    def __init__(
        self, n_rows: int, n_cols: int, logit_p: Float[Tensor, " logit"], *, dtype, device
    ) -> None:
        # filled by add, batch by batch (no pass to zero it first: rows of 1e5-1e6 columns)
        self.normalised: Float[Tensor, "row col"] = torch.empty(
            n_rows, n_cols, dtype=dtype, device=device
        )
        self.row_nodes: Int[Tensor, " row"] = torch.zeros(n_rows, dtype=torch.long, device=device)
        self.weights = torch.zeros(n_cols, dtype=dtype, device=device)  # logits last
        self.weights[-len(logit_p) :] = logit_p.to(device=device, dtype=dtype)
        # [row row]: what each row passes to each row's node, kept up to date as rows come
        self.block = torch.zeros(n_rows, n_rows, dtype=dtype, device=device)
        self.filled = 0

    def add(self, rows: Float[Tensor, "batch col"], nodes: Int[Tensor, " batch"]) -> None:
        """Rows (their first columns; the rest are zero) of nodes ``nodes``, normalised."""
        end = self.filled + len(nodes)
        block = self.normalised[self.filled : end]
        block[:, : rows.shape[1]].copy_(rows)
        block[:, rows.shape[1] :] = 0
        block.abs_()
        block.div_(block.sum(dim=1, keepdim=True).clamp(min=RANKING_CLAMP))
        self.row_nodes[self.filled : end] = nodes
        new = self.row_nodes[self.filled : end]
        self.block[self.filled : end, :end] = block[:, self.row_nodes[:end]]
        self.block[: self.filled, self.filled : end] = self.normalised[: self.filled][:, new]
        self.filled = end

    def influence(self, max_iter: int = 128) -> Float[Tensor, " col"]:
        """Each node's influence on the weighted logits through the rows so far.

        circuit-tracer's series ``p_{k+1} = p_k[row_nodes] @ R̂`` passes on only what reaches
        the rows' own nodes, so with ``q_0`` the logits' weights at the rows' nodes and
        ``q_{k+1} = q_k @ R̂[:, row_nodes]`` (a rows x rows block) the influence is
        ``(q_0 + q_1 + ...) @ R̂``: one pass over the buffer instead of one a step (a deep
        model's series takes ~15), the steps on the block. The same sum in another order: equal
        to the step-by-step series to float rounding (tests/graphs/test_graph_ranking.py)."""
        normalised, row_nodes = self.normalised[: self.filled], self.row_nodes[: self.filled]
        block = self.block[: self.filled, : self.filled]
        q = self.weights[row_nodes]
        reaching = torch.zeros_like(q)
        for _ in range(max_iter):
            if not q.any():
                return reaching @ normalised
            reaching += q
            q = q @ block
        raise RuntimeError("feature influence did not converge")

    def next_round(self, visited: Bool[Tensor, " feature"], size: int) -> Int[Tensor, " round"]:
        """The ``size`` most influential features not ``visited`` yet, in (layer, pos) order
        (each batch then reaches fewer positions), on the host."""
        influence = self.influence()[: len(visited)]
        rank = torch.argsort(influence, descending=True)
        pending = rank[~visited.to(rank.device)[rank]][:size].cpu()
        return pending.sort().values


def ranking_device(device: torch.device | str, need: int, free: int | None = None) -> torch.device:
    """Where the ranking's buffer lives: on a CUDA ``device`` whose free memory (``free``, or
    read now) holds what the build ``need``s there (its estimate, which counts the buffer, less
    the row table, which stays on the host), else on the host (a warning, once, where a CUDA
    device lacks the room: ranking on the host runs slower)."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.device("cpu")
    free = free_bytes(device) if free is None else free
    if need <= free:
        return device
    warn_fallback(
        logger, "graph-ranking-on-host",
        "the ranking under max_feature_nodes runs on the host: the build needs about %s, more "
        "than the %s free on %s (slower; lower max_feature_nodes or free device memory)",
        format_size(need), format_size(free), device,
    )  # fmt: skip
    return torch.device("cpu")
