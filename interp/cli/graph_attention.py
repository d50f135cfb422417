"""``interp graph --attention``: each kept edge's head loadings and its heads' strongest QK
pairs, added to edges.csv, graph.json and the page, in fields circuit-tracer's viewer ignores.

- edges.csv gains a ``heads`` column: ``L{layer}H{head}:{weight}`` for each head carrying the
  edge (largest ``|weight|`` first; ``resid:{weight}`` for the part that crosses no head), the
  loadings summing to the edge's ``weight`` (:mod:`interp.graphs.heads`);
- each link of graph.json gains ``heads``: ``[[layer, head, weight], ...]`` in the same order
  (``[-1, -1, weight]`` for that part);
- graph.json gains ``qk``: for the strongest :data:`MAX_QK_SCORES` (layer, head, query
  position, key position) of the links' loadings (ranked by the largest ``|weight|`` a head
  carries between those positions; the query is the target's position, the key the source's),
  ``{"layer", "head", "query_pos", "key_pos", "score", "pairs"}``: the head's pre-softmax
  score there and its :data:`TOP_QK_PAIRS` largest terms ``[query node id, key node id,
  contribution]`` (:func:`interp.graphs.qk.qk_attribution`; ``other``, ``constant`` and
  ``bias`` name the terms that are no node). Each costs one frozen pass and ``2 x d_head``
  backward rows, so the bound keeps both the command's time and the page small.
"""

from __future__ import annotations

import pandas as pd

__all__ = ["MAX_QK_SCORES", "TOP_QK_PAIRS", "add_attention"]

MAX_QK_SCORES = 16  # (layer, head, query, key) decompositions in graph.json (~1 s each on CPU)
TOP_QK_PAIRS = 5  # the largest (query node, key node) terms kept of each


def _label(layer: int, head: int, weight: float) -> str:
    where = "resid" if layer < 0 else f"L{layer}H{head}"
    return f"{where}:{weight:+.6g}"


def _qk(model, tc, pruned, table: pd.DataFrame, pos: list[int]) -> list[dict]:
    heads = table[table.layer >= 0]
    strongest: dict[tuple[int, int, int, int], float] = {}
    for row in heads.itertuples():
        key = (int(row.layer), int(row.head), pos[int(row.target)], pos[int(row.source)])
        strongest[key] = max(strongest.get(key, 0.0), abs(float(row.weight)))
    chosen = sorted(strongest, key=lambda k: (-strongest[k], k))[:MAX_QK_SCORES]
    from interp.graphs.qk import qk_attribution

    out = []
    for layer, head, q, k in chosen:
        part = qk_attribution(model, tc, pruned, layer, head, q, k, top=TOP_QK_PAIRS)
        out.append(
            {
                "layer": layer,
                "head": head,
                "query_pos": q,
                "key_pos": k,
                "score": float(part.attrs["score"]),
                "pairs": [
                    [str(r.query_id), str(r.key_id), float(r.contribution)]
                    for r in part.itertuples()
                ],
            }
        )
    return out


def add_attention(model, tc, pruned, data: dict, edges: pd.DataFrame) -> pd.DataFrame:
    """Add the kept edges' head loadings to frontend JSON ``data`` (in place) and return
    ``edges`` with its ``heads`` column; add ``data["qk"]`` (module docstring). Edges from
    logits have no loadings."""
    from interp.graphs.frontend import node_ids
    from interp.graphs.heads import head_loadings

    table = head_loadings(model, tc, pruned)
    ids = node_ids(pruned.nodes, tc.n_layers)
    per_edge: dict[tuple[str, str], list] = {}
    table = table.reindex(table.weight.abs().sort_values(ascending=False).index)
    for row in table.itertuples():
        key = (ids[int(row.source)], ids[int(row.target)])
        per_edge.setdefault(key, []).append([int(row.layer), int(row.head), float(row.weight)])
    edges = edges.copy()
    edges["heads"] = [
        " ".join(_label(*h) for h in per_edge.get((s, t), []))
        for s, t in zip(edges["source"], edges["target"], strict=True)
    ]
    for link in data["links"]:
        link["heads"] = per_edge.get((link["source"], link["target"]), [])
    data["qk"] = _qk(model, tc, pruned, table, [int(p) for p in pruned.nodes["pos"]])
    return edges
