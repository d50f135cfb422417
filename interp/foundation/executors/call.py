"""What every worker runs: one shard of a job, an exception turned into its one line."""

from __future__ import annotations

__all__ = ["call_shard", "one_line"]


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``: what the user sees of a worker's exception."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def call_shard(job, index: int, count: int) -> dict:
    """``{"result": job(index, count)}``, or ``{"error": one line}`` when it raises."""
    try:
        return {"result": job(index, count)}
    except Exception as exc:  # the worker reports it; the driver retries or names the shard
        return {"error": one_line(exc)}
