"""One training loop for every dictionary: an SAE, and per-layer, skip and cross-layer transcoders.

:func:`fit` is the same for each kind: Adam (betas 0.9/0.999) over ``steps`` batches of
``batch_tokens`` rows, cut in order from the buffers an iterator gives (activations computed as
training goes, a store's shuffled batches, one fixed tensor: the loop does not know which, and
imports nothing of where they come from). A buffer with fewer rows left than a batch is dropped
for the next. The learning rate decays linearly to 0 over the last :data:`LR_DECAY` of the
steps; the sparsity coefficient λ rises linearly from 0 over the first :data:`L1_WARMUP`;
about :data:`HISTORY_ROWS` rows of history are kept (step, loss, the kind's figures, lr, λ).

What differs is the loss, one small object per kind, in scaled units (the callers scale the
activations to a mean norm of ``sqrt(d)`` and fold the scale back into the weights):

- :class:`SAELoss`, with ``apply_b_dec_to_input``, as SAELens's ``StandardTrainingSAE`` (sum
  over ``d``, mean over tokens, the L1 penalty weighted by each decoder row's norm, so shrinking
  rows cannot buy sparsity) and ``TopKTrainingSAE`` (no auxiliary loss)::

      f = ReLU((x - b_dec) W_enc + b_enc)        standard
      f = ReLU(TopK_k((x - b_dec) W_enc + b_enc))   topk: the k largest, the rest 0
      x̂ = f W_dec + b_dec
      loss = mean_tokens ||x̂ - x||² + λ mean_tokens Σ_j f_j ||W_dec[j]||   standard
      loss = mean_tokens ||x̂ - x||²    topk (decoder rows put back to norm 1 each step)

- :class:`TranscoderLoss`, every layer at once; ``mask[l, j]`` says whether layer l's features
  write layer j (the identity for per-layer and skip transcoders, upper-triangular for
  cross-layer ones)::

      pre_l = x_l W_enc_l + b_enc_l
      f_l = ReLU(pre_l)  |  pre_l · H(pre_l - θ_l)  |  TopK_k(pre_l)   relu | jumprelu | topk
      ŷ_j = Σ_{l ≤ j} f_l W_dec[l → j] + b_dec_j  (+ x_j W_skip_j for a skip transcoder)
      loss = Σ_j mean_tokens ||ŷ_j - y_j||² + λ · sparsity
      sparsity = mean_tokens Σ_{l,f} |f_lf| ||W_dec[l, f]||      relu (norm over every layer
                 + mean_tokens Σ_{l,f} H(pre_lf - θ_lf)          it writes), jumprelu adds L0
                 = 0                                             topk (rows kept at norm 1)

  JumpReLU's threshold θ learns through the straight-through estimator of Rajamanoharan et al.
  (2024): the step's derivative in θ is ``-K((pre - θ)/ε)/ε`` with a rectangle kernel of
  width :data:`BANDWIDTH`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

__all__ = [
    "BANDWIDTH",
    "BUFFER_BATCHES",
    "DEAD_WINDOW",
    "HISTORY_ROWS",
    "L1_WARMUP",
    "LR_DECAY",
    "SAELoss",
    "TranscoderLoss",
    "buffers_of",
    "decoder_norms",
    "fit",
    "lr_scale",
    "transcoder_decode",
    "transcoder_encode",
    "warmup",
]

L1_WARMUP = 0.05  # share of steps over which λ rises from 0
LR_DECAY = 0.2  # share of steps, at the end, over which the learning rate falls to 0
HISTORY_ROWS = 200  # about this many rows of history per run
DEAD_WINDOW = 200  # steps: an SAE feature not active in this many is counted dead in the history
BUFFER_BATCHES = 32  # activations computed as training goes: this many batches at a time, shuffled
BANDWIDTH = 0.05  # JumpReLU's straight-through kernel width, in scaled units (SAELens's)


def lr_scale(step: int, steps: int) -> float:
    """The learning rate's factor at ``step``: 1, then linearly to 0 over the last LR_DECAY."""
    decay_from = steps - int(steps * LR_DECAY)
    return 1.0 if step < decay_from else (steps - step) / max(1, steps - decay_from)


def warmup(step: int, steps: int) -> float:
    """λ's factor at ``step``: linearly from 0 to 1 over the first L1_WARMUP of the steps."""
    return min(1.0, (step + 1) / max(1, int(steps * L1_WARMUP)))


class Loss(Protocol):  # the interface, not a class to build (so not in __all__)
    """A kind's loss: ``loss(batch, lam, step)`` gives the loss and a function of no arguments
    that gives the history's figures of that step (called without gradients, after the step);
    ``project()`` runs after each optimiser step (TopK's unit-norm rows)."""

    coefficient: float  # λ at full strength
    name: str  # the history's column for λ
    penalised: bool  # whether λ enters the loss (else the history shows 0)
    shown: tuple[str, str]  # the figure shown beside L0 on the progress bar: label, column

    def __call__(self, batch: tuple[Tensor, ...], lam: float, step: int): ...

    def project(self) -> None: ...


def fit(
    params: dict[str, Tensor],
    loss: Loss,
    buffers: Iterator[tuple[Tensor, ...]],
    *,
    steps: int,
    batch_tokens: int,
    lr: float,
    progress: bool,
    desc: str,
) -> list[dict]:
    """Adam on ``params`` (updated in place) over ``steps`` batches cut from ``buffers`` (tuples
    of ``[rows ...]`` tensors, rows in the order they are to be used); returns the history."""
    opt = torch.optim.Adam(params.values(), lr=lr, betas=(0.9, 0.999))
    history, every = [], max(1, steps // HISTORY_ROWS)
    bar = tqdm(range(steps), desc=desc, unit="step", disable=not progress)
    for step, batch in zip(bar, _batches(buffers, batch_tokens), strict=False):
        for group in opt.param_groups:
            group["lr"] = lr * lr_scale(step, steps)
        lam = loss.coefficient * warmup(step, steps)
        value, figures = loss(batch, lam, step)
        opt.zero_grad(set_to_none=True)
        value.backward()
        opt.step()
        loss.project()
        if step % every == 0 or step == steps - 1:
            with torch.no_grad():
                row = {"step": step, "loss": value.item(), **figures()}
            row.update({"lr": opt.param_groups[0]["lr"], loss.name: lam if loss.penalised else 0.0})
            history.append(row)
            label, column = loss.shown
            bar.set_postfix(l0=f"{row['l0']:.1f}", **{label: f"{row[column]:.3f}"})
        del value, figures  # this step's tensors, not held through the next one's
    return history


def _batches(buffers: Iterator[tuple[Tensor, ...]], batch_tokens: int):
    """Batches of ``batch_tokens`` rows, in order, from each buffer in turn (what is left of
    a buffer too short for a batch is dropped)."""
    buffer, used = next(buffers), 0
    while True:
        if used + batch_tokens > len(buffer[0]):
            buffer, used = next(buffers), 0
        yield tuple(t[used : used + batch_tokens] for t in buffer)
        used += batch_tokens


class SAELoss:
    """An SAE's loss (module docstring) on batches ``(x,)`` in the model's units, multiplied by
    ``scale`` here; ``k`` None: standard, else topk. Tracks when each feature last fired."""

    name, shown = "l1_coefficient", ("ev", "explained_variance")

    def __init__(self, p: dict[str, Tensor], *, scale: float, k: int | None, l1: float):
        self.p, self.scale, self.k, self.coefficient = p, scale, k, l1
        self.penalised = k is None
        self.last_fired = torch.full((len(p["b_enc"]),), -1, device=p["b_enc"].device)

    def encode(self, x: Float[Tensor, "n d_in"]) -> Float[Tensor, "n d_sae"]:
        pre = (x - self.p["b_dec"]) @ self.p["W_enc"] + self.p["b_enc"]
        if self.k is None:
            return torch.relu(pre)
        values, index = pre.topk(self.k, dim=-1)
        return torch.zeros_like(pre).scatter(-1, index, torch.relu(values))

    def __call__(self, batch: tuple[Tensor], lam: float, step: int):
        p, x = self.p, batch[0] * self.scale
        f = self.encode(x)
        x_hat = f @ p["W_dec"] + p["b_dec"]
        loss = (x_hat - x).pow(2).sum(-1).mean()
        if self.k is None:
            loss = loss + lam * (f * p["W_dec"].norm(dim=1)).sum(-1).mean()
        self.last_fired[(f > 0).any(0)] = step

        def figures() -> dict:
            error = (x_hat - x).pow(2)
            return {
                "mse": error.mean().item() / self.scale**2,
                "l0": (f > 0).sum(-1).float().mean().item(),
                "explained_variance": 1 - error.sum().item() / (x - x.mean(0)).pow(2).sum().item(),
                "dead_fraction": (self.last_fired < step + 1 - DEAD_WINDOW).float().mean().item(),
            }

        return loss, figures

    @torch.no_grad()
    def project(self) -> None:
        if self.k is not None:
            self.p["W_dec"] /= self.p["W_dec"].norm(dim=1, keepdim=True)


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


def _pre(x: Tensor, p: dict[str, Tensor]) -> Tensor:
    return torch.einsum("nld,ldf->nlf", x, p["W_enc"]) + p["b_enc"]


def transcoder_encode(
    x: Float[Tensor, "n layer d_model"], p: dict[str, Tensor], activation: str, k: int | None
) -> Float[Tensor, "n layer d_tc"]:
    """Every layer's features (scaled units; TopK keeps the k largest as they are)."""
    pre = _pre(x, p)
    if activation == "relu":
        return torch.relu(pre)
    if activation == "jumprelu":
        return _JumpReLU.apply(pre, p["log_threshold"].exp())
    values, index = pre.topk(k, dim=-1)
    return torch.zeros_like(pre).scatter(-1, index, values)


def transcoder_decode(
    f: Float[Tensor, "n layer d_tc"], x: Tensor, p: dict[str, Tensor], mask: Tensor
) -> Float[Tensor, "n layer d_model"]:
    """Reconstructions; ``mask[l, j]``: feature layer l writes layer j. A per-layer ``W_dec``
    is ``[layer d_tc 1 d_model]`` (its own layer only)."""
    if p["W_dec"].shape[2] == 1:
        y = torch.einsum("nlf,lfd->nld", f, p["W_dec"][:, :, 0]) + p["b_dec"]
    else:
        y = torch.einsum("nlf,lfjd->njd", f, p["W_dec"] * mask[:, None, :, None]) + p["b_dec"]
    if "W_skip" in p:
        y = y + torch.einsum("nld,lde->nle", x, p["W_skip"])
    return y


def decoder_norms(p: dict[str, Tensor], mask: Tensor) -> Float[Tensor, "layer d_tc"]:
    """||W_dec[l, f]|| over every layer feature (l, f) writes to."""
    W_dec = p["W_dec"] if p["W_dec"].shape[2] == 1 else p["W_dec"] * mask[:, None, :, None]
    return W_dec.pow(2).sum((2, 3)).sqrt()


class TranscoderLoss:
    """A transcoder set's loss (module docstring) on batches ``(x, y)`` ``[n layer d_model]``,
    already in scaled units; ``activation`` relu, jumprelu or topk (with ``k``)."""

    name, shown = "sparsity_coefficient", ("fvu", "fvu")

    def __init__(self, p, mask: Tensor, *, activation: str, k: int | None, sparsity: float):
        self.p, self.mask, self.activation, self.k = p, mask, activation, k
        self.coefficient, self.penalised = sparsity, activation != "topk"

    def __call__(self, batch: tuple[Tensor, Tensor], lam: float, step: int):
        (x, y), p = batch, self.p
        f = transcoder_encode(x, p, self.activation, self.k)
        y_hat = transcoder_decode(f, x, p, self.mask)
        mse = (y_hat - y).pow(2).sum(-1).mean(0).sum()
        penalty = torch.zeros(())
        if self.penalised:
            penalty = (f.abs() * decoder_norms(p, self.mask)).sum((1, 2)).mean()
        if self.activation == "jumprelu":
            fired = _Step.apply(_pre(x, p), p["log_threshold"].exp())
            penalty = penalty + fired.sum((1, 2)).mean()

        def figures() -> dict:
            total = (y - y.mean(0)).pow(2).sum((0, 2)).clamp_min(1e-12)
            fvu = ((y_hat - y).pow(2).sum((0, 2)) / total).mean().item()
            return {"fvu": fvu, "l0": (f != 0).sum(-1).float().mean().item()}

        return mse + lam * penalty, figures

    @torch.no_grad()
    def project(self) -> None:
        if self.activation == "topk":
            self.p["W_dec"] /= decoder_norms(self.p, self.mask).clamp_min(1e-12)[:, :, None, None]


def buffers_of(draw: Callable[[], tuple[Tensor, ...]]) -> Iterator[tuple[Tensor, ...]]:
    """``draw()``, again and again, as an iterator of buffers."""
    while True:
        yield draw()
