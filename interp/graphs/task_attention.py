"""Head loadings and QK attribution on a task graph (:mod:`interp.graphs.task_graph`): each
row's decomposition on its own graph (:mod:`interp.graphs.heads`, :mod:`interp.graphs.qk`),
its nodes mapped to the task graph's, averaged over the rows.

- Head loadings: a row's loadings of an edge aligned to the task edge (a role's several logits
  summed), a row without the edge counting 0, so an edge's mean loadings sum to its mean weight.
- QK attribution between two named positions: the rows where both positions exist, each row's
  pair contributions with its nodes mapped to the task graph's (a node the pruned task graph
  dropped is ``other``), averaged over those rows; they sum to the rows' mean score.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

__all__ = ["task_head_loadings", "task_qk_attribution"]

HEAD_COLUMNS = ["target", "source", "layer", "head", "weight"]


def _task_rows(tg) -> np.ndarray:
    """Each unpruned node's row in ``tg.nodes`` (-1 where pruning dropped it)."""
    if not tg.graphs:
        raise ValueError("this task graph holds no per-row graphs (it was loaded, not built)")
    if tg.kept_nodes is None:
        return np.arange(len(tg.nodes))
    n = max(int(ids.max()) + 1 for ids in tg.node_ids if len(ids))
    rows = np.full(max(n, int(tg.kept_nodes.max()) + 1), -1)
    rows[tg.kept_nodes] = np.arange(len(tg.kept_nodes))
    return rows


def _names(tg) -> list[str]:
    return list(dict.fromkeys(tg.nodes["position"]))


def task_head_loadings(tg, edges=None) -> pd.DataFrame:
    """Each edge's head loadings averaged over the rows: ``target, source, layer, head,
    weight`` (``residual`` rows as :func:`interp.graphs.heads.head_loadings` gives them).
    ``edges``: ``(target, source)`` row numbers of ``tg.nodes``; None: every edge of ``tg``."""
    to_task = _task_rows(tg)
    pairs = tg.edges[["target", "source"]].to_numpy() if edges is None else edges
    pairs = {(int(t), int(s)) for t, s in np.asarray(pairs, dtype=np.int64).reshape(-1, 2)}
    frames = []
    for g, node_ids in zip(tg.graphs, tg.node_ids, strict=True):
        mine = to_task[node_ids]  # this row's nodes as task rows
        local = torch.nonzero(g.adjacency != 0).numpy()
        local = [(a, b) for a, b in local if (mine[a], mine[b]) in pairs]
        if not local:
            continue
        table = g.head_loadings(edges=local)
        table["target"], table["source"] = mine[table["target"]], mine[table["source"]]
        frames.append(table)
    if not frames:
        return pd.DataFrame(columns=HEAD_COLUMNS)
    both = pd.concat(frames, ignore_index=True)
    both["weight"] = both["weight"].astype("float64")  # exact sums of float32s
    summed = both.groupby(HEAD_COLUMNS[:-1], sort=True)["weight"].sum().reset_index()
    summed["weight"] /= tg.n_prompts
    return summed


def task_qk_attribution(
    tg, layer: int, head: int, query: str, key: str, *, top: int | None = None
) -> pd.DataFrame:
    """Head ``head`` of ``layer``'s score from position ``query`` to position ``key`` (position
    keys as in ``tg.nodes["position"]``, e.g. ``"END"``, ``"A"``) over pairs of task nodes:
    ``query_node, key_node`` (rows of ``tg.nodes``; -1 for ``other``, ``constant``, ``bias``),
    ``query_id, key_id`` (``"feature L1 f20 @END"``, or those names), ``contribution`` (the
    mean over the rows used), the largest ``|contribution|`` first; ``top`` keeps the largest.
    ``attrs``: ``score`` (the mean of the rows' scores; without ``top`` the contributions sum
    to it), ``rows`` (how many rows have both positions, the key not after the query)."""
    to_task = _task_rows(tg)
    labels = [f"{n.kind} L{n.layer} f{n.feature} @{n.position}" for n in tg.nodes.itertuples()]
    frames, scores = [], []
    for g, node_ids, keys in zip(tg.graphs, tg.node_ids, tg.row_positions, strict=True):
        if query not in keys or key not in keys or keys.index(key) > keys.index(query):
            continue
        table = g.qk_attribution(layer, head, keys.index(query), keys.index(key))
        mine = to_task[node_ids]
        for side in ("query", "key"):
            local = table[f"{side}_node"].to_numpy()
            mapped = np.where(local >= 0, mine[np.maximum(local, 0)], -1)
            named = np.asarray(labels, dtype=object)[np.maximum(mapped, 0)]
            table[f"{side}_id"] = np.where(
                mapped >= 0, named, np.where(local >= 0, "other", table[f"{side}_id"])
            )
            table[f"{side}_node"] = mapped
        frames.append(table)
        scores.append(table.attrs["score"])
    if not frames:
        raise ValueError(
            f"no row has both positions {query!r} and {key!r} with the key not after the query; "
            f"name positions as the task graph's nodes do ({', '.join(_names(tg)[:8])}, ...)"
        )
    both = pd.concat(frames, ignore_index=True)
    both["contribution"] = both["contribution"].astype("float64")  # exact sums of float32s
    keys = ["query_node", "key_node", "query_id", "key_id"]
    out = both.groupby(keys, sort=False)["contribution"].sum().reset_index()
    out["contribution"] /= len(frames)
    out = out.reindex(out["contribution"].abs().sort_values(ascending=False).index)
    out = out.reset_index(drop=True)
    if top is not None:
        out = out.head(int(top))
    out.attrs = {"score": float(np.mean(scores)), "rows": len(frames), "layer": layer,
                 "head": head, "query": query, "key": key}  # fmt: skip
    return out
