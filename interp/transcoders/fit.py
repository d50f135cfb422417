"""Transcoders' parameters for :func:`interp.train_transcoder`: their start, their optimisation
by the one training loop (:func:`interp.dictionaries.training.fit` with
:class:`~interp.dictionaries.training.TranscoderLoss`, whose docstring gives the losses), and
their folding back into the model's units.

A transcoder of layer ``l`` reads the MLP's input ``x_l`` and predicts its output ``y_l``.
Each layer's inputs and outputs are first scaled by one factor each (``c_in``, ``c_out``) so
that their mean norm is ``sqrt(d_model)``: the sparsity coefficient then means the same on
every model and layer.

JumpReLU keeps the L1 term: with the L0 term alone, whose gradient reaches only θ, the
features of a planted sparse map were not found (best cosine 0.6 after 1,200 steps, L0 12
where the truth is 1.5; with both, 0.999 and L0 3).

:func:`fold` returns the weights in the model's units: ``W_enc·c_in``, ``W_dec/c_out``,
``W_skip·c_in/c_out`` — and, for relu and jumprelu, each feature scaled by its decoder norm so
that the rows have unit norm (the reconstruction is unchanged; JumpReLU's threshold scales
with it). TopK features are left as they are (a per-feature scale would change the ranking).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from interp.dictionaries import training
from interp.dictionaries.training import BANDWIDTH, TranscoderLoss
from interp.dictionaries.training import transcoder_decode as decode
from interp.dictionaries.training import transcoder_encode as encode

__all__ = ["BANDWIDTH", "INIT_THRESHOLD", "decode", "encode", "fit", "fold", "init_params"]

INIT_THRESHOLD = 0.01  # JumpReLU's starting θ, in scaled units (SAELens's)


def init_params(
    n_layers: int, d_model: int, d_tc: int, *, cross: bool, skip: bool, activation: str, gen
) -> dict[str, Tensor]:
    """Decoder rows at norm 0.1 (relu, jumprelu) or 1 (topk), ``W_enc = W_decᵀ`` of the
    layer's own decoder block, biases at 0, ``W_skip`` at 0."""
    W_dec = torch.rand(n_layers, d_tc, n_layers if cross else 1, d_model, generator=gen) * 2 - 1
    norm = 1.0 if activation == "topk" else 0.1
    W_dec *= norm / W_dec.pow(2).sum((2, 3), keepdim=True).sqrt()
    own = torch.stack([W_dec[layer, :, layer if cross else 0] for layer in range(n_layers)])
    p = {
        "W_enc": own.transpose(1, 2).clone(),
        "b_enc": torch.zeros(n_layers, d_tc),
        "W_dec": W_dec,
        "b_dec": torch.zeros(n_layers, d_model),
    }
    if skip:
        p["W_skip"] = torch.zeros(n_layers, d_model, d_model)
    if activation == "jumprelu":
        p["log_threshold"] = torch.full((n_layers, d_tc), math.log(INIT_THRESHOLD))
    return p


def fit(
    draw: Callable[[], tuple[Tensor, Tensor]],
    p: dict[str, Tensor],
    mask: Tensor,
    *,
    activation: str,
    k: int | None,
    sparsity: float,
    steps: int,
    batch_tokens: int,
    lr: float,
    progress: bool,
    desc: str = "training transcoders",
) -> list[dict]:
    """Adam over ``steps`` batches drawn from ``draw()`` (shuffled buffers of scaled
    ``(x, y)`` pairs ``[n layer d_model]``); updates ``p`` in place, returns the history."""
    loss = TranscoderLoss(p, mask, activation=activation, k=k, sparsity=sparsity)
    return training.fit(
        p, loss, training.buffers_of(draw), steps=steps, batch_tokens=batch_tokens, lr=lr,
        progress=progress, desc=desc,
    )  # fmt: skip


@torch.no_grad()
def fold(
    p: dict[str, Tensor], mask: Tensor, c_in: Tensor, c_out: Tensor, activation: str
) -> dict[str, Tensor]:
    """The weights in the model's units (see the module docstring), every tensor
    ``[layer ...]``: ``W_enc [layer d_model d_tc]``, ``W_dec [layer d_tc layer d_model]``
    (zero where the mask is; ``[layer d_tc 1 d_model]`` per layer), ``b_enc``, ``b_dec``,
    and ``threshold`` / ``W_skip``."""
    if p["W_dec"].shape[2] == 1:  # per-layer: [layer d_tc 1 d_model]
        W_dec = p["W_dec"] / c_out[:, None, None, None]
    else:
        W_dec = p["W_dec"] * mask[:, None, :, None] / c_out[None, None, :, None]
    W_enc = p["W_enc"] * c_in[:, None, None]
    b_enc = p["b_enc"].clone()
    out = {"b_dec": p["b_dec"] / c_out[:, None]}
    if activation == "jumprelu":
        out["threshold"] = p["log_threshold"].exp()
    if activation != "topk":
        norms = W_dec.pow(2).sum((2, 3)).sqrt().clamp_min(1e-12)  # [layer d_tc]
        W_dec, W_enc, b_enc = W_dec / norms[:, :, None, None], W_enc * norms[:, None], b_enc * norms
        if "threshold" in out:
            out["threshold"] = out["threshold"] * norms
    out.update(W_enc=W_enc, b_enc=b_enc, W_dec=W_dec)
    if "W_skip" in p:
        out["W_skip"] = p["W_skip"] * (c_in[:, None, None] / c_out[:, None, None])
    return {name: t.detach().clone().float() for name, t in out.items()}
