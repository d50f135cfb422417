"""``interp task``: generate a task file (induction, IOI or greater-than) for a model.

    interp task induction --n 32 --seed 0 --out induction.jsonl
    interp patch --task induction.jsonl --sites heads --out patched/

The generators (:mod:`interp.tasks.generators`) use only words that are one token for the
model's tokenizer and refuse, saying how many they found, when it has too few; the file is
checked against the tokenizer before it is written, atomically (a temporary file beside it,
then one rename), and an existing file is replaced only by a complete new one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from interp.cli.options import MAX_SEED, add_model_option, device, int_between
from interp.cli.output import UsageError, check_out_file, write_file
from interp.cli.sources import load_model

HELP = "generate a task file (induction, ioi or greater-than prompt pairs) for a model as JSONL"
KINDS = ("induction", "ioi", "greater-than")  # interp.tasks generators, by command-line name
MAX_ROWS = 100_000  # a task file is read whole into memory; more is a mistake, not a task
SEQ_LEN = 10  # induction's default repeated length (interp.tasks.induction's)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=KINDS, help="which task to generate")
    add_model_option(parser)
    parser.add_argument(
        "--n", type=int_between(1, MAX_ROWS), default=32, help="rows to generate (default 32)"
    )
    parser.add_argument(
        "--seed", type=int_between(0, MAX_SEED), default=0, help="random seed (default 0)"
    )
    parser.add_argument(
        "--seq-len",
        type=int_between(2),
        default=SEQ_LEN,
        help=f"induction only: tokens repeated (default {SEQ_LEN})",
    )
    parser.add_argument(
        "--names",
        default=None,
        help="ioi only: comma-separated names, each one token for this model after a space "
        "(default: common English names)",
    )
    parser.add_argument(
        "--out", required=True, metavar="FILE.jsonl", help="the task file to write (JSONL)"
    )
    parser.add_argument("--device", type=device, default="cpu", help="torch device (default cpu)")


def _names(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError(f"--names {text!r} is empty; pass comma-separated names such as Mary,John")
    return names


def run(args: argparse.Namespace) -> int:
    out = check_out_file(args.out, suffix=".jsonl")
    if args.kind != "induction" and args.seq_len != SEQ_LEN:
        raise UsageError(f"--seq-len is for induction only, not {args.kind}; leave it out")
    names = _names(args.names)
    if names is not None and args.kind != "ioi":
        raise UsageError(f"--names is for ioi only, not {args.kind}; leave it out")
    print(f"loading {args.model} ...", file=sys.stderr, flush=True)
    model = load_model(args.model, device=args.device)
    # imported only now, so that a refused command line starts fast (docs/commands.md)
    from interp.tasks import TaskError, greater_than, induction, ioi

    try:  # too few single-token words, a seq_len past the context: the command line's fault
        if args.kind == "induction":
            task = induction(model, args.n, seed=args.seed, seq_len=args.seq_len)
        elif args.kind == "ioi":
            task = ioi(model, args.n, seed=args.seed, names=names)
        else:
            task = greater_than(model, args.n, seed=args.seed)
    except (TaskError, ValueError) as exc:
        raise UsageError(str(exc).replace("Pass names=", "Pass --names")) from None
    import json

    # as Task.to_jsonl writes it, through the command line's atomic writer
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in task.to_records())
    path = write_file(Path(out), lines)
    print(f"{args.kind}: {len(task)} rows ({task!r})")
    print(f"wrote {path}")
    return 0
