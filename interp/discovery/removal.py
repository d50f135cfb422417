"""Runs of the clean prompts with sets of edges removed: what circuit evaluation is built on.

A removed edge ``W->R`` gives ``R`` the writer's *ablated* output (its corrupted output, a
mean, or zero) in place of the output ``W`` has in this run, in ``R``'s input only
(:mod:`interp.discovery.inputs`); everything else is recomputed. So ``R``'s input moves by
``ablated(W) - live(W)``, where ``live(W)`` is ``W``'s output in the run itself, which differs
from the unpatched clean output wherever an edge upstream of ``W`` was removed. With every edge
removed and ``ablated`` the corrupted outputs, every reader reads the corrupted stream: the run
is the corrupted run. (Edge patching of single edges, :func:`interp.discovery.runs.
patched_metrics`, may use the unpatched outputs: a single edge's writer is upstream of it.)
The changes are built during the pass, group of writers by group (:func:`_pass_hooks`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import torch
from jaxtyping import Float
from torch import Tensor

from interp.discovery.graph import EdgeGraph, Reader
from interp.discovery.inputs import reader_hooks
from interp.discovery.runs import WriterOutputs, row_metric
from interp.engine import run_patched
from interp.engine.estimates import _itemsize
from interp.models.norms import POST_NORMS, effective_weight, post_norm
from interp.tasks import TaskMetric, TaskTokens

__all__ = ["removed_metrics"]


def _groups(graph: EdgeGraph) -> list[tuple[str, str, int | None, list[str]]]:
    """Writer groups in forward order: ``(capture hook, kind, layer, writers)``."""
    groups = [("blocks.0.hook_resid_pre", "embed", None, ["embed"])]
    for layer in range(graph.n_layers):
        heads, mlps = graph.layer_writers(layer)
        groups.append((f"blocks.{layer}.attn.hook_z", "heads", layer, heads))
        if mlps:
            groups.append((f"blocks.{layer}.hook_mlp_out", "mlp", layer, mlps))
    return groups


def _fill_after(graph: EdgeGraph, groups) -> list[list[Reader]]:
    """For each writer group, the readers whose last writer is in it."""
    done_at: dict[str, int] = {w: g for g, (_, _, _, ws) in enumerate(groups) for w in ws}
    last: dict[Reader, int] = {}
    for writer, reader in graph.edges:
        last[reader] = max(last.get(reader, 0), done_at[writer])
    fill: list[list[Reader]] = [[] for _ in groups]
    for reader in graph.readers:  # readers with no writer before them have no edges
        if reader in last:
            fill[last[reader]].append(reader)
    return fill


def removed_metrics(
    model,
    batch: TaskTokens,
    metric: TaskMetric,
    ablated: WriterOutputs,
    runs: Sequence[Sequence[tuple[str, Reader]]],
    graph: EdgeGraph,
    *,
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
    held: int = 0,
    progress: bool = False,
) -> Float[Tensor, "runs rows"]:
    """The metric of every task row of the clean run with each run's edges removed (module
    docstring); ``ablated``: each writer's replacement output over the task rows (tensors may
    be broadcast views). Runs share the passes of :func:`interp.engine.run_patched`, each a
    block of rows, as many as ``max_rows`` / ``max_bytes`` allow; the numbers do not depend on
    the split."""
    n_pos = int(batch.clean.shape[1])
    groups = _groups(graph)
    fill = _fill_after(graph, groups)
    widest = max(len(f) for f in fill)
    kept = (len(graph.writers) + 2 * widest) * n_pos * int(model.cfg.d_model) * _itemsize(model)
    masks = _masks(runs, groups, fill, len(graph.writers))
    checked = []  # whether the first pass has checked the q/k/v inputs

    def hooks(members: list[int], rows: slice) -> list:
        chosen = torch.tensor(members)
        check, checked[:] = not checked, [True]
        return _pass_hooks(
            model, ablated.rows(rows.start, rows.stop),
            [None if mask is None else mask[chosen] for mask in masks], groups, fill,
            n_runs=len(members), n=rows.stop - rows.start, check=check,
        )  # fmt: skip

    return run_patched(
        model, batch.clean, list(runs), row_metric=row_metric(metric), max_rows=max_rows,
        max_bytes=max_bytes, held=held, held_what="the writers' ablated outputs",
        progress=progress, pass_hooks=hooks, kept_per_row=kept,
    )  # fmt: skip


def _masks(runs, groups, fill, n_writers: int) -> list[Tensor | None]:
    """For each writer group, the mask of the readers filled after it ``[runs writers
    readers]`` (writers in graph order, up to that group): 1 where the run removes the edge."""
    index = {w: i for i, w in enumerate(w for _, _, _, ws in groups for w in ws)}
    slot = {r: (g, j) for g, readers in enumerate(fill) for j, r in enumerate(readers)}
    masks = [torch.zeros(len(runs), n_writers, len(f)) if f else None for f in fill]
    where: list[list[tuple[int, int, int]]] = [[] for _ in fill]  # (run, writer, slot) ones
    for p, edges in enumerate(runs):
        for writer, reader in edges:
            g, j = slot[reader]
            where[g].append((p, index[writer], j))
    for mask, ones in zip(masks, where, strict=True):
        if ones:  # one indexed assignment, not one per edge
            mask[tuple(torch.tensor(ones).T)] = 1.0
    return masks


def _pass_hooks(model, ablated, masks, groups, fill, *, n_runs: int, n: int, check: bool) -> list:
    """The hooks of one pass of ``n`` task rows repeated once per run, each run a block of rows.

    Every writer's ``ablated - live`` output goes into ``diffs`` ``[runs n pos d_model
    writers]`` as its group fires; after a group, the readers filled there get one batched
    matrix product of ``diffs`` (the writers so far) with their masks, into the slots of
    ``buffer``, which the reader hooks read when the reader comes (slots are reused: a
    group's readers have read theirs before the next group fills)."""
    n_pos, d_model = int(ablated.embed.shape[1]), int(model.cfg.d_model)
    device, dtype = model.cfg.device, ablated.embed.dtype
    starts = [0, *accumulate(len(writers) for _, _, _, writers in groups)]
    n_writers, widest = starts[-1], max(len(f) for f in fill)
    buffer = torch.zeros(n_runs * n, n_pos, d_model, widest, device=device, dtype=dtype)
    diffs = torch.zeros(n_runs, n, n_pos, d_model, n_writers, device=device, dtype=dtype)
    additions = []
    for mask, readers in zip(masks, fill, strict=True):  # no readers: no mask
        for j, reader in enumerate(readers):
            for p in torch.nonzero(mask[:, :, j].any(dim=1)).flatten().tolist():
                rows = slice(p * n, (p + 1) * n)
                additions.append((reader, rows, buffer[rows, :, :, j]))
    masks = [None if m is None else m.to(device=device, dtype=dtype) for m in masks]
    W_O = model.W_O
    # post-norms (Gemma 2): a head's live output is z W_O through the norm with this run's scale,
    # as in interp.discovery.runs.writer_outputs; z waits for the scale, which fires later
    weights = {
        layer: effective_weight(norm, d_model).to(device=device, dtype=dtype)
        for layer in range(len(W_O))
        if (norm := post_norm(model, layer, "attn")) is not None
    }
    waiting: dict[int, Tensor] = {}

    def capture(g: int, scale: bool = False):
        _, kind, layer, _ = groups[g]

        def hook(act: Tensor, hook) -> None:
            if kind == "heads":
                if layer in weights and not scale:  # hook_z: wait for the scale
                    waiting[layer] = act
                    return
                z = waiting.pop(layer) if layer in weights else act
                live = torch.einsum("bphd,hdm->bpmh", z, W_O[layer].to(z.dtype))
                if layer in weights:  # act is the post-norm's scale [batch pos 1]
                    live = live / act[..., None] * weights[layer][:, None]
                gone = ablated.heads[layer].transpose(-1, -2)
            else:
                live = act[..., None]
                gone = (ablated.embed if kind == "embed" else ablated.mlps[layer])[..., None]
            live = live.reshape(n_runs, n, *live.shape[1:])
            diffs[..., starts[g] : starts[g + 1]] = gone.to(dtype)[None] - live
            if masks[g] is not None:
                deliver(g)

        return hook

    def deliver(g: int) -> None:
        known, width = starts[g + 1], len(fill[g])
        seen = diffs[..., :known].reshape(n_runs, n * n_pos * d_model, known)
        out = torch.bmm(seen, masks[g][:, :known])  # [runs (n pos d_model) readers]
        buffer[..., :width] = out.reshape(n_runs * n, n_pos, d_model, width)

    hooks = [(name, capture(g)) for g, (name, _, _, _) in enumerate(groups)]
    hooks += [
        (f"blocks.{g_layer}.{POST_NORMS['attn']}.hook_scale", capture(g, scale=True))
        for g, (_, kind, g_layer, _) in enumerate(groups)
        if kind == "heads" and g_layer in weights
    ]
    return hooks + reader_hooks(model, additions, check=check)
