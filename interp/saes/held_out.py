"""An SAE's held-out figures (:func:`interp.train_sae`'s ``_figures``) computed pass by pass,
for a training within ``max_bytes``: the same sums, with ``Σ ||x - mean(x)||²`` combined from
each pass's (:class:`interp.stores.evaluation.CentredSquares`)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from jaxtyping import Float
from torch import Tensor

from interp.saes.sae import SAE
from interp.stores.evaluation import CentredSquares

__all__ = ["streamed_figures"]


@torch.no_grad()
def streamed_figures(sae: SAE, passes: Iterable[Float[Tensor, "n d_in"]], chunk: int) -> dict:
    """L0, explained variance, MSE and dead features over the held-out activations of every
    pass, encoded ``chunk`` tokens at a time."""
    active = None
    error = l0 = 0.0
    numel = 0
    squares = CentredSquares()
    for x in passes:
        if active is None:
            active = torch.zeros(sae.d_sae, dtype=torch.bool, device=x.device)
        for part in x.split(chunk):
            f = sae.encode(part)
            error += (part - sae.decode(f)).pow(2).sum().item()
            l0 += (f > 0).sum().item()
            active |= (f > 0).any(0)
        squares.add(x)
        numel += x.numel()
    dead = tuple(torch.nonzero(~active).flatten().tolist())
    return {
        "l0": l0 / len(squares),
        "explained_variance": 1 - error / squares.total.sum().item(),
        "mse": error / numel,
        "dead_fraction": len(dead) / sae.d_sae,
        "dead_features": dead,
    }
