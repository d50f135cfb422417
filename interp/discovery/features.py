"""SAE features as writers in the discovery graph: ``feature_edge_scores`` scores the edges from
each feature of a sparse autoencoder (and its reconstruction error) to every reader after it,
by EAP or EAP-IG, as in sparse feature circuits (Marks et al. 2024); docs/discovery.md.

For an SAE at ``blocks.L.hook_resid_pre`` the residual stream there is, on every run,
``x = sum_j f_j W_dec[j] + b_dec + error`` with ``f = sae.encode(x)`` and
``error = x - sae(x)``. Its writers are named

- ``SAE{L}.F{j}``: feature ``j`` (its change ``(f_j,clean - f_j,corrupted) W_dec[j]``);
- ``SAE{L}.error``: the reconstruction error (its change ``error_clean - error_corrupted``);

and each feeds every reader at layer ``L`` or later, and ``logits``. ``b_dec`` is equal in the
two runs, so it is no node. An edge scores ``sum_pos change . dm/d(reader input)``, averaged
over rows, divided by ``C - K``: :func:`interp.discovery.scores.edge_scores`' ``eap`` and
``eap-ig`` with the same gradients (:func:`interp.discovery.gradients.reader_gradients`).
Since the changes sum to ``x``'s change, which is the sum of the changes of the graph's writers
before layer ``L``, a reader's feature edges plus its error edge sum to its edges from those
writers (tested).
"""

from __future__ import annotations

import copy
import math
import re

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from interp.discovery.gradients import _rows_at_once, reader_gradients
from interp.discovery.graph import Graph, Reader, edge_name
from interp.discovery.runs import METRICS, _undefined, rows_metric
from interp.engine import check_eval, run_cached
from interp.engine.estimates import _itemsize
from interp.tasks import Task, TaskMetric, TaskTokens

__all__ = ["FEATURE_METHODS", "feature_edge_scores", "feature_name", "error_name", "sae_layer"]

FEATURE_METHODS = ("eap", "eap-ig")  # the methods feature_edge_scores runs
_RESID_PRE = re.compile(r"^blocks\.(\d+)\.hook_resid_pre$")


def feature_name(layer: int, feature: int) -> str:
    """``SAE{layer}.F{feature}``: a feature of the SAE at ``blocks.{layer}.hook_resid_pre``."""
    return f"SAE{layer}.F{feature}"


def error_name(layer: int) -> str:
    """``SAE{layer}.error``: the reconstruction error of the SAE at that layer's stream."""
    return f"SAE{layer}.error"


def sae_layer(model, sae) -> int:
    """The layer ``L`` of an SAE at ``blocks.L.hook_resid_pre`` of ``model``; a ValueError
    for any other hook or a width that does not fit."""
    found = _RESID_PRE.match(str(sae.hook_name))
    if found is None:
        raise ValueError(
            f"feature edges need an SAE on the residual stream at a layer's start "
            f"(blocks.L.hook_resid_pre), where every later reader sees its features; this one "
            f"reads {sae.hook_name!r}"
        )
    layer = int(found.group(1))
    if layer >= int(model.cfg.n_layers) or sae.d_in != int(model.cfg.d_model):
        raise ValueError(
            f"the SAE at {sae.hook_name} (d_in {sae.d_in}) does not fit this model "
            f"({model.cfg.n_layers} layers, d_model {model.cfg.d_model})"
        )
    return layer


def _decomposed(model, sae, tokens: Tensor, layer: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One run: the input embeddings, the features and the error at the SAE's hook, the
    logits."""
    names = list(dict.fromkeys(["blocks.0.hook_resid_pre", sae.hook_name]))
    run = run_cached(model, tokens, hooks=names)
    x = run[sae.hook_name]
    with torch.no_grad():
        features = sae.encode(x.to(sae.W_enc.dtype))
        error = x - sae.decode(features).to(x.dtype)
    return run["blocks.0.hook_resid_pre"], features, error, run.logits


def _feature_table(
    model,
    batch: TaskTokens,
    metric: TaskMetric,
    graph: Graph,
    layer: int,
    deltas: tuple[Tensor, Tensor, Tensor],
    W_dec: Float[Tensor, "active d_model"],
    *,
    steps: int,
    max_rows: int | None,
    max_bytes: int | str | None,
    held: int,
) -> tuple[Float[Tensor, "reader active"], Float[Tensor, " reader"], list[Reader]]:
    """Summed over rows and positions, divided by rows x steps: each active feature's and the
    error's change dotted with each reader's gradient (readers at ``layer`` or later)."""
    embed, features, error = deltas  # [rows pos d_model], [rows pos active], [rows pos d_model]
    readers = [r for r in graph.readers if r.layer is None or r.layer >= layer]
    index = {r: i for i, r in enumerate(readers)}
    by_layer: dict = {}
    for r in readers:
        by_layer.setdefault(r.layer, []).append(index[r])
    feature_table = torch.zeros(len(readers), W_dec.shape[0], dtype=torch.float64)
    error_table = torch.zeros(len(readers), dtype=torch.float64)
    n_rows, n_pos = (int(d) for d in batch.corrupted.shape)
    n_steps = max(1, steps)
    total = n_rows * n_steps
    chunk = _rows_at_once(model, graph, total, n_pos, max_rows, max_bytes, held)
    tokens = batch.corrupted.to(model.cfg.device)
    for lo in range(0, total, chunk):
        hi = min(lo + chunk, total)
        task_rows = torch.arange(lo, hi) // n_steps
        first, last = int(task_rows[0]), int(task_rows[-1]) + 1
        shift = None
        if steps:
            alphas = (torch.arange(lo, hi) % n_steps).to(embed) / n_steps
            shift = embed[task_rows.to(embed.device)] * alphas.view(-1, 1, 1)
        gradients = reader_gradients(
            model, tokens[task_rows.to(tokens.device)], rows_metric(metric, task_rows), graph,
            embed_shift=shift,
        )  # fmt: skip
        local = (task_rows - first).to(embed.device)
        f_part = features[first:last].flatten(0, 1)  # [rows*pos active]
        e_part = error[first:last].flatten(0, 1)  # [rows*pos d_model]
        for lay, grad in gradients:
            if lay is not None and lay < layer:
                continue
            if n_steps > 1:  # sum each row's steps
                grad = torch.zeros(
                    (grad.shape[0], last - first, *grad.shape[2:]), dtype=grad.dtype,
                    device=grad.device,
                ).index_add_(1, local, grad)  # fmt: skip
            ids = by_layer[lay]  # all of this layer's readers, in the order of grad's
            flat = grad.flatten(1, 2)  # [reader rows*pos d_model]
            projected = flat @ W_dec.T  # [reader rows*pos active]
            feature_table[ids] += torch.einsum("rna,na->ra", projected, f_part).double().cpu()
            error_table[ids] += torch.einsum("rnd,nd->r", flat, e_part).double().cpu()
    return feature_table / total, error_table / total, readers


def feature_edge_scores(
    model,
    task: Task | TaskTokens,
    sae,
    method: str = "eap",
    *,
    metric: str = "logit_diff",
    ig_steps: int = 5,
    top_features: int | None = None,
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
) -> pd.DataFrame:
    """Score the edges from an SAE's features and its error to every reader after it.

    Args:
        sae: an :class:`interp.saes.sae.SAE` at ``blocks.L.hook_resid_pre`` (other hooks are
            refused: a feature there is read by every later reader, nothing else is).
        method: ``"eap"`` or ``"eap-ig"`` (``ig_steps`` points), as in
            :func:`interp.discovery.scores.edge_scores`.
        metric: a :meth:`interp.tasks.TaskTokens.metric` kind.
        top_features: keep the edges of the ``top_features`` features with the largest
            ``sum |score|`` over their readers (default every feature); error edges are kept.
        max_rows / max_bytes: task rows x steps per backward pass, or a budget they are
            planned from; the scores do not depend on them.

    Returns ``edge, source, target, score``, one row per (feature or error, reader): readers
    in graph order, each reader's features in index order then ``SAE{L}.error``. A feature
    that is equal in the clean and corrupted runs at every row and position scores exactly
    0. ``attrs``: ``clean_metric``, ``corrupted_metric``, ``method``, ``n_rows``,
    ``recovered_undefined``, ``sae_layer``, ``active_features`` (how many changed).
    """
    check_eval(model)
    if method not in FEATURE_METHODS:
        raise ValueError(f"method must be one of {', '.join(FEATURE_METHODS)}, got {method!r}")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if method == "eap-ig" and (not isinstance(ig_steps, int) or ig_steps < 1):
        raise ValueError(f"ig_steps must be a whole number >= 1, got {ig_steps!r}")
    if max_rows is not None and max_bytes is not None:
        raise ValueError("pass max_rows or max_bytes (rows per pass are planned from it), not both")
    if top_features is not None and (not isinstance(top_features, int) or top_features < 0):
        raise ValueError(f"top_features must be a whole number >= 0, got {top_features!r}")
    graph = Graph.from_model(model)
    layer = sae_layer(model, sae)
    device = model.cfg.device
    if sae.W_dec.device != torch.device(device):
        sae = copy.deepcopy(sae).to(device)
    batch = task.tokens(model) if isinstance(task, Task) else task
    task_metric = batch.metric(metric)
    embed_c, f_c, err_c, logits_c = _decomposed(model, sae, batch.clean.to(device), layer)
    embed_k, f_k, err_k, logits_k = _decomposed(model, sae, batch.corrupted.to(device), layer)
    c = float(task_metric(logits_c).double().mean())
    k = float(task_metric(logits_k).double().mean())
    del logits_c, logits_k
    change = f_c - f_k  # [rows pos d_sae]
    active = torch.nonzero(change.flatten(0, 1).ne(0).any(0)).flatten()
    W_dec = sae.W_dec.detach()[active].to(embed_c.dtype)
    n_rows, n_pos = (int(d) for d in batch.corrupted.shape)
    held = (2 * int(model.cfg.d_model) + len(active)) * n_rows * n_pos * _itemsize(model)
    with torch.enable_grad():
        table, error_scores, readers = _feature_table(
            model, batch, task_metric, graph, layer,
            (embed_c - embed_k, change[..., active].to(embed_c.dtype), err_c - err_k), W_dec,
            steps=ig_steps if method == "eap-ig" else 0,
            max_rows=max_rows, max_bytes=max_bytes, held=held,
        )  # fmt: skip
    full = torch.zeros(len(readers), sae.d_sae, dtype=torch.float64)
    full[:, active.cpu()] = table
    kept = torch.arange(sae.d_sae)
    if top_features is not None:
        kept = full.abs().sum(0).argsort(descending=True, stable=True)[:top_features].sort()[0]
    undefined = _undefined(c, k)
    scale = math.nan if undefined else 1.0 / (c - k)
    sources = [feature_name(layer, int(j)) for j in kept] + [error_name(layer)]
    values = torch.cat([full[:, kept], error_scores.unsqueeze(1)], dim=1) * scale
    frame = pd.DataFrame(
        {
            "edge": [edge_name(s, str(r)) for r in readers for s in sources],
            "source": sources * len(readers),
            "target": [str(r) for r in readers for _ in sources],
            "score": values.flatten().numpy(),
        }
    )
    frame.attrs.update(
        clean_metric=c,
        corrupted_metric=k,
        method=method,
        n_rows=n_rows,
        recovered_undefined=undefined,
        sae_layer=layer,
        active_features=len(active),
    )
    return frame
