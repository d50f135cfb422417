"""Attribution patching: the first-order estimate of every patch from one backward pass.

Patching a site from ``source`` into the base run changes the metric by about

    (source_act - base_act) . d metric / d act      (gradient taken on the base run)

summed over the site's slice (its positions, head and features). One forward pass with
gradients on the base prompt and one backward pass give the gradient at every hook at once,
so the whole grid costs about as much as two or three forward passes, plus the source run
(Nanda 2023, "Attribution patching"). The estimate is exact where the metric is linear in the
patched activation (tests/interventions/test_patching_attribution.py) and can be far off elsewhere
(saturated softmaxes, LayerNorm scales): ``method="both"`` returns the exact numbers beside
it and :func:`interp.interventions.method_errors` the error per cell.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from interp.engine import (
    SITE_KINDS,
    CachedRun,
    HookFn,
    Intervention,
    MetricFn,
    Site,
    estimate_attribution_bytes,
    per_row,
    run_logits,
)

__all__ = ["attribution_deltas", "estimate_attribution_bytes"]


def _leaf(act: Tensor, hook) -> Tensor:
    # gradients must reach every later activation even if the weights are frozen
    return act if act.requires_grad else act.detach().requires_grad_(True)


def attribution_deltas(
    model,
    tokens: Tensor,
    source: CachedRun,
    sites: Sequence[Site],
    metric: MetricFn,
    *,
    fixed: Sequence[Intervention | tuple[str, HookFn]] = (),
) -> tuple[Float[Tensor, " site"], float]:
    """Estimated metric change of patching each site from ``source`` into ``tokens``, and
    the base run's metric. ``source`` must hold every site's hook (``run_cached(hooks=...)``).
    With several rows (a task, row ``i`` patched from ``source`` row ``i``) both are of the
    metric's mean over rows: the gradient of the mean, summed over rows.

    Weights get no gradient (``torch.autograd.grad`` on the activations only), so the model's
    ``.grad`` fields are left as they were.
    """
    by_hook: dict[str, list[int]] = {}
    for i, site in enumerate(sites):
        by_hook.setdefault(site.hook_name, []).append(i)
    names = sorted(by_hook)
    stored: dict[str, Tensor] = {}

    def store(name: str) -> HookFn:
        def hook(act: Tensor, hook) -> Tensor:
            stored[name] = act
            return act  # the bridge then computes on from this very tensor (grads reach it)

        return hook

    logits = run_logits(
        model,
        tokens,
        fixed,
        before=[("blocks.0.hook_resid_pre", _leaf)],
        after=[(name, store(name)) for name in names],
        grad=True,
    )
    with torch.enable_grad():
        value = per_row(metric, logits).mean()  # one prompt: its value; a task: the mean
        grads = torch.autograd.grad(value, [stored[name] for name in names], allow_unused=True)
    with torch.no_grad():
        reduced = {}
        for name, grad in zip(names, grads, strict=True):
            base = stored[name].detach()
            if grad is None:  # the metric does not depend on this hook
                grad = torch.zeros_like(base)
            product = ((source[name].to(base.device) - base) * grad).float()
            reduced[name] = _per_pos_head(product, sites[by_hook[name][0]].kind)
        deltas = torch.empty(len(sites))
        for name, table in reduced.items():
            rows = by_hook[name]
            n_pos = table.shape[0] - 1
            pos = [n_pos if sites[i].pos is None else sites[i].pos % n_pos for i in rows]
            head = [sites[i].head or 0 for i in rows]
            deltas[rows] = table[pos, head].cpu()
    return deltas, float(value.detach())


def _per_pos_head(product: Tensor, kind: str) -> Float[Tensor, "pos_and_total head"]:
    """A hook's ``(source - base) * grad`` summed to one number per (query) position and head,
    with a last row holding the sum over all positions."""
    spec = SITE_KINDS[kind]
    if spec.head_axis is None:
        table = product.sum(dim=(0, 2))[:, None]  # [batch pos d_model] -> [pos 1]
    elif kind == "pattern":
        table = product.sum(dim=(0, 3)).T  # [batch head q_pos k_pos] -> [q_pos head]
    else:
        table = product.sum(dim=(0, 3))  # [batch pos head d_head] -> [pos head]
    return torch.cat([table, table.sum(dim=0, keepdim=True)])
