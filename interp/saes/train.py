"""Train a small sparse autoencoder on one hook of a model, with SAELens's losses.

The activations ``x`` at ``hook`` (one vector per token; a BOS token at position 0 is left
out, its activation is a constant outlier) are first scaled by one factor ``c`` so that their
mean norm is ``sqrt(d_in)`` (SAELens's ``expected_average_only_in``): ``l1_coefficient`` then
means the same on every model. With ``x' = c x`` and ``apply_b_dec_to_input``:

    pre = (x' - b_dec) W_enc + b_enc
    f = ReLU(pre)                       standard
    f = ReLU(TopK_k(pre))               topk: the k largest pre-activations, the rest 0
    x̂' = f W_dec + b_dec

    standard:  loss = mean_tokens ||x̂' - x'||² + λ mean_tokens Σ_j f_j ||W_dec[j]||
    topk:      loss = mean_tokens ||x̂' - x'||²   (decoder rows kept at unit norm)

as SAELens's ``StandardTrainingSAE`` (sum over ``d_in``, mean over tokens, the L1 penalty
weighted by each decoder row's norm, so shrinking rows cannot buy sparsity) and
``TopKTrainingSAE`` (no auxiliary loss). λ rises linearly from 0 over the first 5% of steps;
the learning rate (Adam, betas 0.9/0.999) decays linearly to 0 over the last 20%. ``b_dec``
starts at 0 (SAELens's default; the mean would pull every feature off the data's own
directions when they are not centred), ``W_dec`` rows at norm 0.1 (standard) or 1 (topk), and
``W_enc = W_decᵀ``.

The returned SAE is in the model's units, with unit-norm decoder rows: each feature is
rescaled by ``n_j / c`` (``n_j = ||W_dec[j]||``), which leaves the reconstruction exactly
unchanged (ReLU and TopK commute with a positive scale that is equal for all features in the
TopK case, where ``n_j = 1``). Its figures are measured on held-out text
(:data:`EVAL_TOKENS` tokens, :meth:`TokenRows.held_out` with seed :data:`EVAL_SEED`):

    L0 = mean_tokens #{j: f_j > 0}
    explained variance = 1 - Σ_tokens ||x - x̂||² / Σ_tokens ||x - mean_tokens(x)||²
    MSE = mean_tokens,dims (x - x̂)²
    dead features: never active (f_j > 0) on any held-out token
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from interp.dictionaries.data import TokenRows, activations_at
from interp.engine import check_hook_names, trim_freed_memory
from interp.foundation.formatting import summary_html, table_html
from interp.saes.held_out import streamed_figures
from interp.saes.sae import SAE
from interp.stores.budget import split_rows, token_bytes
from interp.stores.training import activation_source, sae_budget

__all__ = ["EVAL_SEED", "EVAL_TOKENS", "TrainingReport", "train_sae"]

TRAINABLE = ("standard", "topk")
EVAL_TOKENS = 32768  # held-out tokens the report's figures are measured on
EVAL_CHUNK = 4096  # tokens encoded at a time for those figures
EVAL_SEED = 12345  # the same held-out rows for every run on the same texts
L1_WARMUP = 0.05  # share of steps over which λ rises from 0
LR_DECAY = 0.2  # share of steps, at the end, over which the learning rate falls to 0
HISTORY_ROWS = 200  # about this many rows of history per run
DEAD_WINDOW = 200  # steps: a feature not active in this many is counted dead in the history


@dataclass(frozen=True)
class TrainingReport:
    """What a :func:`train_sae` run did and how good the SAE is on held-out tokens."""

    steps: int
    tokens: int  # activation vectors trained on (steps x batch_tokens)
    l0: float  # mean active features per held-out token
    explained_variance: float
    dead_fraction: float
    dead_features: tuple[int, ...]  # never active on a held-out token
    mse: float  # per element, in the model's units
    history: pd.DataFrame = field(repr=False)  # step, loss, mse, l0, explained_variance, ...
    seconds: float = 0.0  # wall time of the run
    scaling_factor: float = 1.0  # c: the training-time activation scale, folded in

    def _repr_html_(self) -> str:
        items = {
            "steps, tokens": f"{self.steps}, {self.tokens:,}",
            "L0": f"{self.l0:.2f}",
            "explained variance": f"{self.explained_variance:.4f}",
            "MSE": f"{self.mse:.4g}",
            "dead features": f"{len(self.dead_features)} ({self.dead_fraction:.1%})",
            "time": f"{self.seconds:.0f} s",
        }
        history = table_html(self.history.tail(5), max_rows=5)
        return summary_html("SAE training", items, table=history, table_title="last history rows")


def _check(architecture: str, d_sae: int, k: int | None, steps: int, batch_tokens: int) -> None:
    if architecture not in TRAINABLE:
        raise ValueError(
            f"architecture {architecture!r} cannot be trained here; pass one of {TRAINABLE}"
        )
    if d_sae < 1 or steps < 1 or batch_tokens < 1:
        raise ValueError(
            f"d_sae, steps and batch_tokens must be positive, got {d_sae}, {steps}, {batch_tokens}"
        )
    if architecture == "topk" and (k is None or not 1 <= k <= d_sae):
        raise ValueError(f"a topk SAE needs k between 1 and d_sae={d_sae}, got k={k}")
    if architecture != "topk" and k is not None:
        raise ValueError(f"k is for topk SAEs; a {architecture} SAE takes l1_coefficient")


def _encode(x: Tensor, p: dict[str, Tensor], k: int | None) -> Tensor:
    pre = (x - p["b_dec"]) @ p["W_enc"] + p["b_enc"]
    if k is None:
        return torch.relu(pre)
    values, index = pre.topk(k, dim=-1)
    return torch.zeros_like(pre).scatter(-1, index, torch.relu(values))


def _lr_scale(step: int, steps: int) -> float:
    decay_from = steps - int(steps * LR_DECAY)
    return 1.0 if step < decay_from else (steps - step) / max(1, steps - decay_from)


def train_sae(
    model,
    hook: str,
    texts: Sequence[str] | None = None,
    *,
    d_sae: int,
    architecture: str = "standard",
    l1_coefficient: float = 1.0,
    k: int | None = None,
    steps: int = 2000,
    batch_tokens: int = 1024,
    lr: float = 1e-3,
    seed: int = 0,
    progress: bool = True,
    device: str | torch.device | None = None,
    store=None,
    max_bytes: int | str | None = None,
) -> tuple[SAE, TrainingReport]:
    """Train an SAE on the activations at ``hook`` (e.g. ``"blocks.1.hook_resid_pre"``).

    Args:
        texts: documents to draw windows of up to 128 tokens from; None: the bundled
            model's training mix (standard-library source and ``a + a`` repeats).
        d_sae: number of features.
        architecture: ``"standard"`` (ReLU, L1 penalty) or ``"topk"`` (needs ``k``).
        l1_coefficient: λ of the standard loss (see the module docstring).
        steps, batch_tokens: optimiser steps, and activation vectors per step.
        lr: Adam's learning rate.
        seed: seeds the data, the initialisation and the shuffles: the same seed gives the
            same weights.
        device: where to train (default: the model's device).
        store: an :class:`interp.ActivationStore` (or its folder) of the model's activations
            at ``hook`` to train on instead of running the model (:mod:`interp.stores.training`;
            one filled by ``fill_training_store`` with these settings gives the same SAE).
        max_bytes: with a store: the most the whole call holds at once (bytes or ``"1GB"``):
            the SAE, its gradients and Adam's moments, each step, the held-out evaluation,
            and the reading in what is left (:mod:`interp.stores.budget`); a budget too small
            is refused before anything is read, naming the least that would do.

    Returns:
        ``(sae, report)``: the SAE in the model's units, and its figures on held-out tokens.
    """

    _check(architecture, d_sae, k, steps, batch_tokens)
    check_hook_names(model, [hook])
    start = time.perf_counter()
    device = torch.device(device if device is not None else model.cfg.device)
    gen = torch.Generator().manual_seed(seed)
    rows = TokenRows(model, texts, gen)
    k = k if architecture == "topk" else None

    held_out = rows.held_out(EVAL_TOKENS, EVAL_SEED)
    budgeted = store is not None and max_bytes is not None
    if budgeted:  # the whole call within max_bytes (interp.stores.budget)
        store, budget = sae_budget(model, hook, store, max_bytes, batch_tokens=batch_tokens,
                                   d_sae=d_sae, held_out=held_out, chunk=EVAL_CHUNK,
                                   tokens=token_bytes(rows))  # fmt: skip
        max_bytes, held_out = budget.reading, split_rows(held_out, budget.eval_rows)
    source = activation_source(model, hook, rows, gen, batch_tokens, store, max_bytes)
    acts = source.next().to(device)
    d_in = acts.shape[1]
    scale = math.sqrt(d_in) / acts.norm(dim=1).mean().clamp_min(1e-12).item()
    W_dec = torch.rand(d_sae, d_in, generator=gen) * 2 - 1
    W_dec *= (0.1 if k is None else 1.0) / W_dec.norm(dim=1, keepdim=True)
    p = {
        "W_enc": W_dec.T.clone(),
        "b_enc": torch.zeros(d_sae),
        "W_dec": W_dec,
        "b_dec": torch.zeros(d_in),
    }
    p = {name: t.to(device).requires_grad_() for name, t in p.items()}
    opt = torch.optim.Adam(p.values(), lr=lr, betas=(0.9, 0.999))
    last_fired = torch.full((d_sae,), -1, dtype=torch.long, device=device)
    history, used = [], 0
    every = max(1, steps // HISTORY_ROWS)
    bar = tqdm(range(steps), desc="training SAE", unit="step", disable=not progress)
    for step in bar:
        if used + batch_tokens > len(acts):
            acts, used = source.next().to(device), 0
        x = acts[used : used + batch_tokens] * scale
        used += batch_tokens
        for group in opt.param_groups:
            group["lr"] = lr * _lr_scale(step, steps)
        f = _encode(x, p, k)
        x_hat = f @ p["W_dec"] + p["b_dec"]
        mse = (x_hat - x).pow(2).sum(-1).mean()
        l1 = l1_coefficient * min(1.0, (step + 1) / max(1, int(steps * L1_WARMUP)))
        sparsity = (f * p["W_dec"].norm(dim=1)).sum(-1).mean()
        loss = mse + l1 * sparsity if k is None else mse
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if k is not None:
            with torch.no_grad():
                p["W_dec"] /= p["W_dec"].norm(dim=1, keepdim=True)
        with torch.no_grad():
            fired = (f > 0).any(0)
            last_fired[fired] = step
            if step % every == 0 or step == steps - 1:
                total = (x - x.mean(0)).pow(2).sum()
                history.append(
                    {
                        "step": step,
                        "loss": loss.item(),
                        "mse": (x_hat - x).pow(2).mean().item() / scale**2,
                        "l0": (f > 0).sum(-1).float().mean().item(),
                        "explained_variance": 1 - (x_hat - x).pow(2).sum().item() / total.item(),
                        "dead_fraction": (last_fired < step + 1 - DEAD_WINDOW)
                        .float()
                        .mean()
                        .item(),
                        "lr": opt.param_groups[0]["lr"],
                        "l1_coefficient": l1 if k is None else 0.0,
                    }
                )
                bar.set_postfix(
                    l0=f"{history[-1]['l0']:.1f}", ev=f"{history[-1]['explained_variance']:.3f}"
                )
    del source, acts, x, f, x_hat, mse, sparsity, loss  # the reading and the last step freed
    if budgeted:
        trim_freed_memory()  # so that the evaluation's peak is not on top of it
    sae = _fold(p, scale, architecture, k, hook, rows.window)
    if budgeted:  # pass by pass: never every held-out activation at once
        passes = (activations_at(model, hook, [rows_]).to(device) for rows_ in held_out)
        figures = streamed_figures(sae, passes, EVAL_CHUNK)
    else:
        figures = _figures(sae, activations_at(model, hook, held_out).to(device))
    report = TrainingReport(
        steps=steps,
        tokens=steps * batch_tokens,
        history=pd.DataFrame(history),
        seconds=time.perf_counter() - start,
        scaling_factor=scale,
        **figures,
    )
    return sae, report


@torch.no_grad()
def _fold(p: dict[str, Tensor], scale: float, architecture, k, hook: str, context: int) -> SAE:
    """The trained weights in the model's units with unit-norm decoder rows: feature j
    scaled by n_j / c (see the module docstring)."""
    norms = p["W_dec"].norm(dim=1).clamp_min(1e-12) if k is None else torch.ones_like(p["b_enc"])
    cfg = {
        "architecture": architecture,
        "d_in": p["W_dec"].shape[1],
        "d_sae": p["W_dec"].shape[0],
        "hook_name": hook,
        "apply_b_dec_to_input": True,
        "normalize_activations": "none",  # the training scale is folded into the weights
        "context_size": context,
        "dtype": "float32",
    }
    if k is not None:
        cfg["k"] = k
    return SAE(
        (p["W_enc"] * norms).detach().clone(),
        (p["b_enc"] * norms / scale).detach().clone(),
        (p["W_dec"] / norms[:, None]).detach().clone(),
        (p["b_dec"] / scale).detach().clone(),
        architecture=architecture,
        hook_name=hook,
        k=k,
        apply_b_dec_to_input=True,
        cfg=cfg,
    )


@torch.no_grad()
def _figures(sae: SAE, x: Float[Tensor, "n d_in"]) -> dict:
    """L0, explained variance, MSE and dead features on held-out activations, in chunks of
    EVAL_CHUNK tokens (the features of every held-out token at once can be large)."""
    active = torch.zeros(sae.d_sae, dtype=torch.bool, device=x.device)
    error = l0 = 0.0
    for chunk in x.split(EVAL_CHUNK):
        f = sae.encode(chunk)
        error += (chunk - sae.decode(f)).pow(2).sum().item()
        l0 += (f > 0).sum().item()
        active |= (f > 0).any(0)
    total = (x - x.mean(0)).pow(2).sum().item()
    dead = tuple(torch.nonzero(~active).flatten().tolist())
    return {
        "l0": l0 / len(x),
        "explained_variance": 1 - error / total,
        "mse": error / x.numel(),
        "dead_fraction": len(dead) / sae.d_sae,
        "dead_features": dead,
    }
