"""Argument types shared by the commands: bounded numbers, de-duplicated lists, devices.

Each is an ``argparse`` ``type=``: a bad value stops the command before anything loads, with
exit code 2 and a message that says what was wrong and what to pass instead::

    parser.add_argument("--top-k", type=int_between(1, 100), default=5)
    parser.add_argument("--layers", type=int_between(0), nargs="+")  # then unique(args.layers)
    parser.add_argument("--device", type=device, default="cpu")
    parser.add_argument("--shard", type=shard, metavar="I/N")  # "--shard -1/2" refused too

Bounds that depend on the model (a layer past the last one, a top-k above the vocabulary)
are checked right after it loads, before any work, with :func:`check_at_most`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from interp.cli.output import UsageError
from interp.foundation.sizes import parse_size

__all__ = [
    "int_between",
    "int_list",
    "unique",
    "device",
    "memory_size",
    "model_name",
    "shard",
    "attach_values",
    "read_task",
    "TASK_METRICS",
    "check_at_most",
    "check_wrong",
    "add_model_option",
    "add_out_dir",
    "DEFAULT_MODEL",
]

TASK_METRICS = ("logit_diff", "prob_diff")  # interp.interventions.inputs's, torch-free
# options whose value may start with "-": argparse would take "--shard -1/2" for two options
VALUE_OPTIONS = ("--shard",)
DEFAULT_MODEL = "tiny-induction"  # bundled, so every command works offline out of the box

MAX_SEED = 2**63 - 1  # torch.manual_seed takes any 64-bit value


def _parse_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def _bounds(low: int | None, high: int | None) -> str:
    if low is not None and high is not None:
        return f"from {low} to {high}"
    return f"at least {low}" if low is not None else f"at most {high}"


def int_between(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number in ``[low, high]`` (either end may be open)."""

    def parse(text: str) -> int:
        value = _parse_int(text)
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {_bounds(low, high)}, got {value}")
        return value

    parse.__name__ = "whole number"  # argparse names the type in some messages
    parse.bounds = _bounds(low, high) if (low, high) != (None, None) else None  # for --help
    return parse


def int_list(low: int | None = None, high: int | None = None) -> Callable[[str], list[int]]:
    """An argparse type: comma-separated whole numbers, each in ``[low, high]``, duplicates
    dropped, in increasing order (``"20,10,10"`` -> ``[10, 20]``)."""

    def parse(text: str) -> list[int]:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        try:
            values = [int(p) for p in parts]
        except ValueError:
            values = []
        if not values:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated whole numbers such as 10,20, got {text!r}"
            )
        bad = [
            v for v in values if (low is not None and v < low) or (high is not None and v > high)
        ]
        if bad:
            raise argparse.ArgumentTypeError(
                f"each value must be {_bounds(low, high)}, got {', '.join(map(str, bad))}"
            )
        return unique(values)

    parse.__name__ = "list of whole numbers"
    parse.bounds = f"each {_bounds(low, high)}" if (low, high) != (None, None) else None
    return parse


def unique(values: Iterable[int] | None) -> list[int] | None:
    """Sorted, without repeats (``--layers 2 0 0`` -> ``[0, 2]``); None stays None."""
    return None if values is None else sorted(set(values))


# interp.engine.parse_size's grammar (a test keeps them in step), here without its torch import
def memory_size(text: str) -> str:
    """An argparse type: a memory size such as ``500MB`` or ``1GiB`` (what
    :func:`interp.foundation.sizes.parse_size` reads, torch-free), returned as written; the library
    parses it."""
    try:
        parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def shard(text: str) -> tuple[int, int]:
    """An argparse type: ``I/N`` with ``0 <= I < N`` (shard I of N)."""
    index, slash, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i, n = -1, 0
    if not slash or n < 1 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(
            f"a shard is I/N with 0 <= I < N (rows I, I+N, ... of the task; e.g. 0/4), got {text!r}"
        )
    return i, n


def attach_values(argv: Sequence[str]) -> list[str]:
    """``--shard -1/2`` as ``--shard=-1/2``, so that argparse checks the value (and refuses it
    in one line that says what a shard is) instead of taking it for an option."""
    out: list[str] = []
    for item in argv:
        if out and out[-1] in VALUE_OPTIONS and item.startswith("-") and item[1:2] != "-":
            out[-1] = f"{out[-1]}={item}"
            continue
        out.append(item)
    return out


def read_task(path: Path):
    """A ``--task`` file, its structure checked row by row (no model needed): a UsageError if
    it cannot be used."""
    from interp.tasks import Task, TaskError

    try:
        return Task.from_csv(path) if path.suffix.lower() == ".csv" else Task.from_jsonl(path)
    except TaskError as exc:
        raise UsageError(f"--task: {exc}") from None


def model_name(text: str) -> str:
    """An argparse type: a model name or path that is not empty."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "is empty; pass a hub name such as gpt2, a checkpoint "
            "directory, or a bundled model (interp models)"
        )
    return text


def add_out_dir(parser: argparse.ArgumentParser) -> None:
    """``--out DIR``: where a command writes its files."""
    parser.add_argument("--out", type=Path, required=True, help="output directory")


def add_model_option(parser: argparse.ArgumentParser) -> None:
    """``--model``, the same for every command: a hub name, a checkpoint directory or a
    bundled model, the bundled one by default."""
    parser.add_argument(
        "--model",
        type=model_name,
        default=DEFAULT_MODEL,
        help=f"hub name, checkpoint directory or bundled model (default {DEFAULT_MODEL})",
    )


def _available_devices() -> tuple[list[str], str]:
    """The device kinds this torch offers here, and a hint for the ones it does not."""
    import torch

    kinds = ["cpu"]
    if torch.cuda.is_available():
        kinds.append("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        kinds.append("mps")
    return kinds, (
        "this torch build has no CUDA"
        if torch.version.cuda is None
        else "torch has CUDA but sees no GPU here"
    )


def device(text: str) -> str:
    """An argparse type: a torch device that exists here (``cpu``, ``cuda``, ``cuda:1``,
    ``mps``), checked before any model loads."""
    name = text.strip().lower()
    if name == "cpu":
        return name  # no torch import for the default
    kind, _, index = name.partition(":")
    kinds, cuda_hint = _available_devices()
    if kind not in ("cuda", "mps") or (index and not index.isdigit()):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; use one of {', '.join(kinds)}")
    if kind not in kinds:
        hint = cuda_hint if kind == "cuda" else "MPS (Apple GPU) is not available here"
        raise argparse.ArgumentTypeError(f"{hint}; use --device cpu")
    if kind == "cuda" and index:
        import torch

        count = torch.cuda.device_count()
        if int(index) >= count:
            raise argparse.ArgumentTypeError(
                f"there is no {name}: torch sees {count} GPU(s), cuda:0 to cuda:{count - 1}"
            )
    return name


def check_at_most(option: str, values: int | Iterable[int] | None, limit: int, why: str) -> None:
    """After the model loads: refuse option values above ``limit`` (exit code 2), e.g.
    ``check_at_most("--layers", args.layers, n_layers - 1, "the model has 2 layers")``."""
    if values is None:
        return
    items = [values] if isinstance(values, int) else list(values)
    bad = [v for v in items if v > limit]
    if bad:
        raise UsageError(f"{option} {' '.join(map(str, bad))}: at most {limit} ({why})")


def check_wrong(args: argparse.Namespace) -> None:
    """``--wrong``: left out, or one token other than ``--answer``."""
    if args.wrong is not None and not args.wrong:
        raise UsageError("--wrong is empty; pass one token, or leave --wrong out")
    if args.wrong is not None and args.wrong == args.answer:
        raise UsageError(
            "--wrong is the same token as --answer: their difference is 0 by "
            "definition; pass another token, or leave --wrong out"
        )
