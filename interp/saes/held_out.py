"""An SAE's held-out figures (:func:`interp.train_sae`'s report): from every held-out
activation at once, or pass by pass for a training within ``max_bytes`` (the same sums, with
``Σ ||x - mean(x)||²`` combined from each pass's:
:class:`interp.dictionaries.evaluation.CentredSquares`).

    L0 = mean_tokens #{j: f_j > 0}
    explained variance = 1 - Σ_tokens ||x - x̂||² / Σ_tokens ||x - mean_tokens(x)||²
    MSE = mean_tokens,dims (x - x̂)²
    dead features: never active (f_j > 0) on any held-out token
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from jaxtyping import Float
from torch import Tensor

from interp.dictionaries.evaluation import CentredSquares
from interp.saes.sae import SAE

__all__ = ["figures", "streamed_figures"]


def _figures(sae: SAE, passes, chunk: int, total: float | None = None) -> dict:
    """The figures over every pass, ``chunk`` tokens encoded at a time; ``total``:
    ``Σ ||x - mean(x)||²``, or None to combine it pass by pass."""
    active, error, l0, n, d = None, 0.0, 0.0, 0, 0
    squares = CentredSquares()
    for x in passes:
        if active is None:
            active = torch.zeros(sae.d_sae, dtype=torch.bool, device=x.device)
        for part in x.split(chunk):
            f = sae.encode(part)
            error += (part - sae.decode(f)).pow(2).sum().item()
            l0 += (f > 0).sum().item()
            active |= (f > 0).any(0)
        if total is None:
            squares.add(x)
        n, d = n + len(x), x.shape[1]
    dead = tuple(torch.nonzero(~active).flatten().tolist())
    return {
        "l0": l0 / n,
        "explained_variance": 1 - error / (squares.total.sum().item() if total is None else total),
        "mse": error / (n * d),
        "dead_fraction": len(dead) / sae.d_sae,
        "dead_features": dead,
    }


@torch.no_grad()
def figures(sae: SAE, x: Float[Tensor, "n d_in"], chunk: int) -> dict:
    """L0, explained variance, MSE and dead features on the held-out activations ``x``."""
    return _figures(sae, [x], chunk, (x - x.mean(0)).pow(2).sum().item())


@torch.no_grad()
def streamed_figures(sae: SAE, passes: Iterable[Float[Tensor, "n d_in"]], chunk: int) -> dict:
    """The same figures over the held-out activations of every pass."""
    return _figures(sae, passes, chunk)
