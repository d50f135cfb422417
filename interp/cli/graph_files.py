"""The files of ``interp graph``, made from a graph and its pruned graph: graph.json
(circuit-tracer's frontend format), nodes.csv, edges.csv, report.html and the summary."""

from __future__ import annotations

import argparse
import json
import time

__all__ = ["graph_outputs"]


def _counts(nodes) -> dict[str, int]:
    counts = nodes["kind"].value_counts()
    return {kind: int(counts.get(kind, 0)) for kind in ("feature", "error", "token", "logit")}


def graph_outputs(
    model, tc, graph, pruned, args: argparse.Namespace, texts, built_s: float
) -> tuple[dict[str, str], dict]:
    """``({file name: text}, summary)`` for every file but summary.json (the caller adds it
    once the total time is known)."""
    from interp.graphs.frontend import edge_table, frontend_json, node_ids
    from interp.graphs.reading import read_prediction
    from interp.pages.graph import graph_page

    start = time.perf_counter()
    decode = model.tokenizer.decode
    token_strings = [decode([int(t)]) for t in graph.tokens]
    logit_strings = [decode([int(t)]) for t in graph.logit_token_ids]
    prompt = args.prompt if args.prompt is not None else "".join(token_strings)
    data = frontend_json(
        pruned,
        token_strings,
        logit_strings,
        prompt=prompt,
        slug="graph",
        scan=tc.name,
        n_layers=tc.n_layers,
        node_threshold=args.node_threshold,
    )
    ids = node_ids(pruned.nodes, tc.n_layers)
    nodes = pruned.nodes.copy()
    nodes.insert(0, "node_id", ids)
    edges = edge_table(pruned, ids)
    if getattr(args, "attention", False):  # head loadings and QK pairs (graph_attention.py)
        from interp.cli.graph_attention import add_attention

        edges = add_attention(model, graph.context["tc"], pruned, data, edges)
    details = _details(model, tc, pruned, texts)
    scores = graph.scores()
    info = _info(args, tc, token_strings, prompt, scores, texts)
    reading = read_prediction(pruned, token_strings, logit_strings)
    page = graph_page(
        data,
        details,
        title=f"Attribution graph: {args.model}",
        n_layers=tc.n_layers,
        info=info,
        reading=reading,
        transcoder_kind=tc.kind,
    )
    summary = _summary(args, graph, pruned, prompt, logit_strings, len(edges), reading, scores)
    summary["seconds"] = {
        "graph": round(built_s, 3),
        "files": round(time.perf_counter() - start, 3),
    }
    files = {
        "graph.json": json.dumps(data) + "\n",
        "nodes.csv": nodes.to_csv(index=False),
        "edges.csv": edges.to_csv(index=False),
        "report.html": page,
    }
    return files, summary


def _details(model, tc, pruned, texts) -> dict:
    """The page's top contexts of each kept feature, by ``"{layer}_{feature}"``."""
    from interp.graphs.details import feature_details

    features = pruned.nodes[pruned.nodes["kind"] == "feature"]
    wanted = sorted({(int(r.layer), int(r.feature)) for r in features.itertuples()})
    details = feature_details(model, tc, wanted, texts=texts, n_tokens=16384)
    return {f"{layer}_{f}": value for (layer, f), value in details.items()}


def _info(args, tc, token_strings, prompt: str, scores: dict, texts) -> list[str]:
    """The page's lines about the run: model, transcoders, prompt, scores, contexts."""
    return [
        f"model: {args.model}",
        f"transcoders: {args.transcoders} ({tc.kind}, {tc.activation}, {tc.d_tc} features "
        "per layer)",
        f"prompt ({len(token_strings)} tokens): {prompt}",
        f"replacement score {scores['replacement']:.4f}, completeness "
        f"{scores['completeness']:.4f}; pruned at node threshold {args.node_threshold}, edge "
        f"threshold {args.edge_threshold}",
        "top contexts: "
        + (f"on {args.text}" if texts is not None else "none (pass --text FILE to scan a text)"),
    ]


def _summary(args, graph, pruned, prompt, logit_strings, n_edges, reading, scores) -> dict:
    """summary.json's figures but ``seconds``."""
    return {
        "model": str(args.model),
        "transcoders": str(args.transcoders),
        "prompt": prompt,
        "tokens": [int(t) for t in graph.tokens],
        "logits": [
            {"token": s, "token_id": int(i), "probability": float(p)}
            for s, i, p in zip(
                logit_strings, graph.logit_token_ids, graph.logit_probabilities, strict=True
            )
        ],
        "active_features": int(graph.info.get("active_features", 0)),
        "nodes": {"all": len(graph.nodes), "kept": len(pruned.nodes)},
        "nodes_by_kind": {"all": _counts(graph.nodes), "kept": _counts(pruned.nodes)},
        "edges_kept": n_edges,
        "adjacency_bytes": int(graph.adjacency.numel() * graph.adjacency.element_size()),
        "reading": reading,
        "scores": scores,
        "pruned_scores": pruned.scores(),
        "node_threshold": args.node_threshold,
        "edge_threshold": args.edge_threshold,
        "max_feature_nodes": args.max_feature_nodes,
        # how the kept features were ranked (None: uncapped), and the sparse ranking's rounds
        # certified to pick the dense ranking's features (docs/graphs.md)
        "ranking": {
            key: graph.info.get(f"ranking_{key}")
            for key in ("mode", "entries", "rounds", "certified")
        },
    }
