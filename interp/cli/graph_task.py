"""``interp graph --task FILE``: the task graph (:mod:`interp.graphs.task_graph`) of a task
file's rows, pruned, written as ``nodes.csv``, ``edges.csv`` and ``summary.json`` (and
``heads.csv`` with ``--attention``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from interp.cli.options import read_task
from interp.cli.output import UsageError, staged_output

__all__ = ["TASK_FILES", "check_task", "run_task"]

# the files --task may write (heads.csv only with --attention; a stale one is removed)
TASK_FILES = ["nodes.csv", "edges.csv", "summary.json", "heads.csv"]
NODE_COLUMNS = ["node", "kind", "layer", "feature", "position", "count", "activation"]
NODE_COLUMNS += ["probability", "influence", "cumulative"]


def graph_settings(args) -> dict:
    """The options every ``interp graph`` run hands ``attribution_graph``."""
    return {
        "max_feature_nodes": args.max_feature_nodes,
        "max_bytes": args.max_bytes,
        "batch_size": args.batch_size,
        "ranking": args.ranking,
    }


def check_task(args: argparse.Namespace):
    """``--task``'s file read and its rows checked (no model), or None without ``--task``: a
    UsageError otherwise (exit 2)."""
    path = args.task
    if path is None:
        return None
    if args.text is not None:
        raise UsageError("--text is not used with --task (a task graph has no page); leave it out")
    try:
        return read_task(path)
    except OSError as exc:
        raise UsageError(f"--task {path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"--task {path}: not UTF-8 text ({exc.reason})") from None


def run_task(args: argparse.Namespace, model, tc, task, out: Path) -> int:
    """Build, prune and write the task graph; every row checked against the tokenizer first."""
    from interp.graphs.attribute import attribution_graph
    from interp.tasks import TaskError

    try:
        task.tokens(model)
    except TaskError as exc:
        raise UsageError(f"--task: {exc}") from None
    start = time.perf_counter()
    graph = attribution_graph(model, task, tc, **graph_settings(args))
    pruned = graph.prune(args.node_threshold, args.edge_threshold)
    nodes = pruned.nodes.rename_axis("node").reset_index()[NODE_COLUMNS]
    edges = pruned.edges.reindex(pruned.edges["weight"].abs().sort_values(ascending=False).index)
    files = {"nodes.csv": nodes.to_csv(index=False), "edges.csv": edges.to_csv(index=False)}
    if args.attention:
        files["heads.csv"] = pruned.head_loadings().to_csv(index=False)
    kinds = lambda g: g.nodes["kind"].value_counts().to_dict()  # noqa: E731
    summary = {
        "task": str(args.task),
        "rows": len(task),
        "nodes": {"all": len(graph.nodes), "kept": len(pruned.nodes)},
        "nodes_by_kind": {"all": kinds(graph), "kept": kinds(pruned)},
        "edges": {"all": len(graph.edges), "kept": len(pruned.edges)},
        "node_threshold": args.node_threshold,
        "edge_threshold": args.edge_threshold,
        "seconds": round(time.perf_counter() - start, 3),
    }
    files["summary.json"] = json.dumps(summary, indent=2) + "\n"
    with staged_output(out, owns=TASK_FILES) as stage:
        for name, text in files.items():
            stage.write_text(name, text)
    for path in stage.written:
        print(f"wrote {path}")
    print(
        f"{len(task)} rows: {len(graph.nodes)} nodes pruned to {len(pruned.nodes)} with "
        f"{len(pruned.edges)} edges ({summary['seconds']:.1f} s)",
        file=sys.stderr,
    )
    return 0
