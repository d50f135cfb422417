"""Held-out figures of a trained dictionary, computed pass by pass, so that a training within
``max_bytes`` never holds every held-out activation at once (:mod:`interp.stores.budget`).

The figures' sums (errors, active features, L0) add up chunk by chunk as they always did; the
one figure that needs every token at once, ``Σ_tokens ||x - mean_tokens(x)||²`` (the variance
explained and the FVU divide by it), is combined from each pass's own mean and centred sum of
squares (Chan, Golub and LeVeque 1979), in float64:

    M2 = M2_a + M2_b + ||mean_b - mean_a||² · n_a n_b / (n_a + n_b)

which equals the sum over all tokens exactly in real arithmetic; in floating point it differs
from the sum over one ``[n d]`` tensor by rounding only (tests/stores/test_stores_budget.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from torch import Tensor

__all__ = ["CentredSquares", "held_out_sums"]


class CentredSquares:
    """``Σ_tokens (x - mean_tokens(x))²`` per column of ``x [tokens ...]``, pass by pass."""

    def __init__(self):
        self.n, self.mean, self.m2 = 0, None, None

    def add(self, x: Tensor) -> None:
        """Take in one pass's ``[tokens ...]`` values."""
        x = x.double()
        n_b, mean_b = len(x), x.mean(0)
        m2_b = (x - mean_b).pow(2).sum(0)
        if self.n == 0:
            self.n, self.mean, self.m2 = n_b, mean_b, m2_b
            return
        n = self.n + n_b
        delta = mean_b - self.mean
        self.m2 = self.m2 + m2_b + delta.pow(2) * (self.n * n_b / n)
        self.mean = self.mean + delta * (n_b / n)
        self.n = n

    @property
    def total(self) -> Tensor:
        """The per-column sums, float64 ``[...]``."""
        if self.m2 is None:
            raise ValueError("no values were added")
        return self.m2

    def __len__(self) -> int:
        return self.n


def held_out_sums(
    passes: Iterable[tuple[Tensor, ...]],
    chunk: int,
    tally: Callable[..., None],
    squares: CentredSquares | None = None,
) -> int:
    """Hand every pass's tensors (``[tokens ...]`` each, the same tokens) to ``tally``
    ``chunk`` tokens at a time, and each pass's last tensor (the one reconstructed) to
    ``squares``; returns the number of tokens."""
    n = 0
    for tensors in passes:
        for part in zip(*(t.split(chunk) for t in tensors), strict=True):
            tally(*part)
        if squares is not None:
            squares.add(tensors[-1])
        n += len(tensors[0])
    return n
