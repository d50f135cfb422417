"""Ablation effects: how much each component's output matters, per row of a task.

:func:`ablation_effects` ablates one site at a time on the clean run (``zero``: set to 0;
``mean``: set to its mean over every real token of every row, the dataset mean, as the IOI
paper's mean ablation) and reads the metric. With ``m_i(site)`` the ablated metric of row
``i`` and ``c_i`` its clean metric, over ``n`` rows:

- ``metric = mean_i m_i``, ``effect = metric - mean_i c_i`` (negative: the site helped);
- ``effect_sem = std_i(m_i - c_i) / sqrt(n)`` (NaN for one row);
- ``per_row=True``: one table row per site and task row (column ``row``).

A prompt with a metric callable is a task of one row: ``ablation_effects(model, prompt,
metric)``. Rows are right-padded; real tokens never see the padding, and the dataset mean is
taken over real tokens only, so padding changes no number
(tests/interventions/test_ablation_effects.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import torch
from jaxtyping import Bool
from torch import Tensor

from interp.engine import Intervention, Site, check_eval, run_cached, run_patched
from interp.interventions.grids import site_frame
from interp.interventions.inputs import analysis_rows

__all__ = [
    "ablation_effects",
    "ABLATION_SITES",
    "ABLATION_KINDS",
]

# site name -> (site kind, per head): every position of a head's output, attention or MLP layer
ABLATION_SITES = {"heads": ("head", True), "attn": ("attn_out", False), "mlp": ("mlp_out", False)}
ABLATION_KINDS = ("zero", "mean")  # set to 0, or to the mean over every real token of every row


def _sites(model, names: Sequence[str], layers) -> list[Site]:
    unknown = [n for n in names if n not in ABLATION_SITES]
    if unknown:
        raise ValueError(f"unknown sites {unknown}; choose from {', '.join(ABLATION_SITES)}")
    chosen = range(int(model.cfg.n_layers)) if layers is None else [int(x) for x in layers]
    out = []
    for name in names:
        kind, per_head = ABLATION_SITES[name]
        for layer in chosen:
            Site(kind, layer, head=0 if per_head else None).check(model)
            heads = range(int(model.cfg.n_heads)) if per_head else [None]
            out += [Site(kind, layer, head=h) for h in heads]
    return out


def _dataset_mean(act: Tensor, mask: Bool[Tensor, "rows pos"]) -> Tensor:
    """The activation's mean over every real token of every row, broadcast to ``act``'s shape
    (a patch source: row i, position p gets the same mean)."""
    weight = mask.to(act.device, act.dtype).reshape(*mask.shape, *[1] * (act.ndim - 2))
    mean = (act * weight).sum(dim=(0, 1), keepdim=True) / weight.sum()
    return mean.expand_as(act)


def ablation_effects(
    model,
    prompt,
    metric=None,
    *,
    sites: Sequence[str] = ("heads",),
    ablation: str = "mean",
    per_row: bool = False,
    layers: Sequence[int] | None = None,
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Ablate each site alone on the clean run and measure the metric (module docstring).

    ``prompt`` is an :class:`interp.Task` (or its ``task.tokens(model)``), ``metric`` then
    ``"logit_diff"`` (default) or ``"prob_diff"``; or one prompt with a metric callable (the
    built-ins may name tokens by text). ``sites``: ``heads`` (each head's output), ``attn``,
    ``mlp`` (each layer's), at every position. ``ablation``: ``mean`` or ``zero``.
    ``max_rows`` / ``max_bytes`` bound the passes (:func:`interp.engine.run_patched`).

    Returns ``site, layer, head, pos, method, metric, effect, effect_sem`` (``method`` is the
    ablation), or with ``per_row`` ``site, layer, head, pos, row, method, metric, effect``.
    ``attrs``: ``clean_metric`` (the mean), ``clean_metric_rows``, ``n_rows``, ``metric_name``,
    ``ablation``.
    """
    check_eval(model)
    if ablation not in ABLATION_KINDS:
        raise ValueError(f"ablation must be one of {', '.join(ABLATION_KINDS)}, got {ablation!r}")
    rows = analysis_rows(
        model, prompt, None, metric, call="ablation_effects", per_row=per_row, pair=False
    )
    chosen = _sites(model, list(dict.fromkeys(sites)), layers)
    names = sorted({s.hook_name for s in chosen})
    clean = run_cached(model, rows.clean, hooks=names)
    rows = rows.settled(model, clean.logits)  # a batch-averaging metric, row by row
    clean_rows = rows.values(clean.logits)
    if ablation == "mean":
        mask = rows.batch.mask if rows.task else torch.ones_like(rows.clean, dtype=torch.bool)
        means = {n: _dataset_mean(clean[n], mask) for n in names}
        runs = [[Intervention(s, "patch", source=means[s.hook_name])] for s in chosen]
    else:
        runs = [[Intervention(s, "zero")] for s in chosen]
    del clean
    values = run_patched(
        model,
        rows.clean,
        runs,
        row_metric=rows.row_metric,
        max_rows=max_rows,
        max_bytes=max_bytes,
        progress=progress,
    ).double()  # [site rows]
    n = values.shape[1]
    if per_row:
        frame = site_frame([s for s in chosen for _ in range(n)], ablation, values.reshape(-1))
        frame.insert(4, "row", list(range(n)) * len(chosen))
        frame["effect"] = (values - clean_rows).reshape(-1).numpy()
    else:
        frame = site_frame(chosen, ablation, values.mean(dim=1))
        effects = values - clean_rows
        frame["effect"] = effects.mean(dim=1).numpy()
        frame["effect_sem"] = (effects.std(dim=1) / math.sqrt(n)).numpy() if n > 1 else math.nan
    frame.attrs.update(
        clean_metric=float(clean_rows.mean()),
        clean_metric_rows=clean_rows.tolist(),
        n_rows=n,
        metric_name=rows.name,
        ablation=ablation,
    )
    return frame
