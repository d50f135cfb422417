"""A graph build's decisions, made before it starts from :mod:`interp.graphs.budget`'s estimate
(:func:`plan_graph`): the features kept, the ranking under a cap (dense or sparse), the batch
the memory allows (``max_bytes``, else the memory free on the model's device) and the rounds
(:class:`GraphPlan`)."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from interp.engine.estimates import parse_size
from interp.engine.plan import MemoryBudgetError
from interp.foundation.sizes import format_size
from interp.graphs.budget import HEADROOM, choose_batch, graph_bytes, least_bytes
from interp.graphs.sparse_ranking import choose_entries, warn_sparse

__all__ = ["GraphPlan", "plan_graph"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GraphPlan:
    """A graph build's decisions, made before it starts (:func:`plan_graph`)."""

    n_active: int  # active features (positions 1 onwards): the rows' feature columns
    keep: int  # features given a row: every active one, or at most max_feature_nodes
    n_logits: int
    batch: int  # targets per backward pass: the batch asked for, halved to fit the memory
    # features ranked per round under a cap: 4 x the batch asked for (circuit-tracer's
    # rounds), whatever batch the memory allows, so any budget keeps the same features
    round_size: int
    estimated_bytes: int  # graph_bytes at ``batch``
    one_copy: bool = False  # rows by the one-copy backward (interp.graphs.vjp), not batched
    # under a cap, the sparse ranking's most entries a row (interp.graphs.sparse_ranking), where
    # it ranks (the dense ranking does not fit, or it was asked for); None: the dense ranking
    entries: int | None = None

    @property
    def n_rows(self) -> int:
        """Rows computed: the logits' first, then the kept features'."""
        return self.keep + self.n_logits

    @property
    def capped(self) -> bool:
        """Whether features are ranked by influence (some active ones get no row)."""
        return self.keep < self.n_active

    @property
    def sparse(self) -> bool:
        """Whether the sparse ranking ranks the features (and the kept rows are computed
        again)."""
        return self.capped and self.entries is not None


def plan_graph(
    model,
    tc,
    n_pos: int,
    *,
    n_active: int,
    n_logits: int,
    source_bytes: int,
    block_bytes: int | None = None,
    max_feature_nodes: int | None,
    batch_size: int | None,
    max_bytes: int | str | None,
    free: int | None,
    one_copy: bool = False,
    ranking: str = "auto",
) -> GraphPlan:
    """The plan of a graph of ``n_active`` active features and ``n_logits`` logits (arguments as
    :func:`interp.attribution_graph`'s; ``free``: the memory free on the device, which bounds the
    batch without ``max_bytes``; ``one_copy``: the row step is the one-copy backward). Under
    ``max_bytes`` the estimate fills at most ``max_bytes - HEADROOM`` (see ``HEADROOM``); a
    graph that cannot fit even at its smallest batch is refused (``MemoryBudgetError``); one
    the free memory cannot hold is warned of. ``ranking`` (``attribution_graph``'s) under a
    cap: ``"auto"`` the dense ranking where it fits the room, else the sparse one (a warning,
    once)."""
    keep = n_active if max_feature_nodes is None else min(int(max_feature_nodes), n_active)

    def any_ranking(batch: int, entries: int | None = None) -> int:
        return graph_bytes(
            model, tc, n_pos, n_active=n_active, keep=keep, n_logits=n_logits, batch=batch,
            source_bytes=source_bytes, one_copy=one_copy, block_bytes=block_bytes,
            entries=entries,
        )  # fmt: skip

    asked = 64 if batch_size is None else int(batch_size)
    batch = max(1, min(asked, keep + n_logits))
    room = free if max_bytes is None else parse_size(max_bytes) - HEADROOM  # (HEADROOM)
    least = lambda e: least_bytes(functools.partial(any_ranking, entries=e), batch)  # noqa: E731
    entries = choose_entries(ranking, keep < n_active, least, room)
    if entries is not None and ranking == "auto":
        where = "max_bytes allows" if max_bytes is not None else f"free on {model.cfg.device}"
        warn_sparse(least(None), room, where, entries)

    def sized(batch: int) -> int:
        return any_ranking(batch, entries)

    if max_bytes is not None:
        need = least_bytes(sized, batch)
        if need > room:
            n_nodes = keep + int(tc.n_layers) * (n_pos - 1) + n_pos + n_logits
            need += HEADROOM
            raise MemoryBudgetError(
                f"this graph ({n_nodes} nodes, {n_pos} positions) needs at least {need} bytes "
                f"({format_size(need)}, {format_size(HEADROOM)} of it headroom) at its smallest "
                f"batch; raise max_bytes to {need} or lower max_feature_nodes"
            )
        batch = choose_batch(sized, batch, room)
    else:
        batch = _batch_in_free_memory(sized, batch, free, model.cfg.device, batch_size is None)
    return GraphPlan(n_active, keep, n_logits, batch, 4 * asked, sized(batch), one_copy, entries)


def _batch_in_free_memory(sized, batch: int, free: int | None, device, default: bool) -> int:
    """``batch`` halved while ``sized(batch)`` exceeds ``free``; a batch asked for (not the
    ``default``) that is lowered, or one row that does not fit, is warned of."""
    if free is None and default:
        raise RuntimeError(
            "the host's available memory cannot be read here; pass max_bytes or batch_size"
        )
    budget = free if free is not None else sized(batch)
    chosen = choose_batch(sized, batch, budget)
    if not default and chosen < batch:
        logger.warning(
            "batch_size %d needs about %s, more than the %s free on %s: batch %d instead",
            batch, format_size(sized(batch)), format_size(budget), device, chosen,
        )  # fmt: skip
    if sized(chosen) > budget:
        logger.warning(
            "this graph needs about %s with one row per pass, more than the %s free on %s",
            format_size(sized(chosen)), format_size(budget), device,
        )  # fmt: skip
    return chosen
