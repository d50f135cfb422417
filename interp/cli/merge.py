"""``interp merge``: the shards of ``interp patch --task ... --shard I/N`` (or of ``interp
attribute --task ... --shard I/N``, or of ``interp discover ... --shard I/N``) into the whole
run.

    interp patch --task t.jsonl --shard 0/3 --out s0   # on three machines, any order
    interp patch --task t.jsonl --shard 1/3 --out s1
    interp patch --task t.jsonl --shard 2/3 --out s2
    interp merge s0 s1 s2 --out merged                 # patching.csv, summary.json, report.html

The merge needs no model: each shard's ``partial.json`` holds per-site sums and squares of the
rows' patched metric and each row's clean and corrupted metric. (The shards of ``interp
discover`` hold sums of edge scores; ``--evaluate`` loads their model to measure the merged
circuit: :mod:`interp.cli.discover_results`.) It refuses shards of different
tasks or settings, a shard given twice or missing (exit 2, nothing written), and writes the
files of the whole run (:mod:`interp.interventions.shards`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from interp.cli import attribute
from interp.cli.options import add_out_dir, device
from interp.cli.output import UsageError, check_out_dir

HELP = (
    "combine the partial.json of every shard of interp patch --task --shard (or interp "
    "attribute --task --shard, or interp discover --shard) into the whole run"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "shards", nargs="+", type=Path, metavar="DIR", help="the --out folder of every shard"
    )
    add_out_dir(parser)
    parser.add_argument(
        "--evaluate",
        action="store_true",
        help="shards of interp discover: load the model and the task they name and measure the "
        "merged circuit's faithfulness and curve",
    )
    parser.add_argument(
        "--device", type=device, default="cpu", help="with --evaluate: torch device (default cpu)"
    )


def _read(folder: Path) -> dict:
    path = folder / "partial.json" if folder.is_dir() else folder
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(
            f"{folder} has no partial.json; pass the --out folder of each "
            "interp patch --task ... --shard I/N"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    out = check_out_dir(args.out)
    parts = [_read(folder) for folder in args.shards]
    if str(parts[0].get("format", "")).startswith("interp-discover-partial/"):
        from interp.cli.discover_results import merge_discovery

        return merge_discovery(out, args.shards, parts, args)
    if args.evaluate or args.device != "cpu":
        raise UsageError("--evaluate and --device are for the shards of interp discover")
    if attribute.is_attribution_partial(parts[0]):
        return _merge_attribution(out, args.shards, parts)
    from interp.cli.patch_files import write_results
    from interp.interventions.shards import merge_partial_sums

    try:
        frame = merge_partial_sums(parts)
    except (ValueError, KeyError) as exc:
        raise UsageError(f"cannot merge {', '.join(map(str, args.shards))}: {exc}") from None
    return write_results(out, parts, frame)


def _merge_attribution(out: Path, folders: list[Path], parts: list[dict]) -> int:
    """The shards of ``interp attribute --task ... --shard I/N``: attribution.csv and the rest."""
    from interp.attribution.shards import merge_attribution_sums

    try:
        frame = merge_attribution_sums(parts)
    except (ValueError, KeyError) as exc:
        raise UsageError(f"cannot merge {', '.join(map(str, folders))}: {exc}") from None
    return attribute.write_results(out, parts, frame)
