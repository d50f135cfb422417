"""Helpers shared by the benchmark scripts: timing side by side, and offline test models."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def time_side_by_side(
    fns: dict[str, Callable[[], object]], *, repeat: int = 5, warm_up: bool = True
) -> dict[str, float]:
    """Median seconds of each function, run interleaved (A B C A B C ...) after one warm-up
    each (unless the caller ran them already: ``warm_up=False``), so that drift in the
    machine's load hits every candidate alike."""
    for fn in fns.values() if warm_up else ():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def gpt2_small_shaped(d_vocab: int = 50257, n_ctx: int = 1024, corpus: list[str] | None = None):
    """A random GPT-2-small-shaped model (12 layers, 12 heads, d_model 768), loaded through
    ``interp.load_model`` from a temporary checkpoint; no download."""
    from interp import load_model
    from tests.checkpoints import make_checkpoint

    directory = Path(tempfile.mkdtemp(prefix="interp-bench-"))
    make_checkpoint(
        directory,
        arch="gpt2",
        n_layers=12,
        n_heads=12,
        d_model=768,
        n_ctx=n_ctx,
        vocab_size=600,
        d_vocab=d_vocab,
        corpus=corpus,
        randomize_ln=False,
    )
    return load_model(directory, device="cpu")
