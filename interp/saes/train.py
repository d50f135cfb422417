"""Train a small sparse autoencoder on one hook of a model, with SAELens's losses.

The activations ``x`` at ``hook`` (one vector per token; a BOS token at position 0 is left
out, its activation is a constant outlier) are first scaled by one factor ``c`` so that their
mean norm is ``sqrt(d_in)`` (SAELens's ``expected_average_only_in``): ``l1_coefficient`` then
means the same on every model. The scaled activations train by the one loop of every
dictionary, with SAELens's ``StandardTrainingSAE`` or ``TopKTrainingSAE`` loss
(:class:`interp.dictionaries.training.SAELoss`, whose module docstring gives the losses and
the schedules). ``b_dec`` starts at 0 (SAELens's default; the mean would pull every feature off
the data's own directions when they are not centred), ``W_dec`` rows at norm 0.1 (standard) or
1 (topk), and ``W_enc = W_decᵀ``.

The returned SAE is in the model's units, with unit-norm decoder rows: each feature is
rescaled by ``n_j / c`` (``n_j = ||W_dec[j]||``), which leaves the reconstruction exactly
unchanged (ReLU and TopK commute with a positive scale that is equal for all features in the
TopK case, where ``n_j = 1``). Its figures (L0, explained variance, MSE, dead features:
:mod:`interp.saes.held_out`) are measured on held-out text (:data:`EVAL_TOKENS` tokens,
:meth:`TokenRows.held_out` with seed :data:`EVAL_SEED`). The activations may come from a store
instead (``store=``, ``max_bytes``: :func:`train_sae`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain

import pandas as pd
import torch
from torch import Tensor

from interp.dictionaries.data import TokenRows, activations_at
from interp.dictionaries.training import BUFFER_BATCHES, SAELoss, fit
from interp.engine import check_hook_names, trim_freed_memory
from interp.foundation.formatting import summary_html, table_html
from interp.saes import held_out
from interp.saes.sae import SAE
from interp.stores import ActivationStore

__all__ = ["EVAL_SEED", "EVAL_TOKENS", "TrainingReport", "train_sae"]

TRAINABLE = ("standard", "topk")
EVAL_TOKENS = 32768  # held-out tokens the report's figures are measured on
EVAL_CHUNK = 4096  # tokens encoded at a time for those figures
EVAL_SEED = 12345  # the same held-out rows for every run on the same texts


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


def _drawn(model, hook: str, rows: TokenRows, gen, size: int):
    """Activations computed as training goes: ``size`` tokens drawn at a time, shuffled."""
    while True:
        acts = activations_at(model, hook, rows.draw(size))
        yield acts[torch.randperm(len(acts), generator=gen)]


def _source(model, hook, rows, gen, held_out_rows, store, max_bytes, **settings):
    """``(buffers, held-out rows, budgeted)``: computed as training goes, or the store's
    (:func:`train_sae`'s ``store`` and ``max_bytes``)."""
    if store is None:
        if max_bytes is not None:
            raise ValueError("max_bytes bounds what is read from a store; pass store= as well")
        size = BUFFER_BATCHES * settings["batch_tokens"]
        return _drawn(model, hook, rows, gen, size), held_out_rows, False
    if isinstance(store, str | os.PathLike):  # a folder: opened here, as in 0.5
        store = ActivationStore(store)
    buffers, held_out_rows = store.sae_source(
        model, hook, rows, gen, max_bytes=max_bytes, held_out=held_out_rows, chunk=EVAL_CHUNK,
        **settings,
    )  # fmt: skip
    return buffers, held_out_rows, max_bytes is not None


def _start(d_sae: int, d_in: int, k: int | None, gen, device) -> dict[str, Tensor]:
    """``W_dec`` rows at norm 0.1 (standard) or 1 (topk), ``W_enc = W_decᵀ``, biases at 0."""
    W_dec = torch.rand(d_sae, d_in, generator=gen) * 2 - 1
    W_dec *= (0.1 if k is None else 1.0) / W_dec.norm(dim=1, keepdim=True)
    p = {
        "W_enc": W_dec.T.clone(),
        "b_enc": torch.zeros(d_sae),
        "W_dec": W_dec,
        "b_dec": torch.zeros(d_in),
    }
    return {name: t.to(device).requires_grad_() for name, t in p.items()}


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
        steps, batch_tokens, lr: Adam's steps, activation vectors per step, learning rate.
        seed: seeds the data, the initialisation and the shuffles: the same seed gives the
            same weights.
        device: where to train (default: the model's device).
        store: an opened :class:`interp.ActivationStore` of the model's activations at
            ``hook`` to train on instead of running the model (it adapts itself:
            ``store.sae_source``; a folder path is opened as ``ActivationStore(path)``;
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
    source, held_out_rows, budgeted = _source(
        model, hook, rows, gen, rows.held_out(EVAL_TOKENS, EVAL_SEED), store, max_bytes,
        batch_tokens=batch_tokens, d_sae=d_sae,
    )  # fmt: skip
    first = next(source).to(device)
    scale = math.sqrt(first.shape[1]) / first.norm(dim=1).mean().clamp_min(1e-12).item()
    p = _start(d_sae, first.shape[1], k, gen, device)
    buffers = ((acts.to(device),) for acts in chain([first], source))
    del first
    loss = SAELoss(p, scale=scale, k=k, l1=l1_coefficient)
    history = fit(p, loss, buffers, steps=steps, batch_tokens=batch_tokens, lr=lr,
                  progress=progress, desc="training SAE")  # fmt: skip
    del source, buffers  # the reading and the last step freed
    if budgeted:
        trim_freed_memory()  # so that the evaluation's peak is not on top of it
    sae = _fold(p, scale, architecture, k, hook, rows.window)
    if budgeted:  # pass by pass: never every held-out activation at once
        passes = (activations_at(model, hook, [rows_]).to(device) for rows_ in held_out_rows)
        figures = held_out.streamed_figures(sae, passes, EVAL_CHUNK)
    else:
        x = activations_at(model, hook, held_out_rows).to(device)
        figures = held_out.figures(sae, x, EVAL_CHUNK)
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
