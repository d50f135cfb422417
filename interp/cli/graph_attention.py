"""``interp graph --attention``: each kept edge's head loadings added to edges.csv and
graph.json, in fields circuit-tracer's viewer ignores.

- edges.csv gains a ``heads`` column: ``L{layer}H{head}:{weight}`` for each head carrying the
  edge (largest ``|weight|`` first; ``resid:{weight}`` for the part that crosses no head), the
  loadings summing to the edge's ``weight`` (:mod:`interp.graphs.heads`);
- each link of graph.json gains ``heads``: ``[[layer, head, weight], ...]`` in the same order
  (``[-1, -1, weight]`` for that part).
"""

from __future__ import annotations

import io
import json

import pandas as pd

__all__ = ["add_head_loadings"]


def _label(layer: int, head: int, weight: float) -> str:
    where = "resid" if layer < 0 else f"L{layer}H{head}"
    return f"{where}:{weight:+.6g}"


def add_head_loadings(model, tc, pruned, files: dict[str, str]) -> None:
    """Rewrite ``files["edges.csv"]`` and ``files["graph.json"]`` with the kept edges' head
    loadings (module docstring); edges from logits have none."""
    from interp.graphs.frontend import node_ids
    from interp.graphs.heads import head_loadings

    table = head_loadings(model, tc, pruned)
    ids = node_ids(pruned.nodes, tc.n_layers)
    per_edge: dict[tuple[str, str], list] = {}
    table = table.reindex(table.weight.abs().sort_values(ascending=False).index)
    for row in table.itertuples():
        key = (ids[int(row.source)], ids[int(row.target)])
        per_edge.setdefault(key, []).append([int(row.layer), int(row.head), float(row.weight)])
    edges = pd.read_csv(io.StringIO(files["edges.csv"]), keep_default_na=False)
    edges["heads"] = [
        " ".join(_label(*h) for h in per_edge.get((s, t), []))
        for s, t in zip(edges["source"], edges["target"], strict=True)
    ]
    files["edges.csv"] = edges.to_csv(index=False)
    data = json.loads(files["graph.json"])
    for link in data["links"]:
        link["heads"] = per_edge.get((link["source"], link["target"]), [])
    files["graph.json"] = json.dumps(data) + "\n"
