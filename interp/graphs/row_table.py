"""The rows of an attribution graph as they are computed (:class:`RowTable`): logits first, then
features in the order visited; under ``max_feature_nodes`` their ranking picks the features
still to visit, and at the end only the kept features' columns (and every other node's) stay.

With the dense ranking (:class:`interp.graphs.ranking.Ranking`) the table holds every row over
every column until :func:`kept_columns` drops the unvisited features'. With the sparse ranking
(:class:`interp.graphs.sparse_ranking.SparseRanking`) it holds no row while ranking; once the
features are chosen, :func:`kept_rows` computes the same batches of targets again through the
same row step and stores only the kept columns: the same numbers in the same layout.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.graphs.graph_plan import GraphPlan
from interp.graphs.nodes import Sources
from interp.graphs.ranking import Ranking, ranking_device
from interp.graphs.sparse_ranking import SparseRanking

__all__ = ["RowTable", "certified", "kept_columns", "kept_rows", "new_table"]

logger = logging.getLogger(__name__)


def kept_columns(
    computed: Tensor, row_nodes: Tensor, selected: Tensor, n_feat: int, chunk: int = 256
) -> tuple[Tensor, Tensor]:
    """The rows with only the kept features' columns (and every other node's), and their
    nodes' indices in the graph."""
    columns = torch.cat([selected, torch.arange(n_feat, computed.shape[1])])
    out = torch.empty(computed.shape[0], len(columns), dtype=computed.dtype)
    for i in range(0, len(out), chunk):
        out[i : i + chunk] = computed[i : i + chunk][:, columns]
    moved = torch.full((computed.shape[1],), -1, dtype=torch.long)
    moved[columns] = torch.arange(len(columns))
    return out, moved[row_nodes]


@dataclass
class RowTable:
    """The rows computed so far (logits first, then features in the order visited), every
    source's column; under a cap their ``ranking`` picks the features still to visit. Under the
    sparse ranking no row is stored (``values`` None) until :func:`kept_rows` computes the
    kept columns (``kept``)."""

    values: Float[Tensor, "row col"] | None  # on the host, whatever the device
    nodes: Int[Tensor, " row"]  # each row's node as a column (a logit's after the sources')
    # under a cap: the rows normalised (dense, on the ranking's device) or their large entries
    ranking: Ranking | SparseRanking | None = None
    ranked_on: str | None = None  # that device (kept in the graph's info)
    filled: int = 0
    batches: list[Tensor] = field(default_factory=list)  # the features' batches, in order
    kept: bool = False  # values hold only the kept features' columns (and every other node's)
    rounds: dict = field(default_factory=dict)  # the sparse ranking's rounds (graph.info)

    def add(self, rows: Float[Tensor, "batch col"], nodes: Int[Tensor, " batch"]) -> None:
        end = self.filled + len(nodes)
        if self.values is not None:
            self.values[self.filled : end, : rows.shape[1]].copy_(rows)
        self.nodes[self.filled : end] = nodes
        self.filled = end
        if self.ranking is not None:
            self.ranking.add(rows, nodes)

    def next_round(self, visited: Tensor, plan: GraphPlan) -> Tensor:
        """The features to visit next: every one at once uncapped; under a cap the
        ``round_size`` most influential not visited yet (through the rows so far)."""
        if self.ranking is None:
            return torch.arange(plan.n_active)
        return self.ranking.next_round(visited, min(plan.round_size, plan.n_rows - self.filled))


def new_table(model, tc, src: Sources, plan: GraphPlan, logit_p: Tensor, n_pos: int) -> RowTable:
    """An empty table, with its ranking under a cap: the dense one (its buffer on the device
    where it fits, :func:`interp.graphs.ranking.ranking_device`) or the sparse one (on the
    model's device: the plan counted it there)."""
    dtype, width = src.embed.dtype, src.n_cols + plan.n_logits
    nodes = torch.zeros(plan.n_rows, dtype=torch.long)
    if plan.sparse:
        where = torch.device(model.cfg.device)
        ranking = SparseRanking(
            plan.n_rows, src.n_cols, logit_p, entries=plan.entries, feat_layer=src.feat_layer,
            feat_pos=src.feat_pos, n_layers=tc.n_layers, n_pos=n_pos, device=where,
        )  # fmt: skip
        return RowTable(None, nodes, ranking, str(where))
    # every entry is written but the logits' columns' (no row reads a logit): only they are
    # zeroed first, not gigabytes of table at long prompts
    table = RowTable(torch.empty(plan.n_rows, width, dtype=dtype), nodes)
    table.values[:, src.n_cols :] = 0
    if plan.capped:  # the device holds the estimate less the row table (on the host)
        on_device = plan.estimated_bytes - table.values.numel() * table.values.element_size()
        where = ranking_device(model.cfg.device, on_device)
        table.ranking = Ranking(plan.n_rows, width, logit_p, dtype=dtype, device=where)
        table.ranked_on = str(where)
    return table


def certified(ranking) -> dict:
    """The sparse ranking's rounds and how many were certified (a warning, per graph, where some
    were not); nothing for the dense one."""
    if not isinstance(ranking, SparseRanking):
        return {}
    if ranking.certified < ranking.rounds:
        logger.warning(
            "%d of the sparse ranking's %d rounds were not certified: their features may differ "
            "from the dense ranking's near the cap's edge (the graph's rows are exact)",
            ranking.rounds - ranking.certified, ranking.rounds,
        )  # fmt: skip
    return {
        "ranking_entries": ranking.entries,  # the most a row keeps (its entries >= 1/entries)
        "ranking_rounds": ranking.rounds,
        "ranking_certified": ranking.certified,
    }


def kept_rows(
    table: RowTable, rows_of, src: Sources, plan: GraphPlan, batches, visited: Tensor
) -> None:
    """The sparse ranking's second pass: ``batches`` (the first pass's, in its order: targets
    and their nodes) through the same row step ``rows_of`` (so the numbers the dense ranking's
    table holds), only the kept features' columns (and every other node's) stored, as
    :func:`kept_columns` lays them out."""
    selected = torch.nonzero(visited).flatten()
    width = src.n_cols + plan.n_logits
    columns = torch.cat([selected, torch.arange(plan.n_active, src.n_cols)])
    gather = columns.to(src.embed.device)
    table.values = torch.zeros(plan.n_rows, len(columns) + plan.n_logits, dtype=src.embed.dtype)
    at = 0
    for targets, nodes in batches:
        rows = rows_of(src, *targets)
        table.values[at : at + len(nodes), : len(columns)] = rows[:, gather].cpu()
        at += len(nodes)
    moved = torch.full((width,), -1, dtype=torch.long)
    moved[columns] = torch.arange(len(columns))
    moved[src.n_cols :] = torch.arange(plan.n_logits) + len(columns)
    table.nodes, table.kept = moved[table.nodes], True
