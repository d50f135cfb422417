"""Checks shared by every merge of shards' partial results (``interp merge``): each partial is
of the expected format, all are of one run, and every shard is there exactly once."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["check_one_run", "check_shards"]


def check_one_run(parts: Sequence[dict], fmt: str, command: str, what: str) -> dict:
    """The settings shared by ``parts``; a ValueError naming the first partial that is not of
    format ``fmt`` (written by ``interp {command}``) or is of another run. ``what``: the unit a
    merge takes, for the message (e.g. ``"one task"``)."""
    if not parts:
        raise ValueError("no partial results to merge; pass the output of every shard")
    for number, part in enumerate(parts, start=1):
        if part.get("format") != fmt:
            raise ValueError(
                f"partial {number} is not a partial result of interp {command} (format "
                f"{part.get('format')!r}, expected {fmt!r}); pass the output of each "
                f"interp {command} ... --shard I/N"
            )
    settings = parts[0]["settings"]
    for number, part in enumerate(parts[1:], start=2):
        theirs = part["settings"]
        differ = [k for k in {**settings, **theirs} if theirs.get(k) != settings.get(k)]
        if differ:
            key = differ[0]
            raise ValueError(
                f"partial {number} differs from partial 1 in {', '.join(differ)} ({key}: "
                f"{theirs.get(key)!r} vs {settings.get(key)!r}); merge the shards of {what}"
            )
    return settings


def check_shards(parts: Sequence[dict], n_shards: int) -> None:
    """A ValueError unless the parts are shards ``0 .. n_shards - 1``, each once."""
    shards = sorted(int(p["shard"]) for p in parts)
    if shards != list(range(n_shards)):
        missing = sorted(set(range(n_shards)) - set(shards))
        repeated = sorted({s for s in shards if shards.count(s) > 1})
        what = (
            f"shard(s) {', '.join(map(str, repeated))} given twice"
            if repeated
            else f"shard(s) {', '.join(map(str, missing))} missing"
        )
        raise ValueError(f"{what} of {n_shards}; pass each shard's output once")
