"""A transcoder set's held-out figures (:func:`interp.train_transcoder`'s ``_figures``)
computed pass by pass, for a training within ``max_bytes``: the same sums, with each layer's
``Σ ||y - mean(y)||²`` combined from each pass's
(:class:`interp.stores.evaluation.CentredSquares`)."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd
import torch
from torch import Tensor

from interp.stores.evaluation import CentredSquares
from interp.transcoders.transcoder import TranscoderSet

__all__ = ["streamed_figures", "tally"]


@torch.no_grad()
def streamed_figures(tc: TranscoderSet, passes: Iterable[tuple[Tensor, Tensor]], chunk: int):
    """FVU, L0 and dead features per layer over every pass's ``(x, y)`` ``[n layer d_model]``,
    ``chunk`` tokens at a time, with the set's own encode and decode."""
    n_layers = tc.n_layers
    active = error = None
    l0 = torch.zeros(n_layers)
    squares = CentredSquares()
    for x, y in passes:
        if active is None:
            active = torch.zeros(n_layers, tc.d_tc, dtype=torch.bool, device=x.device)
            error = torch.zeros(n_layers, dtype=torch.float64)
        for xc, yc in zip(x.split(chunk), y.split(chunk), strict=True):
            tally(tc, xc, yc, error, l0, active)
        squares.add(y)
    total = squares.total.sum(-1).cpu()
    dead = (~active).sum(1).cpu()
    return pd.DataFrame(
        {
            "layer": range(n_layers),
            "fvu": (error / total).tolist(),
            "l0": (l0 / len(squares)).tolist(),
            "dead": dead.tolist(),
            "dead_fraction": (dead / tc.d_tc).tolist(),
        }
    )


def tally(
    tc: TranscoderSet, x: Tensor, y: Tensor, error: Tensor, l0: Tensor, active: Tensor
) -> None:
    """Add one chunk's squared reconstruction error, L0 and firing features, per layer, to
    ``error`` [layer] (float64), ``l0`` [layer] and ``active`` [layer d_tc] in place; ``x``,
    ``y``: [rows layer d_model]."""
    acts = [tc.encode(x[:, layer], layer) for layer in range(tc.n_layers)]
    for layer in range(tc.n_layers):
        y_hat = tc.decode(acts if tc.kind == "cross-layer" else acts[layer], layer)
        y_hat = y_hat + tc.skip(x[:, layer], layer)
        error[layer] += (y[:, layer] - y_hat).double().pow(2).sum().item()
        l0[layer] += (acts[layer] != 0).sum().item()
        active[layer] |= (acts[layer] != 0).any(0)
