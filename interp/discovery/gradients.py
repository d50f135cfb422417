"""Gradient estimates of edge patching: EAP and EAP-IG (inputs), every edge from one backward
pass per step.

An edge ``W->R`` scores ``sum_pos (a_clean[W] - a_corrupted[W]) . dm/d(input of R)``, summed
over rows here and averaged by the caller's mean; a reader's input is where
:mod:`interp.discovery.inputs` delivers a change (exact patching's delivery). For EAP the
gradient is taken on the corrupted run; for EAP-IG it is averaged over the runs whose input
embeddings are ``corrupted + (k / steps) (clean - corrupted)``, ``k = 0 .. steps - 1`` (as
hannamw/EAP-IG's ``eap-ig-inputs``; one step is EAP). The steps of a row are rows of one
batch, as many as ``max_bytes`` allows.

One plain backward pass gives the gradient at each layer's ``hook_q/k/v`` (per head), at the
MLP's input and at ``ln_final``'s input. Head ``h``'s q input reaches the metric only through
``ln1(x) @ W_Q[h]``, so its gradient is ``J_ln1(x)^T (W_Q[h] g_q[h])``: one product per layer
for all heads, then ``ln1``'s backward once for all of a layer's readers (a batch of them).
Each reader's writers are a prefix of the graph's writers, so a layer's scores are one matrix
product of the stacked writer deltas with that layer's reader gradients.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from interp.discovery.graph import QKV, Graph
from interp.discovery.inputs import _weights, shared_norm
from interp.discovery.runs import WriterOutputs, rows_metric
from interp.engine import (
    MemoryBudgetError,
    estimate_attribution_bytes,
    format_size,
    parse_size,
    run_logits,
)
from interp.engine.estimates import _itemsize
from interp.tasks import TaskMetric, TaskTokens

__all__ = ["gradient_scores", "reader_gradients"]


def _rows_at_once(model, graph, n_rows, n_pos, max_rows, max_bytes, held) -> int:
    if max_rows is not None:
        return max(1, min(n_rows, max_rows))
    if max_bytes is None:
        return n_rows
    per_row = estimate_attribution_bytes(model, n_pos) + 2 * len(graph.readers) * n_pos * int(
        model.cfg.d_model
    ) * _itemsize(model)
    budget = parse_size(max_bytes)
    fit = (budget - held) // per_row
    if fit < 1:
        raise MemoryBudgetError(
            f"one row's forward and backward pass with every reader's gradient needs about "
            f"{format_size(per_row)} beside the {format_size(held)} held, but max_bytes is "
            f"{format_size(budget)}; raise max_bytes to at least {format_size(held + per_row)}"
        )
    return int(min(n_rows, fit))


def _site_names(model, graph: Graph) -> tuple[list[list[str]], str]:
    """Per layer the hooks whose gradient is taken (q, k, v, then the MLP's input), and the
    logits reader's hook."""
    shared = shared_norm(model)
    layers = []
    for layer in range(graph.n_layers):
        names = [f"blocks.{layer}.attn.hook_{kind}" for kind in QKV]
        if graph.mlps:
            names.append(f"blocks.{layer}.{'mlp.hook_in' if shared else 'ln2.hook_in'}")
        layers.append(names)
    return layers, "ln_final.hook_in"


def _norm_backward(norm, x: Tensor, grads: Float[Tensor, "n rows pos d_model"]) -> Tensor:
    """``J_norm(x)^T g`` for each of ``grads``, one batched backward pass of ``norm``."""
    n, rows, n_pos, d = grads.shape
    with torch.enable_grad():
        inputs = x.unsqueeze(0).expand(n, rows, n_pos, d).reshape(n * rows, n_pos, d)
        inputs = inputs.detach().requires_grad_(True)
        (out,) = torch.autograd.grad(norm(inputs), inputs, grads.reshape(n * rows, n_pos, d))
    return out.reshape(n, rows, n_pos, d)


def reader_gradients(
    model,
    tokens: Tensor,
    metric: TaskMetric,
    graph: Graph,
    *,
    embed_shift: Tensor | None = None,
    fixed: Sequence = (),
    weights: dict[str, Tensor] | None = None,
):
    """``d sum_rows metric / d (reader input)``, one forward and one backward pass of
    ``tokens``: yields ``(layer, [reader rows pos d_model])`` for each layer's readers in
    graph order (``layer`` None: the logits). ``embed_shift`` is added to the input embeddings,
    ``fixed`` raw hooks go first; ``weights``: ``W_Q``, ``W_K``, ``W_V`` if already read."""
    weights = weights or {kind: _weights(model, kind)[0].detach() for kind in QKV}
    layer_names, final = _site_names(model, graph)
    leaves: dict[str, Tensor] = {}
    inputs: dict[int, Tensor] = {}

    def site(name: str):
        def hook(act: Tensor, hook) -> Tensor:
            leaves[name] = torch.zeros_like(act, requires_grad=True)
            return act + leaves[name]  # a zero change: its gradient is this input's

        return hook

    def keep(layer: int):
        def hook(x: Tensor, hook) -> None:
            inputs[layer] = x.detach()

        return hook

    hooks = [(f"blocks.{layer}.ln1.hook_in", keep(layer)) for layer in range(graph.n_layers)]
    hooks += [(name, site(name)) for names in layer_names for name in names]
    hooks.append((final, site(final)))
    if embed_shift is not None:
        hooks.insert(0, ("blocks.0.hook_resid_pre", lambda act, hook: act + embed_shift))
    logits = run_logits(model, tokens, before=[*fixed, *hooks], grad=True)
    order = [*(name for names in layer_names for name in names), final]
    found = torch.autograd.grad(
        metric(logits).sum(), [leaves[n] for n in order], allow_unused=True, materialize_grads=True
    )  # a reader nothing depends on (frozen patterns: q and k) has gradient zero
    grads = dict(zip(order, found, strict=True))
    del logits
    leaves.clear()
    shared = shared_norm(model)
    for layer, names in enumerate(layer_names):
        at_norm = [  # the gradient at ln1's output of each q, k, v head: g[h] @ W[h]^T
            torch.einsum("rphe,hde->hrpd", grads.pop(name), weights[kind][layer])
            for name, kind in zip(names[:3], QKV, strict=True)
        ]
        if graph.mlps and shared:
            at_norm.append(grads.pop(names[3]).unsqueeze(0))
        found = [_norm_backward(model.blocks[layer].ln1, inputs.pop(layer), torch.cat(at_norm))]
        if graph.mlps and not shared:
            found.append(grads.pop(names[3]).unsqueeze(0))
        yield layer, torch.cat(found).detach()
    yield None, grads.pop(final).unsqueeze(0)


def _stacked(part: WriterOutputs, graph: Graph) -> Float[Tensor, "writer rows pos d_model"]:
    blocks = [part.embed.unsqueeze(0)]
    for layer in range(graph.n_layers):
        blocks.append(part.heads[layer].permute(2, 0, 1, 3))
        if graph.mlps:
            blocks.append(part.mlps[layer].unsqueeze(0))
    return torch.cat(blocks)


def _reader_groups(graph: Graph) -> tuple[dict, Tensor, Tensor]:
    """Per layer (None: logits) the readers' graph indices; each reader's number of writers
    (a prefix of ``graph.writers``); each edge's (writer, reader) indices."""
    writer_index = {w: i for i, w in enumerate(graph.writers)}
    reader_index = {r: i for i, r in enumerate(graph.readers)}
    n_sources = [0] * len(graph.readers)
    for w, r in graph.edges:
        if writer_index[w] != n_sources[reader_index[r]]:
            raise AssertionError(f"{r}'s writers are not a prefix of the graph's writers")
        n_sources[reader_index[r]] += 1
    groups: dict = {}
    for r in graph.readers:
        groups.setdefault(r.layer, []).append(reader_index[r])
    src = torch.tensor([writer_index[w] for w, _ in graph.edges])
    dst = torch.tensor([reader_index[r] for _, r in graph.edges])
    return groups, torch.tensor(n_sources), torch.stack([src, dst])


def gradient_scores(
    model,
    batch: TaskTokens,
    metric: TaskMetric,
    graph: Graph,
    deltas: WriterOutputs,
    *,
    steps: int = 0,
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
    held: int = 0,
    fixed: Sequence = (),
) -> Float[Tensor, " edge"]:
    """The estimated change of the metric's dataset mean from patching each edge (graph order);
    ``steps=0``: EAP, else EAP-IG with ``steps`` points. A pass holds ``max_rows`` (or as many
    as ``max_bytes`` allows) of the task's rows times steps, row by row, each row's steps
    together; the numbers do not depend on the split."""
    n_rows, n_pos = (int(d) for d in batch.corrupted.shape)
    n_steps = max(1, steps)
    total_rows = n_rows * n_steps  # (row, step) pairs, row-major
    chunk = _rows_at_once(model, graph, total_rows, n_pos, max_rows, max_bytes, held)
    groups, n_sources, (src, dst) = _reader_groups(graph)
    table = torch.zeros(len(graph.writers), len(graph.readers), dtype=torch.float64)
    weights = {kind: _weights(model, kind)[0].detach() for kind in QKV}
    tokens = batch.corrupted.to(model.cfg.device)
    for lo in range(0, total_rows, chunk):
        hi = min(lo + chunk, total_rows)
        task_rows = torch.arange(lo, hi) // n_steps
        first, last = int(task_rows[0]), int(task_rows[-1]) + 1
        part = deltas.rows(first, last)
        alphas = (torch.arange(lo, hi) % n_steps).to(part.embed) / n_steps
        shift = None
        if steps:
            shift = part.embed[task_rows - first] * alphas.view(-1, 1, 1)
        gradients = reader_gradients(
            model,
            tokens[task_rows.to(tokens.device)],
            rows_metric(metric, task_rows),
            graph,
            embed_shift=shift,
            fixed=fixed,
            weights=weights,
        )
        local = (task_rows - first).to(part.embed.device)
        stacked = _stacked(part, graph).flatten(1)  # [writer rows*pos*d_model]
        for layer, grad in gradients:
            if n_steps > 1:  # sum each row's steps: [reader rows pos d_model]
                grad = (
                    torch.zeros((grad.shape[0], last - first, *grad.shape[2:]), dtype=grad.dtype)
                    .to(grad.device)
                    .index_add_(1, local, grad)
                )
            readers = torch.tensor(groups[layer])
            n = int(n_sources[readers].max())
            block = stacked[:n] @ grad.flatten(1).T  # [writer reader]
            table[:n, readers] += block.double().cpu()
    return table[src, dst] / (n_rows * n_steps)
