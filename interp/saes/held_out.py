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

from interp.dictionaries.evaluation import CentredSquares, held_out_sums
from interp.saes.sae import SAE

__all__ = ["figures", "streamed_figures"]


def _figures(sae: SAE, passes, chunk: int, squares: CentredSquares | None) -> tuple[dict, int]:
    """The sums over every pass (``chunk`` tokens encoded at a time), and the token count."""
    sums = {"error": 0.0, "l0": 0.0, "active": None}

    def tally(part: Tensor) -> None:
        f = sae.encode(part)
        sums["error"] += (part - sae.decode(f)).pow(2).sum().item()
        sums["l0"] += (f > 0).sum().item()
        if sums["active"] is None:
            sums["active"] = torch.zeros(sae.d_sae, dtype=torch.bool, device=part.device)
        sums["active"] |= (f > 0).any(0)

    n = held_out_sums(((x,) for x in passes), chunk, tally, squares)
    return sums, n


def _report(sae: SAE, sums: dict, n: int, numel: int, total: float) -> dict:
    dead = tuple(torch.nonzero(~sums["active"]).flatten().tolist())
    return {
        "l0": sums["l0"] / n,
        "explained_variance": 1 - sums["error"] / total,
        "mse": sums["error"] / numel,
        "dead_fraction": len(dead) / sae.d_sae,
        "dead_features": dead,
    }


@torch.no_grad()
def figures(sae: SAE, x: Float[Tensor, "n d_in"], chunk: int) -> dict:
    """L0, explained variance, MSE and dead features on the held-out activations ``x``."""
    sums, n = _figures(sae, [x], chunk, None)
    return _report(sae, sums, n, x.numel(), (x - x.mean(0)).pow(2).sum().item())


@torch.no_grad()
def streamed_figures(sae: SAE, passes: Iterable[Float[Tensor, "n d_in"]], chunk: int) -> dict:
    """The same figures over the held-out activations of every pass."""
    squares = CentredSquares()
    sums, n = _figures(sae, passes, chunk, squares)
    numel = n * int(squares.total.numel())
    return _report(sae, sums, n, numel, squares.total.sum().item())
