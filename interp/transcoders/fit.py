"""The optimisation of :func:`interp.train_transcoder`, on buffers of activation pairs.

A transcoder of layer ``l`` reads the MLP's input ``x_l`` and predicts its output ``y_l``.
Each layer's inputs and outputs are first scaled by one factor each (``c_in``, ``c_out``) so
that their mean norm is ``sqrt(d_model)``: the sparsity coefficient then means the same on
every model and layer. In scaled units, with ``x = c_in x_l``:

    pre_l = x W_enc_l + b_enc_l
    f_l = ReLU(pre_l)                               relu
    f_l = pre_l · H(pre_l - θ_l)                    jumprelu (θ = exp(log θ), learned)
    f_l = TopK_k(pre_l)                             topk (the k largest kept as they are,
                                                    circuit-tracer's TopK)
    ŷ_j = Σ_{l ≤ j} f_l W_dec[l → j] + b_dec_j      cross-layer (per-layer: l = j only)
          (+ x_j W_skip_j for kind "skip")

    loss = Σ_j mean_tokens ||ŷ_j - y_j||² + λ · sparsity
    sparsity = mean_tokens Σ_{l,f} |f_lf| ||W_dec[l, f]||   relu (the decoder norm over every
                                                            layer it writes to)
             = the same + mean_tokens Σ_{l,f} H(pre_lf - θ_lf)   jumprelu (plus L0,
                                                            straight-through, for θ)
             = 0                                            topk (decoder rows kept at norm 1)

JumpReLU keeps the L1 term: with the L0 term alone, whose gradient reaches only θ, the
features of a planted sparse map were not found (best cosine 0.6 after 1,200 steps, L0 12
where the truth is 1.5; with both, 0.999 and L0 3).

JumpReLU's threshold learns through the straight-through estimator of Rajamanoharan et al.
(2024): the step's derivative in θ is ``-K((pre - θ)/ε)/ε`` with a rectangle kernel ``K`` of
width :data:`BANDWIDTH`. λ rises linearly over the first 5% of steps; the learning rate decays
to 0 over the last 20% (as :func:`interp.train_sae`).

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
from tqdm.auto import tqdm

__all__ = ["BANDWIDTH", "INIT_THRESHOLD", "decode", "encode", "fit", "fold", "init_params"]

BANDWIDTH = 0.05  # JumpReLU's straight-through kernel width, in scaled units (SAELens's)
INIT_THRESHOLD = 0.01  # JumpReLU's starting θ, in scaled units (SAELens's)
L1_WARMUP = 0.05  # share of steps over which λ rises from 0
LR_DECAY = 0.2  # share of steps, at the end, over which the learning rate falls to 0
HISTORY_ROWS = 200  # about this many rows of history per run


class _Step(torch.autograd.Function):
    """H(pre - θ) with the straight-through derivative in θ (none in pre)."""

    @staticmethod
    def forward(ctx, pre: Tensor, threshold: Tensor) -> Tensor:
        ctx.save_for_backward(pre, threshold)
        return (pre > threshold).to(pre.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        pre, threshold = ctx.saved_tensors
        window = ((pre - threshold).abs() < BANDWIDTH / 2).to(pre.dtype)
        return None, (-grad * window / BANDWIDTH).sum_to_size(threshold.shape)


class _JumpReLU(torch.autograd.Function):
    """pre · H(pre - θ): the gradient flows to pre where the feature fires, and to θ through
    the straight-through estimator."""

    @staticmethod
    def forward(ctx, pre: Tensor, threshold: Tensor) -> Tensor:
        ctx.save_for_backward(pre, threshold)
        return pre * (pre > threshold).to(pre.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        pre, threshold = ctx.saved_tensors
        fired = (pre > threshold).to(pre.dtype)
        window = ((pre - threshold).abs() < BANDWIDTH / 2).to(pre.dtype)
        d_threshold = -(threshold / BANDWIDTH) * window * grad
        return grad * fired, d_threshold.sum_to_size(threshold.shape)


def encode(x: Tensor, p: dict[str, Tensor], activation: str, k: int | None) -> Tensor:
    """Features ``[n layer d_tc]`` of inputs ``[n layer d_model]`` (scaled units)."""
    pre = torch.einsum("nld,ldf->nlf", x, p["W_enc"]) + p["b_enc"]
    if activation == "relu":
        return torch.relu(pre)
    if activation == "jumprelu":
        return _JumpReLU.apply(pre, p["log_threshold"].exp())
    values, index = pre.topk(k, dim=-1)
    return torch.zeros_like(pre).scatter(-1, index, values)


def decode(f: Tensor, x: Tensor, p: dict[str, Tensor], mask: Tensor) -> Tensor:
    """Reconstructions ``[n layer d_model]``; ``mask[l, j]``: feature layer l writes layer j.
    A per-layer ``W_dec`` is ``[layer d_tc 1 d_model]`` (its own layer only)."""
    if p["W_dec"].shape[2] == 1:
        y = torch.einsum("nlf,lfd->nld", f, p["W_dec"][:, :, 0]) + p["b_dec"]
    else:
        y = torch.einsum("nlf,lfjd->njd", f, p["W_dec"] * mask[:, None, :, None]) + p["b_dec"]
    if "W_skip" in p:
        y = y + torch.einsum("nld,lde->nle", x, p["W_skip"])
    return y


def decoder_norms(p: dict[str, Tensor], mask: Tensor) -> Tensor:
    """||W_dec[l, f]|| over every layer feature (l, f) writes to: ``[layer d_tc]``."""
    W_dec = p["W_dec"] if p["W_dec"].shape[2] == 1 else p["W_dec"] * mask[:, None, :, None]
    return W_dec.pow(2).sum((2, 3)).sqrt()


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
    opt = torch.optim.Adam(p.values(), lr=lr, betas=(0.9, 0.999))
    x_all, y_all = draw()
    used, history = 0, []
    every = max(1, steps // HISTORY_ROWS)
    decay_from = steps - int(steps * LR_DECAY)
    bar = tqdm(range(steps), desc=desc, unit="step", disable=not progress)
    for step in bar:
        if used + batch_tokens > len(x_all):
            (x_all, y_all), used = draw(), 0
        x, y = x_all[used : used + batch_tokens], y_all[used : used + batch_tokens]
        used += batch_tokens
        scale = 1.0 if step < decay_from else (steps - step) / max(1, steps - decay_from)
        for group in opt.param_groups:
            group["lr"] = lr * scale
        f = encode(x, p, activation, k)
        y_hat = decode(f, x, p, mask)
        mse = (y_hat - y).pow(2).sum(-1).mean(0).sum()
        lam = sparsity * min(1.0, (step + 1) / max(1, int(steps * L1_WARMUP)))
        penalty = torch.zeros(())
        if activation != "topk":
            penalty = (f.abs() * decoder_norms(p, mask)).sum((1, 2)).mean()
        if activation == "jumprelu":
            pre = torch.einsum("nld,ldf->nlf", x, p["W_enc"]) + p["b_enc"]
            penalty = penalty + _Step.apply(pre, p["log_threshold"].exp()).sum((1, 2)).mean()
        loss = mse + lam * penalty
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if activation == "topk":
            with torch.no_grad():
                p["W_dec"] /= decoder_norms(p, mask).clamp_min(1e-12)[:, :, None, None]
        if step % every == 0 or step == steps - 1:
            with torch.no_grad():
                total = (y - y.mean(0)).pow(2).sum((0, 2))
                fvu = ((y_hat - y).pow(2).sum((0, 2)) / total.clamp_min(1e-12)).mean().item()
                row = {
                    "step": step,
                    "loss": loss.item(),
                    "fvu": fvu,
                    "l0": (f != 0).sum(-1).float().mean().item(),
                    "lr": opt.param_groups[0]["lr"],
                    "sparsity_coefficient": lam if activation != "topk" else 0.0,
                }
            history.append(row)
            bar.set_postfix(l0=f"{row['l0']:.1f}", fvu=f"{row['fvu']:.3f}")
    return history


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
