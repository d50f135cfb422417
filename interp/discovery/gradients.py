"""Gradient estimates of edge patching: EAP and EAP-IG (inputs), every edge from one backward
pass per step.

An edge ``W->R`` scores ``sum_pos (a_clean[W] - a_corrupted[W]) . dm/d(input of R)``, summed
over rows here and averaged by the caller's mean; a reader's input is where
:mod:`interp.discovery.inputs` delivers a change (exact patching's delivery). For EAP the
gradient is taken on the corrupted run; for EAP-IG it is averaged over the runs whose input
embeddings are ``corrupted + (k / steps) (clean - corrupted)``, ``k = 0 .. steps - 1`` (as
hannamw/EAP-IG's ``eap-ig-inputs``; one step is EAP), a row's steps in one batch.

One plain backward pass gives the gradient at each layer's ``hook_q/k/v`` (per head), at the
MLP's input and at ``ln_final``'s input. Head ``h``'s q input reaches the metric only through
``ln1(x) @ W_Q[h]``, so its gradient is ``J_ln1(x)^T (W_Q[h] g_q[h])``: one product per layer
for all heads, then ``ln1``'s backward once for all of a layer's readers (a batch of them).
Each reader's writers are a prefix of the graph's writers, so a layer's scores are one matrix
product of the stacked writer deltas with that layer's reader gradients.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from interp.discovery.graph import QKV, EdgeGraph
from interp.discovery.inputs import shared_norm
from interp.discovery.runs import WriterOutputs
from interp.engine import run_logits
from interp.engine.estimates import _itemsize
from interp.engine.plan import backward_rows
from interp.models.norms import qkv_weights
from interp.tasks import TaskMetric, TaskTokens

__all__ = ["gradient_scores", "reader_gradients", "gradient_points", "step_sums"]

_FINAL = "ln_final.hook_in"  # the logits reader's input


def _site_names(model, graph: EdgeGraph) -> list[list[str]]:
    """Per layer the hooks whose gradient is taken: q, k, v, then the MLP's input."""
    mlp = ["mlp.hook_in" if shared_norm(model) else "ln2.hook_in"] if graph.mlps else []
    kinds = [f"attn.hook_{kind}" for kind in QKV] + mlp
    return [[f"blocks.{layer}.{kind}" for kind in kinds] for layer in range(graph.n_layers)]


def _python_layernorm(norm) -> bool:
    """A bridge LayerNorm computed by TransformerLens's own python path (GPT-2, OPT, GPT-J):
    ``(x - mean) / sqrt(var + eps) * w + b``, whose backward is written out below."""
    from transformer_lens.model_bridge.generalized_components.normalization import (
        NormalizationBridge,
    )

    return (
        type(norm) is NormalizationBridge
        and isinstance(norm.original_component, torch.nn.LayerNorm)
        and norm.original_component.weight is not None
        and not norm.use_native_layernorm_autograd
        and not getattr(norm.config, "layer_norm_folding", False)
        and not norm.uses_weight_offset
    )


def _layer_gradients(
    norm, x: Tensor, heads: list[tuple[Tensor, Tensor]], at_norm: Tensor | None
) -> Float[Tensor, "reader rows pos d_model"]:
    """Gradients at ``x`` (the norm's input) of each head's reader, given ``g`` at its
    ``hook_q/k/v`` (``heads``: ``(g [rows pos n d_head], W [n d_model d_head])``), then of the
    norm's other reader (``at_norm``: a gradient at the norm's output, or None)."""
    rows, n_pos, d = x.shape
    if not _python_layernorm(norm):  # autograd, the norm's backward batched over readers
        outs = [torch.einsum("rphe,hde->hrpd", g, W) for g, W in heads]
        outs += [] if at_norm is None else [at_norm.unsqueeze(0)]
        with torch.enable_grad():
            inputs = x.detach().requires_grad_(True)
            (found,) = torch.autograd.grad(
                norm(inputs), inputs, torch.cat(outs), is_grads_batched=True
            )
        return found
    # LayerNorm's backward is (u - mean(u) - xhat mean(u xhat)) / s with u = w * gradient at
    # its output: the weight and the centring fold into W, 1/s into g, and the last term is
    # one multiply-add per head (xhat W) . g
    xf = x.float()
    centred = xf - xf.mean(-1, keepdim=True)
    scale = (centred.pow(2).mean(-1, keepdim=True) + getattr(norm.config, "eps", 1e-05)).sqrt()
    normed = centred / scale
    weight = norm.original_component.weight.detach().float()
    n_total = sum(g.shape[2] for g, _ in heads) + (at_norm is not None)
    out = torch.empty(n_total, rows * n_pos, d, device=x.device)
    i = 0
    for g, W in heads:
        n = g.shape[2]
        folded = weight[:, None] * W.float()
        folded = folded - folded.mean(dim=1, keepdim=True)  # [n d_model d_head]
        g = g.float() / scale.unsqueeze(-1)  # [rows pos n d_head]
        torch.bmm(
            g.permute(2, 0, 1, 3).reshape(n, rows * n_pos, -1),
            folded.transpose(1, 2),
            out=out[i : i + n],
        )
        along = (g * torch.einsum("rpd,nde->rpne", normed, folded)).sum(-1) / d
        out[i : i + n].addcmul_(
            normed.reshape(1, rows * n_pos, d), along.permute(2, 0, 1).reshape(n, -1, 1), value=-1
        )
        i += n
    if at_norm is not None:
        u = at_norm.float() * weight
        u = u - u.mean(-1, keepdim=True) - normed * (u * normed).mean(-1, keepdim=True)
        out[i] = (u / scale).reshape(rows * n_pos, d)
    return out.reshape(n_total, rows, n_pos, d).to(x.dtype)


def reader_gradients(
    model,
    tokens: Tensor,
    metric: TaskMetric,
    graph: EdgeGraph,
    *,
    embed_shift: Tensor | None = None,
    fixed: Sequence = (),
    weights: dict[str, Tensor] | None = None,
):
    """``d sum_rows metric / d (reader input)``, one forward and one backward pass of
    ``tokens``: yields ``(layer, [reader rows pos d_model])`` for each layer's readers in
    graph order (``layer`` None: the logits). ``embed_shift`` is added to the input embeddings,
    ``fixed`` raw hooks go first; ``weights``: ``W_Q``, ``W_K``, ``W_V`` if already read."""
    weights = weights or {kind: qkv_weights(model, kind)[0].detach() for kind in QKV}
    layer_names = _site_names(model, graph)
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
    order = [*(name for names in layer_names for name in names), _FINAL]
    hooks += [(name, site(name)) for name in order]
    if embed_shift is not None:
        hooks.insert(0, ("blocks.0.hook_resid_pre", lambda act, hook: act + embed_shift))
    logits = run_logits(model, tokens, before=[*fixed, *hooks], grad=True)
    found = torch.autograd.grad(
        metric(logits).sum(), [leaves[n] for n in order], allow_unused=True, materialize_grads=True
    )  # a reader nothing depends on (frozen patterns: q and k) has gradient zero
    grads = dict(zip(order, found, strict=True))
    del logits
    leaves.clear()
    shared = shared_norm(model)
    for layer, names in enumerate(layer_names):
        heads = [(grads.pop(n), weights[k][layer]) for n, k in zip(names[:3], QKV, strict=True)]
        at_norm = grads.pop(names[3]) if graph.mlps and shared else None
        found = _layer_gradients(model.blocks[layer].ln1, inputs.pop(layer), heads, at_norm)
        if graph.mlps and not shared:
            found = torch.cat([found, grads.pop(names[3]).unsqueeze(0)])
        yield layer, found.detach()
    yield None, grads.pop(_FINAL).unsqueeze(0)


def gradient_points(
    model,
    batch: TaskTokens,
    metric: TaskMetric,
    graph: EdgeGraph,
    embed_delta: Float[Tensor, "rows pos d_model"],
    *,
    steps: int,
    max_rows: int | None,
    max_bytes: int | str | None,
    held: int,
    fixed: Sequence = (),
    weights: dict[str, Tensor] | None = None,
):
    """The task's gradient points, as many per pass as ``max_rows`` / ``max_bytes`` (less
    ``held``) allow, each keeping every reader's gradient twice beside its pass (row-major: a
    row's ``max(1, steps)`` points together): yields ``(rows, local, gradients)``, ``rows`` the
    slice of task rows a pass covers, ``local`` each point's row in it, ``gradients``
    :func:`reader_gradients`' at the points (EAP-IG's point ``k`` of a row: ``k / steps`` of
    ``embed_delta`` added)."""
    n_steps = max(1, steps)
    n_rows, n_pos = (int(d) for d in batch.corrupted.shape)
    total = n_rows * n_steps
    kept = 2 * len(graph.readers) * n_pos * int(model.cfg.d_model) * _itemsize(model)
    chunk = backward_rows(
        model, n_pos, n_rows=total, max_bytes=max_bytes, max_rows=max_rows, held=held,
        kept_per_row=kept, what="one row's forward and backward pass with every reader's gradient",
    )  # fmt: skip
    tokens = batch.corrupted.to(model.cfg.device)
    for lo in range(0, total, chunk):
        task_rows = torch.arange(lo, min(lo + chunk, total)) // n_steps
        shift = None
        if steps:
            alphas = (torch.arange(lo, lo + len(task_rows)) % n_steps).to(embed_delta) / n_steps
            shift = embed_delta[task_rows.to(embed_delta.device)] * alphas.view(-1, 1, 1)
        gradients = reader_gradients(
            model, tokens[task_rows.to(tokens.device)], metric.select(task_rows), graph,
            embed_shift=shift, fixed=fixed, weights=weights,
        )  # fmt: skip
        first = int(task_rows[0])
        rows = slice(first, int(task_rows[-1]) + 1)
        yield rows, (task_rows - first).to(embed_delta.device), gradients


def step_sums(
    grad: Float[Tensor, "reader points pos d_model"], local: Tensor, n_rows: int
) -> Float[Tensor, "reader rows pos d_model"]:
    """``grad`` summed over each row's points (``local``: each point's row)."""
    zeros = torch.zeros((grad.shape[0], n_rows, *grad.shape[2:]), dtype=grad.dtype)
    return zeros.to(grad.device).index_add_(1, local, grad)


def _reader_groups(graph: EdgeGraph) -> tuple[dict, Tensor, Tensor]:
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
    for i, r in enumerate(graph.readers):
        groups.setdefault(r.layer, []).append(i)
    src = torch.tensor([writer_index[w] for w, _ in graph.edges])
    dst = torch.tensor([reader_index[r] for _, r in graph.edges])
    return groups, torch.tensor(n_sources), torch.stack([src, dst])


def gradient_scores(
    model,
    batch: TaskTokens,
    metric: TaskMetric,
    graph: EdgeGraph,
    deltas: WriterOutputs,
    *,
    steps: int = 0,
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
    held: int = 0,
    fixed: Sequence = (),
) -> Float[Tensor, " edge"]:
    """The estimated change of the metric's dataset mean from patching each edge (graph order);
    ``steps=0``: EAP, else EAP-IG with ``steps`` points, in :func:`gradient_points`' passes;
    the numbers do not depend on the split."""
    for name, _ in fixed:
        if re.fullmatch(r"blocks\.\d+\.ln1\..*", name):
            raise ValueError(
                f"an intervention at {name} is not seen by the q/k/v readers' gradients (ln1's "
                "backward is taken apart from the run); use method='exact' for it"
            )
    n_steps = max(1, steps)
    groups, n_sources, (src, dst) = _reader_groups(graph)
    table = torch.zeros(len(graph.writers), len(graph.readers), dtype=torch.float64)
    weights = {kind: qkv_weights(model, kind)[0].detach() for kind in QKV}
    points = gradient_points(
        model, batch, metric, graph, deltas.embed, steps=steps, max_rows=max_rows,
        max_bytes=max_bytes, held=held, fixed=fixed, weights=weights,
    )  # fmt: skip
    for rows, local, gradients in points:
        part = deltas.rows(rows.start, rows.stop)
        stacked = part.stacked().flatten(1)  # [writer rows*pos*d_model]
        for layer, grad in gradients:
            if n_steps > 1:
                grad = step_sums(grad, local, rows.stop - rows.start)
            readers = torch.tensor(groups[layer])
            n = int(n_sources[readers].max())
            block = stacked[:n] @ grad.flatten(1).T  # [writer reader]
            table[:n, readers] += block.double().cpu()
    return table[src, dst] / (len(batch.corrupted) * n_steps)
