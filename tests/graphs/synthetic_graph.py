"""Synthetic pruned attribution graphs of any length, in circuit-tracer's frontend JSON (what
``interp.graphs.frontend.frontend_json`` writes), for the page's tests and benchmark.

Built directly, with no model and no ``[N, N]`` adjacency, so a 1,000-token graph costs a
fraction of a second. Shaped like a pruned graph of a long prompt: features and error nodes at
the last position and at a share of earlier ones (by layer), token nodes at those positions
and some others, the logit nodes at the last position; each feature and logit reads a dozen
sources from lower layers at its own or earlier positions (mostly its own), with
heavy-tailed weights of both signs, links by descending ``|weight|``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["synthetic_graph_json"]

WORDS = [" the", " cat", " sat", " on", " mat", ".", "\n", " and", " then", " a", " dog", ","]


def _node(node_id, js_id, feature, layer, pos, kind, influence, activation=None) -> dict:
    return {
        "node_id": node_id, "feature": feature, "layer": layer, "ctx_idx": pos,
        "feature_type": kind, "token_prob": 0.0, "is_target_logit": False, "run_idx": 0,
        "reverse_ctx_idx": 0, "jsNodeId": js_id, "clerp": "", "influence": influence,
        "activation": activation,
    }  # fmt: skip


def synthetic_graph_json(
    n_pos: int,
    *,
    n_layers: int = 12,
    n_logits: int = 10,
    tokens: list[str] | None = None,
    sources_per_target: int = 12,
    active_every: int = 8,
    seed: int = 0,
) -> dict:
    """A pruned graph of ``n_pos`` positions (module docstring): features at about one
    position in ``active_every``; ``tokens`` as given or words."""
    rng = np.random.default_rng(seed)
    tokens = tokens or [WORDS[i % len(WORDS)] for i in range(n_pos)]
    last = n_pos - 1
    n_active = min(last, 4 + n_pos // active_every)  # earlier positions with features
    active = sorted({last, *rng.choice(np.arange(1, last), n_active - 1, replace=False).tolist()})
    nodes, layer_of, pos_of = [], [], []

    def add(node, layer, pos):
        nodes.append(node)
        layer_of.append(layer)
        pos_of.append(pos)

    for pos in range(n_pos):
        if pos in active or pos == 0 or rng.random() < 0.3:
            tid = int(rng.integers(1, 50_000))
            add(_node(f"E_{tid}_{pos}", f"E_{tid}-{pos}", pos, "E", pos, "embedding", 0.1), -1, pos)
    for layer in range(n_layers):
        for pos in active:
            count = int(rng.poisson(3.0 if pos == last else 1.0))
            for f in rng.choice(16_384, count, replace=False).tolist():
                node = _node(
                    f"{layer}_{f}_{pos}", f"{layer}_{f}-0", (layer + f) * (layer + f + 1) // 2 + f,
                    str(layer), pos, "cross layer transcoder", float(rng.random()),
                    float(rng.gamma(2.0)),
                )  # fmt: skip
                add(node, layer, pos)
            if pos == last or rng.random() < 0.4:
                error = _node(f"{layer}_-1_{pos}", f"{layer}_-1-{pos}", -1, str(layer), pos,
                              "mlp reconstruction error", float(rng.random()))  # fmt: skip
                add(error, layer, pos)
    probabilities = np.sort(rng.dirichlet(np.ones(n_logits) * 0.5))[::-1]
    for rank, p in enumerate(probabilities.tolist()):
        tid = 1000 + rank
        logit = _node(f"{n_layers + 1}_{tid}_{last}", f"L_{tid}-{last}", tid, str(n_layers + 1),
                      last, "logit", 1.0)  # fmt: skip
        logit.update(token_prob=p, is_target_logit=rank == 0)
        logit["clerp"] = f'Output "{WORDS[rank % len(WORDS)]}" (p={p:.3f})'
        add(logit, n_layers, last)
    layers, positions = np.array(layer_of), np.array(pos_of)
    is_source = np.array([n["feature_type"] != "logit" for n in nodes])
    is_target = np.array([n["feature_type"] in ("cross layer transcoder", "logit") for n in nodes])
    links = []
    for t in np.flatnonzero(is_target):
        pool = np.flatnonzero(is_source & (layers < layers[t]) & (positions <= positions[t]))
        if not len(pool):
            continue
        near = np.where(
            positions[pool] == positions[t], 8.0, 1.0 / (1 + positions[t] - positions[pool])
        )
        k = min(sources_per_target, len(pool))
        for s in rng.choice(pool, k, replace=False, p=near / near.sum()).tolist():
            sign = 1.0 if rng.random() < 0.7 else -1.0
            weight = sign * float(rng.lognormal(-2.0, 1.0))
            links.append({"source": nodes[s]["node_id"], "target": nodes[t]["node_id"],
                          "weight": weight})  # fmt: skip
    links.sort(key=lambda link: -abs(link["weight"]))
    return {
        "metadata": {
            "slug": "synthetic", "scan": "synthetic", "transcoder_list": [],
            "prompt_tokens": list(tokens), "prompt": "".join(tokens), "node_threshold": 0.8,
            "schema_version": 1,
        },
        "qParams": {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "",
                    "sg_pos": ""},
        "nodes": nodes,
        "links": links,
    }  # fmt: skip
