"""A pruned attribution graph as circuit-tracer's frontend JSON (its viewer's and Neuronpedia's
``graph.json``), and as node and edge tables.

The JSON is ``{"metadata", "qParams", "nodes", "links"}`` as circuit-tracer 0.5's
``frontend/graph_models.py`` writes it: a node has ``node_id``, ``feature``, ``layer`` (a
string: ``"E"`` for tokens, ``n_layers + 1`` for logits), ``ctx_idx`` (its position),
``feature_type`` (``"cross layer transcoder"``, ``"mlp reconstruction error"``,
``"embedding"``, ``"logit"``), ``jsNodeId``, ``clerp``, ``influence``, ``activation``,
``token_prob`` and ``is_target_logit``; a link is ``{"source", "target", "weight"}`` (source
and target node ids, the raw signed ``adjacency[target, source]``).

Node ids never collide. circuit-tracer names an error node ``0_{layer}_{pos}`` (the id of the
layer-0 feature ``layer`` at position ``pos``) and ``{layer}_{pos}-0`` in the viewer (the
viewer id of feature ``pos`` of that layer); here an error node is ``{layer}_-1_{pos}`` and
``{layer}_-1-{pos}``: feature index -1 is never a feature's.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

__all__ = ["FEATURE_TYPES", "edge_table", "frontend_json", "node_ids"]

FEATURE_TYPES = {  # node kind -> circuit-tracer's feature_type
    "feature": "cross layer transcoder",  # what circuit-tracer writes for every transcoder
    "error": "mlp reconstruction error",
    "token": "embedding",
    "logit": "logit",
}


def _cantor(x: int, y: int) -> int:
    """circuit-tracer's ``feature`` number of feature ``y`` of layer ``x``."""
    return (x + y) * (x + y + 1) // 2 + y


def _ids(kind: str, layer: int, pos: int, feature: int, token_id: int, n_layers: int):
    """(node_id, jsNodeId) of one node (module docstring)."""
    if kind == "feature":
        return f"{layer}_{feature}_{pos}", f"{layer}_{feature}-0"
    if kind == "error":
        return f"{layer}_-1_{pos}", f"{layer}_-1-{pos}"
    if kind == "token":
        return f"E_{token_id}_{pos}", f"E_{token_id}-{pos}"
    return f"{n_layers + 1}_{token_id}_{pos}", f"L_{token_id}-{pos}"


def node_ids(nodes: pd.DataFrame, n_layers: int) -> list[str]:
    """The frontend ``node_id`` of every row of a graph's ``nodes``, in order."""
    return [
        _ids(k, int(la), int(p), int(f), int(t), n_layers)[0]
        for k, la, p, f, t in zip(
            nodes["kind"], nodes["layer"], nodes["pos"], nodes["feature"], nodes["token_id"],
            strict=True,
        )
    ]  # fmt: skip


def _number(value) -> float | None:
    value = float(value)
    return None if value != value else value  # NaN -> null


def edge_table(graph, ids: Sequence[str]) -> pd.DataFrame:
    """The kept edges of a pruned graph: ``source``, ``target`` (node ids), ``weight`` (raw
    ``adjacency[target, source]``), by descending ``|weight|``."""
    if graph.kept_edges is None:
        raise ValueError("edge_table takes a pruned graph: call graph.prune() first")
    targets, sources = graph.kept_edges.nonzero(as_tuple=True)
    weights = graph.adjacency[targets, sources].double()
    order = weights.abs().argsort(descending=True)
    return pd.DataFrame(
        {
            "source": [ids[i] for i in sources[order].tolist()],
            "target": [ids[i] for i in targets[order].tolist()],
            "weight": weights[order].numpy(),
        }
    )


def frontend_json(
    graph,
    token_strings: Sequence[str],
    logit_strings: Sequence[str],
    *,
    prompt: str,
    slug: str,
    scan: str,
    n_layers: int,
    node_threshold: float | None = None,
    supernodes: Sequence[Sequence[str]] = (),
) -> dict:
    """circuit-tracer's frontend JSON of a pruned ``graph`` (module docstring).

    Args:
        token_strings: the prompt's tokens as text, one per position.
        logit_strings: each logit node's token as text, in the graph's logit order.
        supernodes: named groups ``[name, node_id, node_id, ...]`` kept in ``qParams``.
    """
    if graph.kept_edges is None:
        raise ValueError("frontend_json takes a pruned graph: call graph.prune() first")
    out = _frontend_nodes(graph.nodes, logit_strings, n_layers)
    ids = [n["node_id"] for n in out]
    if len(set(ids)) != len(ids):
        raise RuntimeError("two nodes share a node_id; this is a bug in interp")
    known = set(ids)
    for group in supernodes:
        if len(group) < 2 or any(i not in known for i in group[1:]):
            raise ValueError(f"supernode {list(group)[:1]} names nodes that are not in the graph")
    links = edge_table(graph, ids)
    return {
        "metadata": {
            "slug": slug,
            "scan": scan,
            "transcoder_list": [],
            "prompt_tokens": list(token_strings),
            "prompt": prompt,
            "node_threshold": node_threshold,
            "schema_version": 1,
        },
        "qParams": {
            "pinnedIds": [],
            "supernodes": [list(g) for g in supernodes],
            "linkType": "both",
            "clickedId": "",
            "sg_pos": "",
        },
        "nodes": out,
        "links": [
            {"source": s, "target": t, "weight": float(w)}
            for s, t, w in zip(links["source"], links["target"], links["weight"], strict=True)
        ],
    }


def _frontend_nodes(nodes: pd.DataFrame, logit_strings: Sequence[str], n_layers: int) -> list[dict]:
    """The JSON's node entries, in the graph's order; the first logit is the target."""
    out = []
    logit_rank = 0
    for row in nodes.itertuples(index=False):
        node_id, js_id = _ids(row.kind, row.layer, row.pos, row.feature, row.token_id, n_layers)
        entry = {
            "node_id": node_id,
            "feature": {
                "feature": _cantor(int(row.layer), int(row.feature)),
                "error": -1,
                "token": int(row.pos),
                "logit": int(row.token_id),
            }[row.kind],
            "layer": {"token": "E", "logit": str(n_layers + 1)}.get(row.kind, str(row.layer)),
            "ctx_idx": int(row.pos),
            "feature_type": FEATURE_TYPES[row.kind],
            "token_prob": 0.0,
            "is_target_logit": False,
            "run_idx": 0,
            "reverse_ctx_idx": 0,
            "jsNodeId": js_id,
            "clerp": "",
            "influence": _number(row.influence),
            "activation": _number(row.activation) if row.kind == "feature" else None,
        }
        if row.kind == "logit":
            p = float(row.probability)
            text = logit_strings[logit_rank]
            entry.update(token_prob=p, is_target_logit=logit_rank == 0)
            entry["clerp"] = f'Output "{text}" (p={p:.3f})'
            logit_rank += 1
        out.append(entry)
    return out
