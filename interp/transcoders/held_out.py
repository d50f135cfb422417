"""A transcoder set's held-out figures per layer (:func:`interp.train_transcoder`'s report), with
the set's own encode and decode: from every held-out pair at once, or pass by pass for a
training within ``max_bytes`` (the same sums, with each layer's ``Σ ||y - mean(y)||²``
combined from each pass's: :class:`interp.dictionaries.evaluation.CentredSquares`).

    FVU = Σ_tokens ||y - ŷ||² / Σ_tokens ||y - mean_tokens(y)||²   (y: the MLP's output)
    L0 = mean_tokens #{f: act_f != 0}
    dead features: never active on any held-out token
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd
import torch
from torch import Tensor

from interp.dictionaries.evaluation import CentredSquares
from interp.transcoders.transcoder import TranscoderSet

__all__ = ["figures", "streamed_figures", "tally"]


def _figures(tc: TranscoderSet, passes, chunk: int, total: Tensor | None = None):
    """The figures over every pass's ``(x, y)`` ``[n layer d_model]``; ``total``: each layer's
    ``Σ ||y - mean(y)||²``, or None to combine it pass by pass."""
    n_layers, n, active, error = tc.n_layers, 0, None, None
    l0, squares = torch.zeros(n_layers), CentredSquares()
    for x, y in passes:
        if active is None:
            active = torch.zeros(n_layers, tc.d_tc, dtype=torch.bool, device=x.device)
            error = torch.zeros(n_layers, dtype=torch.float64)
        for xc, yc in zip(x.split(chunk), y.split(chunk), strict=True):
            tally(tc, xc, yc, error, l0, active)
        if total is None:
            squares.add(y)
        n += len(x)
    total = squares.total.sum(-1).cpu() if total is None else total
    dead = (~active).sum(1).cpu()
    return pd.DataFrame(
        {
            "layer": range(n_layers),
            "fvu": (error / total).tolist(),
            "l0": (l0 / n).tolist(),
            "dead": dead.tolist(),
            "dead_fraction": (dead / tc.d_tc).tolist(),
        }
    )


@torch.no_grad()
def figures(tc: TranscoderSet, x: Tensor, y: Tensor, chunk: int) -> pd.DataFrame:
    """FVU, L0 and dead features per layer on the held-out pairs ``[n layer d_model]``."""
    return _figures(tc, [(x, y)], chunk, (y - y.mean(0)).double().pow(2).sum((0, 2)).cpu())


@torch.no_grad()
def streamed_figures(tc: TranscoderSet, passes: Iterable[tuple[Tensor, Tensor]], chunk: int):
    """The same figures over every pass's ``(x, y)``, ``chunk`` tokens at a time."""
    return _figures(tc, passes, chunk)


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
