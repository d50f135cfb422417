"""SAE features as writers in the discovery graph: ``feature_edge_scores`` scores the edges from
each feature of a sparse autoencoder (and its reconstruction error) to every reader after it,
by EAP or EAP-IG, as in sparse feature circuits (Marks et al. 2024); docs/discovery.md, "SAE
features in the graph".

For an SAE at ``blocks.L.hook_resid_pre`` the stream there is, on every run,
``x = sum_j f_j W_dec[j] + b_dec + error`` (``f = sae.encode(x)``, ``error = x - sae(x)``).
Its writers are ``SAE{L}.F{j}`` (change ``(f_j,clean - f_j,corrupted) W_dec[j]``) and
``SAE{L}.error`` (change ``error_clean - error_corrupted``), each feeding every reader at layer
``L`` or later and ``logits`` (``b_dec`` is equal in the two runs: no node). An edge scores
:func:`interp.discovery.scores.edge_scores`' ``eap`` / ``eap-ig`` with the same gradients
(:func:`interp.discovery.gradients.reader_gradients`). The changes sum to ``x``'s, the sum of
the changes of the graph's writers before layer ``L``, so a reader's feature and error edges
sum to its edges from those writers (tested); ``upstream`` edges into the features:
:mod:`interp.discovery.feature_gradients`.
"""

from __future__ import annotations

import copy
import math

import pandas as pd
import torch
from torch import Tensor

from interp.dictionaries.core import resid_pre_layer
from interp.discovery.feature_gradients import FeatureDeltas, feature_tables
from interp.discovery.graph import EdgeGraph, edge_frame
from interp.discovery.runs import WriterOutputs, dataset_mean, task_inputs
from interp.engine import run_cached
from interp.engine.estimates import _itemsize
from interp.interventions.grids import undefined as _undefined  # too close to divide by
from interp.tasks import Task, TaskTokens

__all__ = ["FEATURE_METHODS", "feature_edge_scores", "feature_name", "error_name", "sae_layer"]

FEATURE_METHODS = ("eap", "eap-ig")  # the methods feature_edge_scores runs


def feature_name(layer: int, feature: int) -> str:
    """``SAE{layer}.F{feature}``: a feature of the SAE at ``blocks.{layer}.hook_resid_pre``."""
    return f"SAE{layer}.F{feature}"


def error_name(layer: int) -> str:
    """``SAE{layer}.error``: the reconstruction error of the SAE at that layer's stream."""
    return f"SAE{layer}.error"


def sae_layer(model, sae) -> int:
    """The layer ``L`` of an SAE at ``blocks.L.hook_resid_pre`` of ``model``; a ValueError
    for any other hook or a width that does not fit."""
    layer = resid_pre_layer(sae, "feature edges")
    if layer >= int(model.cfg.n_layers) or sae.d_in != int(model.cfg.d_model):
        raise ValueError(
            f"the SAE at {sae.hook_name} (d_in {sae.d_in}) does not fit this model "
            f"({model.cfg.n_layers} layers, d_model {model.cfg.d_model})"
        )
    return layer


def _decomposed(model, sae, tokens: Tensor, graph: EdgeGraph, layer: int, upstream: bool):
    """One run: the input embeddings, the features and the error at the SAE's hook, the
    writers before ``layer`` stacked in graph order (``upstream``, else None), the logits."""
    mlps = [f"blocks.{lay}.hook_mlp_out" for lay in range(layer)] if upstream and graph.mlps else []
    names = list(dict.fromkeys(["blocks.0.hook_resid_pre", sae.hook_name, *mlps]))
    run = run_cached(model, tokens, hooks=names, head_outputs=upstream and layer > 0)
    x, embed = run[sae.hook_name], run["blocks.0.hook_resid_pre"]
    with torch.no_grad():
        features = sae.encode(x.to(sae.W_enc.dtype))
        error = x - sae.decode(features).to(x.dtype)
    writers = None
    if upstream:  # the graph's writers before the layer
        heads = tuple(run[f"blocks.{lay}.attn.hook_result"] for lay in range(layer))
        writers = WriterOutputs(embed, heads, tuple(run[name] for name in mlps)).stacked()
    return embed, features, error, writers, run.logits


def _feature_deltas(
    model, sae, batch: TaskTokens, metric, graph: EdgeGraph, layer: int, upstream: bool
) -> tuple[float, float, FeatureDeltas]:
    """``(C, K, clean minus corrupted)``: the clean and corrupted dataset means and the
    changes of the features that changed, the error and (``upstream``) the earlier writers."""
    runs = [
        _decomposed(model, sae, t, graph, layer, upstream) for t in (batch.clean, batch.corrupted)
    ]
    (embed_c, f_c, err_c, writers_c, logits_c), (embed_k, f_k, err_k, writers_k, logits_k) = runs
    c, k = dataset_mean(metric, logits_c), dataset_mean(metric, logits_k)
    change = f_c - f_k  # [rows pos d_sae]
    active = torch.nonzero(change.flatten(0, 1).ne(0).any(0)).flatten()
    deltas = FeatureDeltas(
        embed_c - embed_k,
        change[..., active].to(embed_c.dtype),
        active,
        err_c - err_k,
        None if writers_c is None else writers_c - writers_k,
    )
    return c, k, deltas


def _feature_scores(
    tables, active: Tensor, d_sae: int, graph: EdgeGraph, layer: int, top_features: int | None
) -> tuple[list[tuple[str, str]], Tensor]:
    """The frame's ``(source, target)`` pairs and their sums (not yet divided by ``C - K``):
    features (the ``top_features`` kept) and the error into each reader, then (upstream)
    each earlier writer into each feature and the error."""
    full = torch.zeros(len(tables.readers), d_sae, dtype=torch.float64)
    full[:, active.cpu()] = tables.features
    weight = full.abs().sum(0)
    if tables.upstream is not None:
        weight = weight + tables.upstream.abs().sum(0)
    kept = torch.arange(d_sae)
    if top_features is not None:
        kept = weight.argsort(descending=True, stable=True)[:top_features].sort()[0]
    nodes = [feature_name(layer, int(j)) for j in kept] + [error_name(layer)]
    values = torch.cat([full[:, kept], tables.error.unsqueeze(1)], dim=1)  # [reader node]
    pairs = [(s, str(t)) for t in tables.readers for s in nodes]
    if tables.upstream is None:
        return pairs, values.flatten()
    before = list(graph.writers[: tables.upstream.shape[0]])
    pairs += [(w, t) for t in nodes for w in before]
    into = torch.cat([tables.upstream[:, kept], tables.upstream_error.unsqueeze(1)], dim=1)
    return pairs, torch.cat([values.flatten(), into.T.flatten()])


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
    upstream: bool = False,
) -> pd.DataFrame:
    """Score the edges from an SAE's features and its error to every reader after it, and
    (``upstream``) from every writer before it to them.

    Args:
        sae: an :class:`interp.saes.sae.SAE` at ``blocks.L.hook_resid_pre`` (other hooks are
            refused: a feature there is read by every later reader, nothing else is).
        method: ``"eap"`` or ``"eap-ig"``; it, ``ig_steps``, ``metric``, ``max_rows`` and
            ``max_bytes`` as :func:`interp.discovery.scores.edge_scores`'s.
        top_features: keep the edges of the ``top_features`` features with the largest
            ``sum |score|`` over their edges (default every feature); error edges are kept.
        upstream: also score ``W -> SAE{L}.F{j}`` and ``W -> SAE{L}.error`` for each graph
            writer ``W`` before layer ``L`` (:mod:`interp.discovery.feature_gradients`).

    Returns ``edge, source, target, score``: one row per (feature or error, reader), readers
    in graph order, each reader's features in index order then ``SAE{L}.error``; then, with
    ``upstream``, one row per (writer, feature or error), features in index order then the
    error, each one's writers in graph order. A feature that is equal in the clean and
    corrupted runs at every row and position scores exactly 0 into its readers; one that
    fires at no gradient point scores exactly 0 from its writers. ``attrs``: edge_scores',
    ``sae_layer`` and ``active_features`` (how many changed).
    """
    graph, batch, task_metric = task_inputs(
        model, task, metric, max_rows, max_bytes, method=method, methods=FEATURE_METHODS,
        ig_steps=ig_steps,
    )  # fmt: skip
    if top_features is not None and (not isinstance(top_features, int) or top_features < 0):
        raise ValueError(f"top_features must be a whole number >= 0, got {top_features!r}")
    layer = sae_layer(model, sae)
    if sae.W_dec.device != torch.device(model.cfg.device):
        sae = copy.deepcopy(sae).to(model.cfg.device)
    c, k, deltas = _feature_deltas(model, sae, batch, task_metric, graph, layer, upstream)
    n_rows, n_pos = (int(d) for d in batch.corrupted.shape)
    n_writers = 0 if deltas.writers is None else deltas.writers.shape[0]
    width = (2 + n_writers) * int(model.cfg.d_model) + len(deltas.active)
    held = width * n_rows * n_pos * _itemsize(model)
    with torch.enable_grad():
        tables = feature_tables(
            model, batch, task_metric, graph, sae, layer, deltas,
            steps=ig_steps if method == "eap-ig" else 0,
            max_rows=max_rows, max_bytes=max_bytes, held=held,
        )  # fmt: skip
    pairs, values = _feature_scores(tables, deltas.active, sae.d_sae, graph, layer, top_features)
    undefined = _undefined(c, k)
    scale = math.nan if undefined else 1.0 / (c - k)
    return edge_frame(
        pairs, (values * scale).numpy(), dict(clean_metric=c, corrupted_metric=k,
        method=method, n_rows=n_rows, recovered_undefined=undefined, sae_layer=layer,
        active_features=len(deltas.active)),
    )  # fmt: skip
