"""The files of ``interp discover`` (whole or merged) and ``interp merge`` of its shards.

A whole run writes ``edges.csv``, ``circuit.json``, ``curve.csv``, ``summary.json`` and
``report.html``. Merging shards needs no model and writes the same files but ``curve.csv``,
with ``circuit.json`` saying ``"evaluated": false``: the circuit is known only once the scores
are merged, and its faithfulness needs the model and every row. ``interp merge ... --evaluate``
loads the model the shards name and rebuilds their task (the same file, checked by its
fingerprint, or the same generator, rows and seed) and evaluates the merged circuit: then the
files are the whole run's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from interp.cli.output import UsageError, staged_output, terminal_table

__all__ = [
    "write_results",
    "run_info",
    "merge_discovery",
    "generated_task",
    "GENERATED",
    "EDGE_COLUMNS",
    "CURVE_COLUMNS",
]

FILES = ["edges.csv", "circuit.json", "curve.csv", "summary.json", "report.html", "partial.json"]
EDGE_COLUMNS = ["edge", "source", "target", "score", "in_circuit"]  # edges.csv
CURVE_COLUMNS = ["fraction", "n_edges", "faithfulness"]  # curve.csv
TERMINAL_N = 10
GENERATED = ("induction", "ioi", "greater-than")  # --task names built by interp.tasks' generators
NOT_EVALUATED = (
    "Not evaluated: the shards were merged without the model, so there is no faithfulness or "
    "curve here. Merge again with --evaluate (it loads the model and the task the shards "
    "name), or evaluate circuit.json's edges with interp.discovery.evaluate_circuit."
)


def run_info(source: dict, n_rows: int, fingerprint: str, shards: int) -> dict:
    """summary.json's model, task and examples of a discover run (``source``: where the model
    and the task came from, as the run or its shards recorded it)."""
    task = {"source": source["task"], "n_rows": n_rows, "fingerprint": fingerprint}
    task.update(shards=shards, generated=source["generated"])
    return {"model": source["model"], "task": task, "examples": source["examples"]}


def generated_task(name: str, model, n: int, seed: int):
    """``--task induction``, ``ioi`` or ``greater-than``: the generator's rows for this model
    (UsageError if it cannot make them)."""
    from interp.tasks import TaskError, greater_than, induction, ioi

    generators = {"induction": induction, "ioi": ioi, "greater-than": greater_than}
    try:
        return generators[name](model, n, seed=seed)
    except (TaskError, ValueError) as exc:
        text = str(exc)
        if " Pass names=" in text:  # discover has no --names; interp task has
            text = text.split(" Pass names=")[0] + (
                " Write a task file with interp task ioi --names ... and pass it as --task."
            )
        raise UsageError(f"--task {name}: {text}") from None


def _float(value) -> float | None:
    return None if value is None or not math.isfinite(float(value)) else float(value)


def write_results(out: Path, info: dict, method: str, params: dict, frame, result, ablation):
    """edges.csv, circuit.json, summary.json, report.html, and curve.csv when ``result`` (a
    CircuitEvaluation) is given; a merged run has none (no model to evaluate with)."""
    from interp.pages.discovery import discovery_report

    attrs = frame.attrs
    edges = list(frame.loc[frame["in_circuit"].astype(bool), "edge"])
    curve = None if result is None or result.curve is None else result.curve[CURVE_COLUMNS]
    evaluated = {
        "evaluated": result is not None,
        "ablation": ablation,
        "faithfulness": None if result is None else _float(result.faithfulness),
        "cpr": None if result is None else _float(result.cpr),
        "cmd": None if result is None else _float(result.cmd),
    }
    if result is None:
        evaluated["not_evaluated"] = NOT_EVALUATED
    circuit = {
        "model": info["model"],
        "method": method,
        "parameters": params,
        "edges": edges,
        "n_edges": len(edges),
        "n_total": len(frame),
        **evaluated,
        "task": info["task"],
    }
    summary = {
        **{k: v for k, v in circuit.items() if k != "edges"},
        "clean_metric": float(attrs["clean_metric"]),
        "corrupted_metric": float(attrs["corrupted_metric"]),
        "recovered_undefined": bool(attrs["recovered_undefined"]),
        "examples": info["examples"],
    }
    page = discovery_report(summary, frame[EDGE_COLUMNS], curve).to_html()
    with staged_output(out, owns=FILES) as stage:
        stage.write_text("edges.csv", frame[EDGE_COLUMNS].to_csv(index=False))
        stage.write_text("circuit.json", json.dumps(circuit, indent=2) + "\n")
        if curve is not None:
            stage.write_text("curve.csv", curve.to_csv(index=False))
        stage.write_text("summary.json", json.dumps(summary, indent=2) + "\n")
        stage.write_text("report.html", page)
    faith = evaluated["faithfulness"]
    print(
        f"{method}: {len(edges)} of {len(frame)} edges; faithfulness "
        + ("not evaluated (merged shards)" if result is None else f"{_number(faith)}")
        + ("" if evaluated["cpr"] is None else f", CPR {evaluated['cpr']:.3f}")
        + ("" if evaluated["cmd"] is None else f", CMD {evaluated['cmd']:.3f}")
    )
    top = frame.assign(size=frame["score"].abs()).sort_values("size", ascending=False)
    print(terminal_table(top[EDGE_COLUMNS].head(TERMINAL_N).reset_index(drop=True)))
    for path in stage.written:
        print(f"wrote {path}")
    return 0


def _number(value: float | None) -> str:
    if value is None:
        return "undefined"
    return f"{0.0 if round(value, 3) == 0 else value:.3f}"  # never -0.000


def _task_of(first: dict, settings: dict, model):
    """The shards' task, rebuilt for ``--evaluate``: UsageError when it is not theirs."""
    from interp.cli.options import read_task
    from interp.interventions.shards import task_fingerprint

    source = first["source"]
    made = source["generated"]
    if made is not None:
        task = generated_task(source["task"], model, made["n"], made["seed"])
    else:
        task = read_task(Path(source["task"]))
    if task_fingerprint(task) != settings["task"]:
        raise UsageError(
            f"--evaluate: the task {source['task']} is not the one the shards scored (its rows "
            "changed, or the path means another file here); merge from where the shards ran"
        )
    return task


def merge_discovery(out: Path, folders: list[Path], parts: list[dict], args) -> int:
    """``interp merge`` of ``interp discover ... --shard I/N``: the whole task's edge scores and
    circuit; with ``args.evaluate`` also its faithfulness and curve (module docstring)."""
    from interp.discovery.circuit import circuit_from_scores
    from interp.discovery.shards import merge_discovery_sums

    try:
        frame = merge_discovery_sums(parts)
        cuts = [p["circuit"] for p in parts]
        if any(c != cuts[0] for c in cuts):
            raise ValueError("the shards were run with other --top-n, --threshold or --ablation")
        settings = parts[0]["settings"]
        params = {"metric": settings["metric"]}
        if settings["ig_steps"] is not None:
            params["ig_steps"] = settings["ig_steps"]
        cut = cuts[0]
        circuit = circuit_from_scores(
            frame, settings["method"], top_n=cut["top_n"], threshold=cut["threshold"], params=params
        )
    except (ValueError, KeyError) as exc:
        raise UsageError(f"cannot merge {', '.join(map(str, folders))}: {exc}") from None
    first = next(p for p in parts if p["shard"] == 0)
    info = run_info(first["source"], settings["n_rows"], settings["task"], settings["shards"])
    result = None
    if args.evaluate:
        result = _evaluate(args, first, settings, circuit)
    return write_results(
        out, info, circuit.method, circuit.params, circuit.scores, result, cut["ablation"]
    )


def _evaluate(args, first: dict, settings: dict, circuit):
    import sys

    from interp.cli.sources import load_model

    if first["source"]["generated"] is None:  # a changed file is refused before loading
        _task_of(first, settings, None)
    print(f"loading {first['source']['model']} ...", file=sys.stderr, flush=True)
    model = load_model(first["source"]["model"], device=args.device)
    from interp.discovery import EdgeGraph, evaluate_circuit
    from interp.tasks import TaskError

    task = _task_of(first, settings, model)
    if list(EdgeGraph.from_model(model).edge_names) != list(circuit.scores["edge"]):
        raise UsageError(f"--evaluate: {first['source']['model']} is not the shards' model")
    try:
        task.tokens(model)
    except TaskError as exc:
        raise UsageError(f"--task: {exc}") from None
    ablation = first["circuit"]["ablation"]
    print(f"evaluating the circuit of {len(circuit)} edges ...", file=sys.stderr, flush=True)
    return evaluate_circuit(
        model, task, circuit, ablation=ablation, metric=settings["metric"], progress=True
    )
