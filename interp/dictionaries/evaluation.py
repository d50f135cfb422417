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

from torch import Tensor

__all__ = ["CentredSquares"]


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
