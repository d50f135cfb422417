"""``interp graph``: the attribution graph of one prompt through transcoders, pruned, as
circuit-tracer's frontend JSON, node and edge tables, a summary and an offline explorer page."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from interp.cli.graph_task import check_task, graph_settings, run_task
from interp.cli.options import add_model_option, add_out_dir, device, int_between, memory_size
from interp.cli.output import UsageError, check_out_dir, staged_output
from interp.cli.sources import BUNDLED_DIR, check_source, load_model

HELP = (
    "the attribution graph of a prompt through transcoders (features, errors, tokens, "
    "logits), pruned; write graph.json (circuit-tracer's format), nodes.csv, edges.csv, "
    "summary.json and report.html (with --prompts, a folder of them per prompt)"
)
FILES = ["graph.json", "nodes.csv", "edges.csv", "summary.json", "report.html"]
CONTEXT_TOKENS = 16384  # tokens of --text scanned for each feature's top contexts
# bundled models -> the bundled transcoder set trained on them: --transcoders may be left out
BUNDLED_TRANSCODERS = {"tiny-induction": "tiny-induction-transcoders"}


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, got {value}")
    return value


def _token_ids(text: str) -> list[int]:
    parts = [p.strip() for p in text.split(",")]
    if not all(re.fullmatch(r"\d+", p) for p in parts):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated token ids such as 0,15,27, got {text!r}"
        )
    return [int(p) for p in parts]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_option(parser)
    parser.add_argument(
        "--transcoders",
        default=None,
        help="a transcoder folder (circuit-tracer's format, or SAELens transcoder folders), or "
        "a bundled set; for the bundled tiny-induction it defaults to tiny-induction-transcoders "
        "and is required for any other model",
    )
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt", help="the text the model reads (BOS added as the model does)")
    given.add_argument(
        "--tokens", type=_token_ids, help="token ids, comma-separated, taken as they are"
    )
    given.add_argument("--task", type=Path, help="a task file: its rows' graph (docs/graphs.md)")
    given.add_argument(
        "--prompts",
        type=Path,
        help="a UTF-8 file of prompts, one a line: a graph each, in --out/prompt_000/ ... "
        "with index.json listing them",
    )
    add_out_dir(parser)
    parser.add_argument(
        "--node-threshold", type=_fraction, default=0.8, help="share of influence kept (0.8)"
    )
    parser.add_argument(
        "--edge-threshold", type=_fraction, default=0.98, help="share of edge influence kept"
    )
    parser.add_argument(
        "--max-feature-nodes",
        type=int_between(1),
        default=None,
        help="keep at most this many features, the most influential (default all)",
    )
    parser.add_argument(
        "--max-bytes",
        type=memory_size,
        default=None,
        help="memory budget of the graph (adjacency, rows, frozen pass), e.g. 2GB",
    )
    parser.add_argument(
        "--ranking",
        choices=("auto", "dense", "sparse"),
        default="auto",
        help="how features are ranked under --max-feature-nodes: dense (every row over every "
        "active feature, circuit-tracer's), sparse (each row's largest entries, bounded; the "
        "kept rows exact), auto (dense where it fits, default)",
    )
    parser.add_argument(
        "--text",
        type=Path,
        default=None,
        help="a UTF-8 text file: each kept feature's top contexts on it go on the page",
    )
    parser.add_argument(
        "--batch-size", type=int_between(1, 4096), default=64, help="targets per backward pass"
    )
    parser.add_argument("--device", type=device, default="cpu", help="torch device (default cpu)")
    parser.add_argument(
        "--attention",
        action="store_true",
        help="add each kept edge's head loadings to edges.csv and graph.json (a 'heads' field) "
        "and its heads' strongest QK pairs to graph.json ('qk') and the page",
    )


def _saelens(folder: Path) -> bool:
    """A SAELens folder, or a folder holding some (torch-free: the files only)."""
    files = ("cfg.json", "sae_weights.safetensors")
    return any(
        all((f / name).is_file() for name in files)
        for f in [folder, *(p for p in folder.iterdir() if p.is_dir())]
    )


def _check_transcoders(name: str) -> None:
    """The folder or bundled set exists (torch-free, before the model loads)."""
    path = Path(name)
    if path.is_dir() and ((path / "config.yaml").is_file() or _saelens(path)):
        return
    if re.fullmatch(r"[\w.-]+", name) and (BUNDLED_DIR / name / "config.yaml").is_file():
        return
    if path.is_dir():
        raise UsageError(
            f"--transcoders {name}: the folder has no config.yaml (circuit-tracer's) and no "
            "SAELens transcoder folders (cfg.json + sae_weights.safetensors)"
        )
    raise UsageError(
        f"--transcoders {name}: no such folder or bundled transcoder set; pass a folder in "
        "circuit-tracer's format or tiny-induction-transcoders"
    )


def _bundled_model(name: str) -> str | None:
    """The bundled model ``name`` names (by its short name or its folder), or None."""
    if name in BUNDLED_TRANSCODERS:
        return name
    path = Path(name).expanduser()
    return next(
        (
            b
            for b in BUNDLED_TRANSCODERS
            if path.is_dir() and path.resolve() == (BUNDLED_DIR / b).resolve()
        ),
        None,
    )


def _default_transcoders(args: argparse.Namespace) -> str:
    """``--transcoders`` as given, or the bundled set of a bundled model (torch-free)."""
    if args.transcoders is not None:
        return args.transcoders
    bundled = _bundled_model(args.model)
    if bundled is None:
        raise UsageError(
            f"--transcoders is required for {args.model}: only the bundled "
            f"{', '.join(BUNDLED_TRANSCODERS)} has a default set; pass a transcoder folder "
            "trained on this model"
        )
    return BUNDLED_TRANSCODERS[bundled]


def _check_args(args: argparse.Namespace) -> list[str] | None:
    if args.prompt is not None and not args.prompt.strip():
        raise UsageError("--prompt is empty; pass the text the model reads")
    if args.tokens is not None and len(args.tokens) < 2:
        raise UsageError(
            "--tokens: the prompt needs at least 2 tokens (position 0 has no feature nodes)"
        )
    if args.ranking == "sparse" and args.max_feature_nodes is None:
        raise UsageError(
            "--ranking sparse ranks features under a cap: pass --max-feature-nodes N as well"
        )
    if args.prompts is not None:
        from interp.cli.graph_prompts import read_prompts

        args.prompt_list = read_prompts(args.prompts)
    args.transcoders = _default_transcoders(args)
    _check_transcoders(args.transcoders)
    args.task_rows = check_task(args)  # --task: interp/cli/graph_task.py
    if args.text is None:
        return None
    try:
        text = args.text.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--text {args.text}: cannot read it as UTF-8 text ({exc})") from None
    if not text.strip():
        raise UsageError(f"--text {args.text} is empty")
    return [text]


def _tokens(model, args: argparse.Namespace):
    import torch

    n_ctx, d_vocab = int(model.cfg.n_ctx), int(model.cfg.d_vocab)
    if args.tokens is not None:
        bad = [t for t in args.tokens if t >= d_vocab]
        if bad:
            raise UsageError(f"--tokens {bad[0]}: at most {d_vocab - 1} (the model's vocabulary)")
        tokens = torch.tensor(args.tokens)
    else:
        from interp.engine import to_tokens

        try:
            tokens = to_tokens(model, args.prompt)[0].cpu()
        except ValueError as exc:  # longer than the context, say
            raise UsageError(f"--prompt: {exc}") from None
    if len(tokens) > n_ctx:
        raise UsageError(f"the prompt has {len(tokens)} tokens but the model's context is {n_ctx}")
    if len(tokens) < 2:
        raise UsageError("the prompt needs at least 2 tokens (position 0 has no feature nodes)")
    return tokens


def run(args: argparse.Namespace) -> int:
    out = check_out_dir(args.out)
    texts = _check_args(args)
    from interp.transcoders.loading import (
        TranscoderFitError,
        TranscoderLoadError,
        check_transcoders_fit,
        load_transcoders,
    )

    check_source(args.model)  # a --model folder that cannot load fails before the transcoders
    try:  # before the model: a damaged file or config.yaml is refused at once, named
        tc = load_transcoders(args.transcoders, device=args.device)
    except TranscoderLoadError as exc:
        raise UsageError(f"--transcoders {args.transcoders}: {exc}") from None
    print(f"loading {args.model} ...", file=sys.stderr, flush=True)
    model = load_model(args.model, device=args.device)
    try:
        check_transcoders_fit(model, tc)
    except TranscoderFitError as exc:
        raise UsageError(f"--transcoders {args.transcoders}: {exc}") from None
    if args.task is not None:
        return run_task(args, model, tc, args.task_rows, out)
    if args.prompts is not None:
        from interp.cli.graph_prompts import run_prompts

        return run_prompts(args, model, tc, args.prompt_list, texts, out, FILES)
    tokens = _tokens(model, args)
    from interp.cli.graph_files import graph_outputs
    from interp.graphs.attribute import attribution_graph

    start = time.perf_counter()
    graph = attribution_graph(model, tokens, tc, **graph_settings(args), progress=True)
    built = time.perf_counter() - start
    pruned = graph.prune(args.node_threshold, args.edge_threshold)
    files, summary = graph_outputs(model, tc, graph, pruned, args, texts, built)
    summary["seconds"]["total"] = round(time.perf_counter() - start, 3)
    files["summary.json"] = json.dumps(summary, indent=2) + "\n"
    with staged_output(out, owns=FILES) as stage:
        for name in FILES:
            stage.write_text(name, files[name])
    for path in stage.written:
        print(f"wrote {path}")
    print(
        f"{summary['nodes']['all']} nodes ({summary['active_features']} active features) "
        f"pruned to {summary['nodes']['kept']} with {summary['edges_kept']} edges; replacement "
        f"score {summary['scores']['replacement']:.3f}, completeness "
        f"{summary['scores']['completeness']:.3f} ({built:.1f} s)",
        file=sys.stderr,
    )
    return 0
