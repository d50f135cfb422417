"""What each SAE feature responds to and what it writes: the data of feature pages.

Over batches of token rows the features are encoded at the SAE's hook (``run_cached`` with
the SAE spliced in, error term kept, so later layers see the model's own stream). Per feature:

- ``frequency``: the share of scanned tokens where ``f_j > 0``; ``mean_act``: the mean of
  ``f_j`` over those tokens; ``max_act``: its largest value. A feature with frequency 0 is
  dead on this text. Features are ranked by ``frequency * mean_act`` (the mean activation
  over all tokens) and the top ones shown.
- top contexts: the tokens where ``f_j`` is largest, each with a window of tokens around it
  and every token's ``f_j``.
- logit effects: ``W_dec[j]`` through the final norm's weight (LayerNorm-folded; the
  per-token scale left out, so these are directions, not logit changes of a run) and the
  unembedding, centred over the vocabulary for a LayerNorm: the tokens it promotes most and
  suppresses most (:func:`logit_effects`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.engine import run_cached
from interp.engine.splice import sae_acts_name
from interp.foundation.formatting import visible_token
from interp.models.norms import effective_weight, is_rms

__all__ = ["FeatureContext", "FeatureSummary", "feature_summary", "logit_effects"]

HISTOGRAM_BINS = 30  # bins of each feature's histogram of nonzero activations
ROWS_PER_PASS = 32  # token rows encoded per forward pass


@dataclass(frozen=True)
class FeatureContext:
    """One top-activating token of a feature: its row and position, and a window of tokens
    around it with the feature's activation at each."""

    row: int
    pos: int
    activation: float
    tokens: tuple[str, ...]
    activations: tuple[float, ...]
    center: int  # index of the top token inside the window


@dataclass(frozen=True)
class FeatureSummary:
    """Per-feature figures over the scanned tokens (module docstring)."""

    table: pd.DataFrame  # feature, frequency, mean_act, max_act, top_promoted, top_suppressed
    contexts: dict[int, list[FeatureContext]] = field(repr=False)
    histograms: dict[int, tuple[np.ndarray, np.ndarray]] = field(repr=False)  # counts, edges
    n_tokens: int = 0
    n_dead: int = 0


def logit_effects(
    model, sae, k: int = 5
) -> tuple[Int[Tensor, "d_sae k"], Int[Tensor, "d_sae k"], Float[Tensor, "d_sae d_vocab"]]:
    """For every feature, the ``k`` tokens whose logits ``W_dec[j]`` raises most and lowers
    most (module docstring), and the full effect matrix."""
    final = model.ln_final
    weight = effective_weight(final, int(model.cfg.d_model)).float()
    directions = sae.W_dec.detach().float().cpu()
    if not is_rms(final):  # a LayerNorm centres its input: remove each direction's mean
        directions = directions - directions.mean(-1, keepdim=True)
    effects = (directions * weight) @ model.W_U.detach().float().cpu()  # [d_sae d_vocab]
    return effects.topk(k, dim=-1).indices, (-effects).topk(k, dim=-1).indices, effects


def feature_summary(
    model,
    sae,
    batches: list[Int[Tensor, "batch pos"]],
    *,
    top: int = 20,
    contexts: int = 8,
    window: tuple[int, int] = (10, 3),
    n_effects: int = 5,
) -> FeatureSummary:
    """Encode ``batches`` at the SAE's hook and summarise the ``top`` features (module
    docstring): ``contexts`` per feature, each ``window`` tokens before and after."""
    acts_per_batch = []
    batches = [part for batch in batches for part in batch.split(ROWS_PER_PASS)]
    for batch in batches:
        run = run_cached(model, batch, saes=[sae], keep_logits=False)
        acts_per_batch.append(run[sae_acts_name(sae)].float().cpu())
    tokens = torch.cat([b.cpu() for b in _padded(batches)], 0)
    acts = torch.cat(_padded(acts_per_batch), 0)  # [rows pos d_sae]
    flat = acts.reshape(-1, acts.shape[-1])[tokens.flatten() >= 0]  # padding is not a token
    n_tokens = int(flat.shape[0])
    fires = flat > 0
    frequency = fires.float().mean(0)
    mean_act = torch.where(fires.any(0), flat.sum(0) / fires.sum(0).clamp_min(1), 0.0)
    max_act = flat.max(0).values
    ranked = torch.argsort(frequency * mean_act, descending=True)[:top]
    ranked = [int(j) for j in ranked if frequency[j] > 0]
    promoted, suppressed, _ = logit_effects(model, sae, n_effects)
    decode = _decoder(model)
    table = pd.DataFrame(
        {
            "feature": ranked,
            "frequency": [float(frequency[j]) for j in ranked],
            "mean_act": [float(mean_act[j]) for j in ranked],
            "max_act": [float(max_act[j]) for j in ranked],
            # whitespace drawn (visible_token), as the contexts show it: a newline token would
            # break the page's lines and the CSV's cells
            "top_promoted": [_listed(decode, promoted[j]) for j in ranked],
            "top_suppressed": [_listed(decode, suppressed[j]) for j in ranked],
        }
    )
    return FeatureSummary(
        table=table,
        contexts={j: _contexts(tokens, acts[..., j], contexts, window, decode) for j in ranked},
        histograms={j: np.histogram(flat[fires[:, j], j].numpy(), HISTOGRAM_BINS) for j in ranked},
        n_tokens=n_tokens,
        n_dead=int((~fires.any(0)).sum()),
    )


def _listed(decode, token_ids: Tensor) -> str:
    return " | ".join(visible_token(decode(t)) for t in token_ids.tolist())


def _padded(tensors: list[Tensor]) -> list[Tensor]:
    """Batches of rows of different lengths, right-padded with -1 (tokens) or 0 (acts)."""
    width = max(int(t.shape[1]) for t in tensors)
    out = []
    for t in tensors:
        pad = width - int(t.shape[1])
        if pad:
            fill = torch.full((t.shape[0], pad, *t.shape[2:]), -1 if t.dim() == 2 else 0.0)
            t = torch.cat([t, fill.to(t.dtype)], 1)
        out.append(t)
    return out


def _decoder(model):
    """A token id's text ("" for the padding, -1)."""
    tokenizer = model.tokenizer
    return lambda token_id: "" if token_id < 0 else tokenizer.decode([int(token_id)])


def _contexts(tokens, acts: Float[Tensor, "rows pos"], n: int, window, decode) -> list:
    """The ``n`` largest activations (at most one per row and position), with windows."""
    before, after = window
    values, where = acts.flatten().topk(min(n, acts.numel()))
    out = []
    for value, index in zip(values.tolist(), where.tolist(), strict=True):
        if value <= 0:
            break
        row, pos = divmod(index, int(acts.shape[1]))
        lo, hi = max(0, pos - before), min(int(acts.shape[1]), pos + after + 1)
        ids = tokens[row, lo:hi].tolist()
        keep = [i for i, t in enumerate(ids) if t >= 0]
        out.append(
            FeatureContext(
                row=row,
                pos=pos,
                activation=float(value),
                tokens=tuple(decode(ids[i]) for i in keep),
                activations=tuple(float(acts[row, lo + i]) for i in keep),
                center=pos - lo,
            )
        )
    return out
