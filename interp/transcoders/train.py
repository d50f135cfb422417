"""Train transcoders on a model's MLPs: per-layer, with a skip term, or cross-layer.

Every layer's MLP input (``blocks.L.mlp.hook_in``) and output (``blocks.L.mlp.hook_out``) are
read in one pass per buffer of token rows (drawn as :func:`interp.train_sae` draws them), and
all layers train together on the same tokens, by the one loop of every dictionary
(:mod:`interp.dictionaries.training`, whose docstring gives the losses; the parameters' start
and folding: :mod:`interp.transcoders.fit`). The result is a
:class:`~interp.transcoders.TranscoderSet` in the model's units, saved (with ``out=``) in
circuit-tracer's format. Its figures (FVU, L0, dead features: :mod:`interp.transcoders.held_out`)
are measured per layer on held-out tokens (:data:`EVAL_TOKENS`, :meth:`TokenRows.held_out` with
seed :data:`EVAL_SEED`). With ``store=`` the pairs are read from disk instead
(:mod:`interp.stores.pairs`); the held-out figures still come from the model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import chain
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from interp.dictionaries.data import TokenRows, hook_activations
from interp.dictionaries.training import BUFFER_BATCHES
from interp.engine import trim_freed_memory
from interp.foundation.formatting import summary_html, table_html
from interp.saes.train import EVAL_CHUNK, EVAL_SEED  # train_sae's: the same held-out rows
from interp.stores.budget import token_bytes
from interp.stores.pairs import store_pairs
from interp.transcoders import fit as fitting
from interp.transcoders import held_out
from interp.transcoders.transcoder import ACTIVATIONS, TranscoderSet

__all__ = ["EVAL_SEED", "EVAL_TOKENS", "TranscoderTrainingReport", "train_transcoder"]

KINDS = ("per-layer", "skip", "cross-layer")  # a set's KINDS, "skip" a per-layer set with W_skip
INPUT_HOOK, OUTPUT_HOOK = "mlp.hook_in", "mlp.hook_out"  # circuit-tracer's names
EVAL_TOKENS = 16384  # held-out tokens the figures are measured on (EVAL_CHUNK at a time)


@dataclass(frozen=True)
class TranscoderTrainingReport:
    """What a :func:`train_transcoder` run did, and each layer's figures on held-out tokens."""

    kind: str
    activation: str
    steps: int
    tokens: int  # token positions trained on (steps x batch_tokens)
    figures: pd.DataFrame  # layer, fvu, l0, dead, dead_fraction (held-out)
    history: pd.DataFrame = field(repr=False)  # step, loss, fvu, l0, lr, sparsity_coefficient
    seconds: float = 0.0

    def _repr_html_(self) -> str:
        items = {
            "kind, activation": f"{self.kind}, {self.activation}",
            "steps, tokens": f"{self.steps}, {self.tokens:,}",
            "mean FVU": f"{self.figures['fvu'].mean():.4f}",
            "mean L0": f"{self.figures['l0'].mean():.2f}",
            "time": f"{self.seconds:.0f} s",
        }
        table = table_html(self.figures, max_rows=100)
        return summary_html("Transcoder training", items, table=table, table_title="per layer")


def _check(model, layers, kind, activation, d_tc, k, steps, batch_tokens) -> list[int]:
    n_layers = int(model.cfg.n_layers)
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} cannot be trained; pass one of {KINDS}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not one of {ACTIVATIONS}")
    if d_tc < 1 or steps < 1 or batch_tokens < 1:
        raise ValueError(
            f"d_tc, steps and batch_tokens must be positive, got {d_tc}, {steps}, {batch_tokens}"
        )
    if (activation == "topk") != (k is not None) or (k is not None and not 1 <= k <= d_tc):
        raise ValueError(f"topk needs k between 1 and d_tc={d_tc} (and only topk takes k); got {k}")
    layers = list(range(n_layers)) if layers is None else sorted(set(int(x) for x in layers))
    if layers != list(range(n_layers)):
        raise ValueError(
            f"layers {layers}: a transcoder set covers every layer of the model (0 to "
            f"{n_layers - 1}, circuit-tracer's format); pass layers=None"
        )
    return layers


def _pairs(model, batches: Sequence[Tensor], layers: list[int], device=None):
    """Every kept token's MLP inputs and outputs ``[n layer d_model]`` (on ``device``)."""
    hooks = [[f"blocks.{layer}.{hook}" for layer in layers] for hook in (INPUT_HOOK, OUTPUT_HOOK)]
    xs, ys = [], []
    for tokens in batches:
        acts = hook_activations(model, hooks[0] + hooks[1], tokens)
        xs.append(torch.stack([acts[h] for h in hooks[0]], 1))
        ys.append(torch.stack([acts[h] for h in hooks[1]], 1))
    return torch.cat(xs).to(device), torch.cat(ys).to(device)


def _transcoder_set(w: dict[str, Tensor], kind: str, activation: str, k, name: str):
    n_layers = w["W_enc"].shape[0]
    cross = kind == "cross-layer"
    W_dec = [w["W_dec"][s, :, s:] if cross else w["W_dec"][s, :, 0] for s in range(n_layers)]
    return TranscoderSet(
        [w["W_enc"][s].T.contiguous() for s in range(n_layers)],
        list(w["b_enc"]),
        [t.contiguous() for t in W_dec],
        list(w["b_dec"]),
        kind="cross-layer" if cross else "per-layer",
        activation=activation,
        threshold=list(w["threshold"]) if "threshold" in w else None,
        k=k,
        W_skip=[t.T.contiguous() for t in w["W_skip"]] if "W_skip" in w else None,
        input_hook=INPUT_HOOK,
        output_hook=OUTPUT_HOOK,
        name=name,
    )


def _sizes(model, n_layers: int, *, kind, activation, d_tc, **_) -> dict:
    """The set's parameters (``w_dec`` of them its decoder's), for its budget."""
    d_model, cross = int(model.cfg.d_model), kind == "cross-layer"
    w_dec = n_layers * d_tc * (n_layers if cross else 1) * d_model
    params = w_dec + n_layers * (d_model * d_tc + d_tc + d_model)  # W_enc, b_enc, b_dec
    params += n_layers * (d_model**2 * (kind == "skip") + d_tc * (activation == "jumprelu"))
    return {"params": params, "w_dec": w_dec, "d_tc": d_tc, "chunk": EVAL_CHUNK}


def _source(model, layers, rows, gen, pairs, held_out_rows, store, max_bytes, device, **settings):
    """``(buffers of pairs, held-out rows, budgeted)``: computed as training goes (``pairs``
    of drawn rows; shuffled by :func:`_scaled`), or a store's shuffled batches, checked before
    any read; the held-out rows split into the passes ``max_bytes`` allows."""
    if store is None:
        if max_bytes is not None:
            raise ValueError("max_bytes bounds what is read from a store; pass store= as well")
        size = BUFFER_BATCHES * settings["batch_tokens"]
        return (pairs(rows.draw(size)) for _ in iter(int, 1)), held_out_rows, False
    stored, held_out_rows = store_pairs(  # with max_bytes, the whole call within it
        model, store, layers, (INPUT_HOOK, OUTPUT_HOOK), gen, max_bytes=max_bytes,
        held_out=held_out_rows, batch_tokens=settings["batch_tokens"],
        sizes=_sizes(model, len(layers), **settings) | {"tokens": token_bytes(rows)},
    )  # fmt: skip
    return ((x.to(device), y.to(device)) for x, y in stored), held_out_rows, max_bytes is not None


def _scaled(buffers, c_in: Tensor, c_out: Tensor, gen: torch.Generator | None):
    """Each buffer ``(x, y)`` shuffled by ``gen`` (None: already shuffled) and scaled."""
    for x, y in buffers:
        if gen is not None:
            order = torch.randperm(len(x), generator=gen).to(x.device)
            x, y = x[order], y[order]
        yield x * c_in[:, None], y * c_out[:, None]


def train_transcoder(
    model,
    layers: Sequence[int] | None = None,
    texts: Sequence[str] | None = None,
    *,
    d_tc: int,
    kind: str = "per-layer",
    activation: str = "relu",
    k: int | None = None,
    sparsity: float = 1.0,
    steps: int = 2000,
    batch_tokens: int = 1024,
    lr: float = 1e-3,
    seed: int = 0,
    out: str | Path | None = None,
    name: str | None = None,
    progress: bool = True,
    device: str | torch.device | None = None,
    store=None,
    max_bytes: int | str | None = None,
) -> tuple[TranscoderSet, TranscoderTrainingReport]:
    """Train transcoders on every MLP of ``model``.

    Args:
        layers: the layers to train (None: all; a set covers every layer).
        texts, steps, batch_tokens, lr, seed, progress, device, max_bytes: as
            :func:`interp.train_sae`'s.
        d_tc: features per layer.
        kind: ``"per-layer"``, ``"skip"`` (per-layer with a linear skip ``W_skip``) or
            ``"cross-layer"`` (layer l's features write into every later MLP output too).
        activation: ``"relu"`` (L1 penalty on activation x decoder norm), ``"jumprelu"`` (L0
            penalty, learned thresholds) or ``"topk"`` (needs ``k``).
        sparsity: λ, the weight of the sparsity penalty (:mod:`interp.transcoders.fit`).
        out: a folder to save the set into, in circuit-tracer's format.
        store: an :class:`interp.ActivationStore` (or its folder) holding every layer's
            ``blocks.L.mlp.hook_in`` and ``blocks.L.mlp.hook_out``, to train on instead of
            running the model.

    Returns:
        ``(transcoders, report)``: the set in the model's units, and its figures per layer.
    """
    layers = _check(model, layers, kind, activation, d_tc, k, steps, batch_tokens)
    start = time.perf_counter()
    device = torch.device(device if device is not None else model.cfg.device)
    gen = torch.Generator().manual_seed(seed)
    rows = TokenRows(model, texts, gen)
    d_model = int(model.cfg.d_model)
    pairs = partial(_pairs, model, layers=layers, device=device)
    fresh, held_out_rows, budgeted = _source(
        model, layers, rows, gen, pairs, rows.held_out(EVAL_TOKENS, EVAL_SEED), store, max_bytes,
        device, kind=kind, activation=activation, d_tc=d_tc, batch_tokens=batch_tokens,
    )  # fmt: skip
    p, mask, c_in, c_out, history = _fit(
        fresh, gen if store is None else None, gen, len(layers), d_model, device, kind=kind,
        activation=activation, k=k, d_tc=d_tc, sparsity=sparsity, steps=steps,
        batch_tokens=batch_tokens, lr=lr, progress=progress,
    )  # fmt: skip
    del fresh  # the reading freed before the evaluation
    if budgeted:
        trim_freed_memory()  # so that the evaluation's peak is not on top of it
    weights = fitting.fold(p, mask, c_in, c_out, activation)
    tc = _transcoder_set(weights, kind, activation, k, name or f"{kind}-{activation}")
    if budgeted:  # pass by pass: never every held-out pair at once
        figures = held_out.streamed_figures(tc, (pairs([r]) for r in held_out_rows), EVAL_CHUNK)
    else:
        figures = held_out.figures(tc, *pairs(held_out_rows), EVAL_CHUNK)
    seconds, history = time.perf_counter() - start, pd.DataFrame(history)
    report = TranscoderTrainingReport(
        kind, activation, steps, steps * batch_tokens, figures, history, seconds
    )
    if out is not None:
        tc.save(out)
    return tc, report


def _fit(fresh, shuffle, gen, n_layers, d_model, device, *, kind, activation, d_tc, **settings):
    """Scales from the first buffer of ``fresh`` (one per layer and side: mean norm
    ``sqrt(d_model)``, fit's module docstring), the parameters' start
    (:func:`interp.transcoders.fit.init_params`) with the mask of which layers each layer's
    features write, and the training: ``(p, mask, c_in, c_out, history)``. ``shuffle``: the
    generator that shuffles each buffer (None: a store's batches, shuffled already)."""
    first = next(fresh)
    c_in = d_model**0.5 / first[0].norm(dim=-1).mean(0).clamp_min(1e-12)
    c_out = d_model**0.5 / first[1].norm(dim=-1).mean(0).clamp_min(1e-12)
    buffers = _scaled(chain([first], fresh), c_in, c_out, shuffle)
    del first
    cross = kind == "cross-layer"
    p = fitting.init_params(
        n_layers, d_model, d_tc, cross=cross, skip=kind == "skip", activation=activation, gen=gen
    )
    p = {key: t.to(device).requires_grad_() for key, t in p.items()}
    ones = torch.ones(n_layers, n_layers, device=device)
    mask = ones.triu() if cross else torch.eye(n_layers, device=device)
    history = fitting.fit(partial(next, buffers), p, mask, activation=activation, **settings)
    return p, mask, c_in, c_out, history
