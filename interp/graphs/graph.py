"""An attribution graph: the direct effects between the nodes of one prompt's local
replacement model, and the method's pruning and scores on it.

Nodes (``nodes``, one row each, in adjacency order): transcoder features (``kind ==
"feature"``; ordered by layer, position, feature), error nodes (``"error"``: the MLP output
the transcoders miss, layer-major then position), token nodes (``"token"``: one per position)
and logit nodes (``"logit"``: by descending probability). No feature or error node sits at
position 0 (its MLP output is a constant, as in circuit-tracer). Columns:

- ``kind``; ``layer`` (features, errors; ``-1`` for tokens, ``n_layers`` for logits);
- ``pos`` (the logits': the last position); ``feature`` (``-1`` where none);
- ``token_id`` (the prompt's token at ``pos``; a logit's own token);
- ``activation`` (features; NaN elsewhere); ``probability`` (logits; NaN elsewhere).

``adjacency[t, s]`` is the direct effect of source ``s`` on target ``t`` (row = target,
column = source; signed, raw): only feature and logit rows are nonzero. The graph holds just
those: ``rows [r n]``, the row of node ``row_nodes[i]`` in ``rows[i]`` (any order), so its size
grows with the nodes that have inputs, not with ``n²``; ``adjacency`` builds the dense matrix
on demand (with a warning past :data:`DENSE_LIMIT` bytes: read ``rows`` instead).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.graphs.influence import graph_scores, prune_masks

__all__ = ["DENSE_LIMIT", "NODE_COLUMNS", "NODE_KINDS", "AttributionGraph"]

logger = logging.getLogger(__name__)

DENSE_LIMIT = 4 * 2**30  # bytes: a larger dense adjacency is built with a warning

NODE_KINDS = ("feature", "error", "token", "logit")  # in adjacency order
# the columns of AttributionGraph.nodes
NODE_COLUMNS = ("kind", "layer", "pos", "feature", "token_id", "activation", "probability")


@dataclass(frozen=True, eq=False, init=False)
class AttributionGraph:
    """One prompt's attribution graph (module docstring).

    Made from ``rows`` and ``row_nodes`` (how :func:`interp.attribution_graph` makes it) or
    from a dense ``adjacency`` (its nonzero rows are kept). ``kept_nodes`` and ``kept_edges``
    are None on a graph from :func:`interp.attribution_graph`. :meth:`prune` returns a new
    graph of the kept nodes only: ``kept_nodes`` [n] holds their indices in the unpruned graph,
    its rows their raw entries, and ``kept_edges`` [n n] the edges kept (the pruned graph's
    edges are ``adjacency[kept_edges]``); its ``nodes`` gain ``influence`` (each node's
    influence on the logits in the unpruned graph) and ``cumulative`` (the share of the total
    influence of the nodes at least as influential).
    """

    nodes: pd.DataFrame = field(repr=False)
    rows: Float[Tensor, "row node"] = field(repr=False)
    row_nodes: Int[Tensor, " row"] = field(repr=False)
    tokens: Int[Tensor, " pos"]
    logit_token_ids: Int[Tensor, " logit"]
    logit_probabilities: Float[Tensor, " logit"]
    model_name: str = ""
    transcoder_name: str = ""
    kept_nodes: Int[Tensor, " node"] | None = field(default=None, repr=False)
    kept_edges: Bool[Tensor, "node node"] | None = field(default=None, repr=False)
    info: dict = field(default_factory=dict, repr=False)  # sizes and timings of the build
    # attention decompositions (heads.py, qk.py): {"model", "tc"} the graph was built from;
    # not saved with the graph
    context: dict | None = field(default=None, repr=False, compare=False)

    def __init__(
        self,
        nodes: pd.DataFrame,
        adjacency: Tensor | None = None,
        tokens: Tensor | None = None,
        logit_token_ids: Tensor | None = None,
        logit_probabilities: Tensor | None = None,
        model_name: str = "",
        transcoder_name: str = "",
        kept_nodes: Tensor | None = None,
        kept_edges: Tensor | None = None,
        info: dict | None = None,
        *,
        rows: Tensor | None = None,
        row_nodes: Tensor | None = None,
        context: dict | None = None,
    ):
        n = len(nodes)
        if (adjacency is None) == (rows is None):
            raise ValueError("give an AttributionGraph either adjacency or rows (not both)")
        if adjacency is not None:
            if tuple(adjacency.shape) != (n, n):
                raise ValueError(f"adjacency {tuple(adjacency.shape)} does not match {n} nodes")
            kinds = nodes["kind"].to_numpy()
            row_nodes = torch.from_numpy(np.flatnonzero(np.isin(kinds, ("feature", "logit"))))
            rows = adjacency[row_nodes]
        if row_nodes is None or rows.dim() != 2 or rows.shape != (len(row_nodes), n):
            shape = None if row_nodes is None else (len(row_nodes), n)
            raise ValueError(f"rows {tuple(rows.shape)} do not match {shape} (row_nodes, nodes)")
        if tokens is None or logit_token_ids is None or logit_probabilities is None:
            raise ValueError(
                "an AttributionGraph needs tokens, logit_token_ids, logit_probabilities"
            )
        values = dict(
            nodes=nodes, rows=rows, row_nodes=row_nodes.long(), tokens=tokens,
            logit_token_ids=logit_token_ids, logit_probabilities=logit_probabilities,
            model_name=model_name, transcoder_name=transcoder_name, kept_nodes=kept_nodes,
            kept_edges=kept_edges, info={} if info is None else info, context=context,
        )  # fmt: skip
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @property
    def adjacency(self) -> Float[Tensor, "node node"]:
        """The dense ``[n n]`` matrix (built on each call; a warning past :data:`DENSE_LIMIT`)."""
        n = len(self.nodes)
        size = n * n * self.rows.element_size()
        if size > DENSE_LIMIT:
            logger.warning(
                "building this graph's dense adjacency (%d x %d, %d bytes): its rows "
                "(graph.rows, graph.row_nodes) hold the same entries in %d",
                n, n, size, self.rows.numel() * self.rows.element_size(),
            )  # fmt: skip
        dense = self.rows.new_zeros(n, n)
        dense[self.row_nodes] = self.rows
        return dense

    # ------------------------------------------------------------------ node groups

    def _mask(self, kind: str) -> Tensor:
        return torch.tensor((self.nodes["kind"] == kind).to_numpy())

    def _span(self, kind: str) -> slice:
        where = torch.nonzero(self._mask(kind)).flatten()
        return slice(0, 0) if len(where) == 0 else slice(int(where[0]), int(where[-1]) + 1)

    @property
    def n_features(self) -> int:
        return int(self._mask("feature").sum())

    def logit_weights(self) -> Float[Tensor, " node"]:
        """The logit probabilities on the logit nodes, zero elsewhere (pruning's weights)."""
        weights = torch.zeros(len(self.nodes), dtype=self.rows.dtype)
        weights[self._span("logit")] = self.logit_probabilities.to(self.rows.dtype)
        return weights

    # ------------------------------------------------------------------ the method

    def scores(self) -> dict[str, float]:
        """``{"replacement": ..., "completeness": ...}`` as circuit-tracer's
        ``compute_graph_scores`` defines them (:func:`interp.graphs.influence.graph_scores`)."""
        return graph_scores(
            self.rows.cpu(),
            self.logit_weights(),
            errors=self._span("error"),
            tokens=self._span("token"),
            row_nodes=self.row_nodes,
        )

    def prune(self, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> AttributionGraph:
        """The graph of the nodes and edges kept by circuit-tracer's ``prune_graph`` (tokens
        and logits always kept); see the class docstring for what the result holds."""
        if self.kept_nodes is not None:
            raise ValueError("this graph is pruned already: prune the graph it came from")
        n_tail = len(self.tokens) + len(self.logit_token_ids)
        node_mask, edge_mask, cumulative, influence = prune_masks(
            self.rows.cpu(),
            self.logit_weights(),
            n_features=self.n_features,
            n_kept_tail=n_tail,
            node_threshold=node_threshold,
            edge_threshold=edge_threshold,
            row_nodes=self.row_nodes,
        )
        kept = torch.nonzero(node_mask).flatten()
        new_index = torch.full((len(self.nodes),), -1, dtype=torch.long)
        new_index[kept] = torch.arange(len(kept))
        mine = torch.nonzero(node_mask[self.row_nodes]).flatten()  # the kept nodes' rows
        row_nodes = new_index[self.row_nodes[mine]]
        kept_edges = torch.zeros(len(kept), len(kept), dtype=torch.bool)
        kept_edges[row_nodes] = edge_mask[mine][:, kept]
        nodes = self.nodes.iloc[kept.numpy()].reset_index(drop=True)
        nodes["influence"] = influence[kept].numpy()
        nodes["cumulative"] = cumulative[kept].numpy()
        info = self.info | {"node_threshold": node_threshold, "edge_threshold": edge_threshold}
        return replace(
            self,
            nodes=nodes,
            rows=self.rows[mine][:, kept.to(self.rows.device)],
            row_nodes=row_nodes,
            kept_nodes=kept,
            kept_edges=kept_edges,
            info=info,
        )

    # ------------------------------------------------------------------ attention

    def _context(self) -> tuple:
        if not self.context:
            raise ValueError(
                "this graph holds no model: call interp.graphs.heads.head_loadings / "
                "interp.graphs.qk.qk_attribution with the model and transcoders"
            )
        return self.context["model"], self.context["tc"]

    def __getstate__(self) -> dict:
        # a pickled graph is data: the model and transcoders stay behind
        return {**self.__dict__, "context": None}

    def head_loadings(self, edges=None, **kwargs):
        """Each edge split over attention heads (:func:`interp.graphs.heads.head_loadings`)."""
        from interp.graphs.heads import head_loadings

        return head_loadings(*self._context(), self, edges, **kwargs)

    def qk_attribution(self, layer: int, head: int, query_pos: int, key_pos: int, **kwargs):
        """One head's score at (query, key) over node pairs
        (:func:`interp.graphs.qk.qk_attribution`)."""
        from interp.graphs.qk import qk_attribution

        return qk_attribution(*self._context(), self, layer, head, query_pos, key_pos, **kwargs)

    def __repr__(self) -> str:
        counts = self.nodes["kind"].value_counts()
        parts = ", ".join(f"{counts.get(k, 0)} {k}" for k in NODE_KINDS)
        pruned = "" if self.kept_nodes is None else f", pruned ({int(self.kept_edges.sum())} edges)"
        return (
            f"AttributionGraph({len(self.tokens)} tokens, {len(self.nodes)} nodes: {parts}; "
            f"model {self.model_name!r}, transcoders {self.transcoder_name!r}{pruned})"
        )
