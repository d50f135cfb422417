"""``interp graph --prompts FILE``: the graph of each line of FILE, each in a folder of its own
under ``--out`` (``prompt_000/``, ``prompt_001/``, ... in the file's order, each holding the
files of a one-prompt run), and ``index.json`` listing them.

The file is read and checked before the model loads: one prompt a line, UTF-8, no blank line
(a blank line is refused rather than skipped, so that folder ``prompt_007`` is always line 8).
Every prompt is tokenised and checked before the first graph is built
(:func:`interp.graphs.many.iter_graphs`). The folders are staged and moved into ``--out``
together with the index at the end (docs/commands.md's contract: all or nothing); a graph at
a time is held in memory.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from interp.cli.output import OutputError, UsageError, staged_output

__all__ = ["INDEX", "folder_names", "read_prompts", "run_prompts"]

INDEX = "index.json"  # the file listing the prompts' folders, in --out
_FOLDER = re.compile(r"prompt_\d+")


def read_prompts(path: Path) -> list[str]:
    """The prompts of ``path``, one a line; refused (exit 2) when it cannot be read, is empty
    or has a blank line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--prompts {path}: cannot read it as UTF-8 text ({exc})") from None
    lines = text.splitlines()
    if not lines:
        raise UsageError(f"--prompts {path} is empty; write one prompt a line")
    blank = [i + 1 for i, line in enumerate(lines) if not line.strip()]
    if blank:
        shown = ", ".join(map(str, blank[:5])) + (" ..." if len(blank) > 5 else "")
        raise UsageError(
            f"--prompts {path}: {'line' if len(blank) == 1 else 'lines'} {shown} "
            f"{'is' if len(blank) == 1 else 'are'} blank; write one prompt a line, with no blank "
            "lines (folder prompt_N is line N + 1)"
        )
    return lines


def folder_names(n: int) -> list[str]:
    """``prompt_000`` ... in order, zero-padded to at least 3 digits so they sort as listed."""
    width = max(3, len(str(n - 1)))
    return [f"prompt_{i:0{width}d}" for i in range(n)]


def _write(stage, folder: str, files: dict[str, str]) -> None:
    from interp.pages import html  # looked up at call time (tests replace it)

    (stage.path / folder).mkdir()
    for name, text in files.items():
        try:
            html.write_text_atomic(stage.path / folder / name, text)
        except OSError as exc:
            raise OutputError(
                f"could not write {stage.out / folder / name}: {exc.strerror or exc}; "
                f"{stage.out} was left as it was"
            ) from None


def run_prompts(
    args: argparse.Namespace, model, tc, prompts: list[str], texts, out: Path, files: list[str]
) -> int:
    """Build, prune and write the graph of each prompt (module docstring), each folder holding
    ``files`` (those of a one-prompt run); exit code 0."""
    from interp.cli.graph_files import graph_outputs
    from interp.cli.graph_task import graph_settings
    from interp.graphs.attribute import attribution_graph
    from interp.graphs.many import iter_graphs

    try:
        graphs = iter_graphs(
            attribution_graph,
            model,
            prompts,
            tc,
            graph_settings(args),
        )
    except ValueError as exc:  # a prompt too long for the context, say
        raise UsageError(f"--prompts {args.prompts}: {exc}") from None
    names, entries = folder_names(len(prompts)), []
    owned = (
        [p.name for p in out.glob("prompt_*") if _FOLDER.fullmatch(p.name)] if out.is_dir() else []
    )
    with staged_output(out, owns=[INDEX, *owned]) as stage:
        for name, prompt in zip(names, prompts, strict=True):
            start = time.perf_counter()
            graph = next(graphs)
            built = time.perf_counter() - start
            pruned = graph.prune(args.node_threshold, args.edge_threshold)
            one = argparse.Namespace(**{**vars(args), "prompt": prompt})
            written, summary = graph_outputs(model, tc, graph, pruned, one, texts, built)
            summary["seconds"]["total"] = round(time.perf_counter() - start, 3)
            written["summary.json"] = json.dumps(summary, indent=2) + "\n"
            _write(stage, name, {f: written[f] for f in files})
            entries.append(
                {
                    "folder": name,
                    "prompt": prompt,
                    "tokens": len(summary["tokens"]),
                    "nodes_kept": summary["nodes"]["kept"],
                    "edges_kept": summary["edges_kept"],
                    "top_logit": summary["logits"][0],
                    "scores": summary["scores"],
                }
            )
            print(
                f"{name}: {summary['nodes']['kept']} nodes, {summary['edges_kept']} edges, "
                f"replacement score {summary['scores']['replacement']:.3f} ({built:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
        index = {"model": str(args.model), "transcoders": str(args.transcoders), "prompts": entries}
        stage.write_text(INDEX, json.dumps(index, indent=2) + "\n")
    for path in stage.written:
        print(f"wrote {path}")
    return 0
