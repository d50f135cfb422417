"""Writers' outputs and batched runs with sets of edges patched: what ``exact`` scoring is
built on, and the start every discovery method shares (:func:`task_inputs`).

A *run* is a set of edges ``(writer, reader)``. It is the corrupted run of every task row with
each edge's reader given ``clean - corrupted`` of the writer's output (the two unpatched runs'
values) at its input only (:mod:`interp.discovery.inputs`); everything else is recomputed. A
run of every edge out of one writer is therefore that writer's output patched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.discovery.graph import EdgeGraph, Reader
from interp.discovery.inputs import reader_hooks
from interp.engine import check_eval, run_cached, run_patched
from interp.engine.estimates import _itemsize
from interp.interventions.inputs import task_row_metric as row_metric
from interp.models.norms import POST_NORMS, effective_weight, is_rms, param, post_norm
from interp.tasks import Task, TaskMetric, TaskTokens

__all__ = [
    "WriterOutputs",
    "writer_outputs",
    "patched_metrics",
    "deltas_bytes",
    "row_metric",
    "dataset_mean",
    "task_inputs",
]

METRICS = ("logit_diff", "prob_diff")  # the task metrics discovery reads
POST_NORM_RTOL = 1e-4  # float32: the heads' post-normed outputs against the model's attn output


def dataset_mean(metric: TaskMetric, logits: Tensor) -> float:
    """The metric's mean over the task's rows, summed in float64."""
    return float(metric(logits).double().mean())


@dataclass(frozen=True)
class WriterOutputs:
    """Every writer's output over the rows of one run: ``embed`` ``[rows pos d_model]``, the
    heads ``[layer] -> [rows pos head d_model]`` (``z @ W_O``, no bias), the MLPs by layer."""

    embed: Tensor
    heads: tuple[Tensor, ...]
    mlps: tuple[Tensor, ...]

    def __getitem__(self, writer: str) -> Float[Tensor, "rows pos d_model"]:
        """A writer's output by its graph name: ``embed``, ``L{l}H{h}`` or ``MLP{l}``."""
        if writer == "embed":
            return self.embed
        if writer.startswith("MLP"):
            return self.mlps[int(writer[3:])]
        layer, head = writer[1:].split("H")
        return self.heads[int(layer)][:, :, int(head)]

    def map(self, fn, *others: WriterOutputs) -> WriterOutputs:
        """``fn`` of each tensor and the tensors in the same place of ``others``."""
        return WriterOutputs(
            fn(self.embed, *(o.embed for o in others)),
            tuple(map(fn, self.heads, *(o.heads for o in others))),
            tuple(map(fn, self.mlps, *(o.mlps for o in others))),
        )

    def __sub__(self, other: WriterOutputs) -> WriterOutputs:
        return self.map(torch.sub, other)

    def rows(self, lo: int, hi: int) -> WriterOutputs:
        return self.map(lambda t: t[lo:hi])

    def stacked(self) -> Float[Tensor, "writer rows pos d_model"]:
        """Every writer's output in graph order: ``embed``, then each layer's heads and MLP."""
        blocks = [self.embed.unsqueeze(0)]
        for layer, heads in enumerate(self.heads):
            blocks.append(heads.permute(2, 0, 1, 3))
            blocks += [self.mlps[layer].unsqueeze(0)] if self.mlps else []
        return torch.cat(blocks)


def writer_outputs(
    model, tokens: Int[Tensor, "rows pos"], graph: EdgeGraph, interventions: Sequence = ()
) -> tuple[WriterOutputs, Tensor]:
    """One run of ``tokens``: every writer's output, and the logits.

    A writer's output is what it adds to the residual stream. Under a post-norm (Gemma 2) a
    head's output is its ``z W_O`` through the norm with the run's scale frozen, ``w * z W_O /
    s``: the heads of a layer add up to the normed attention output exactly (checked each run),
    and the MLP's ``hook_mlp_out`` is already after its post-norm.
    """
    post = [post_norm(model, lay, "attn") for lay in range(graph.n_layers)]
    mlp_names = (
        [f"blocks.{lay}.hook_mlp_out" for lay in range(graph.n_layers)] if graph.mlps else []
    )
    post_names = [
        name
        for lay, norm in enumerate(post)
        if norm is not None
        for name in (f"blocks.{lay}.{POST_NORMS['attn']}.hook_scale", f"blocks.{lay}.hook_attn_out")
    ]
    run = run_cached(
        model,
        tokens,
        head_outputs=True,
        hooks=["blocks.0.hook_resid_pre", *mlp_names, *post_names],
        interventions=interventions,
    )
    heads = tuple(
        _post_normed(model, run, lay, norm, run[f"blocks.{lay}.attn.hook_result"])
        for lay, norm in enumerate(post)
    )
    mlps = tuple(run[name] for name in mlp_names)
    return WriterOutputs(run["blocks.0.hook_resid_pre"], heads, mlps), run.logits


def _post_normed(
    model, run, layer: int, norm, heads: Float[Tensor, "rows pos head d_model"]
) -> Float[Tensor, "rows pos head d_model"]:
    """``heads`` as they reach the residual stream through ``norm`` (None: as they are)."""
    if norm is None:
        return heads
    b_O = param(model, "b_O")
    if not is_rms(norm) or (b_O is not None and bool(b_O[layer].abs().max() > 0)):
        raise ValueError(
            f"layer {layer} normalises its attention output with a LayerNorm or after a bias, "
            "which splits into no per-head writers; edge discovery takes RMSNorm post-norms "
            "without attention biases (Gemma 2)"
        )
    scale = run[f"blocks.{layer}.{POST_NORMS['attn']}.hook_scale"]  # [rows pos 1]
    weight = effective_weight(norm, heads.shape[-1]).to(heads)
    normed = heads / scale[:, :, None] * weight
    total, expected = normed.sum(2), run[f"blocks.{layer}.hook_attn_out"]
    gap = float((total - expected).abs().max())
    if gap > POST_NORM_RTOL * max(1.0, float(expected.abs().max())):
        raise RuntimeError(
            f"blocks.{layer}: the heads' post-normed outputs do not add up to hook_attn_out "
            f"(off by {gap:.2e}); edge discovery cannot split this model's attention by head"
        )
    return normed


def deltas_bytes(model, graph: EdgeGraph, batch: TaskTokens) -> int:
    """Bytes of every writer's clean-minus-corrupted output over the task."""
    n_rows, n_pos = (int(d) for d in batch.clean.shape)
    return len(graph.writers) * n_rows * n_pos * int(model.cfg.d_model) * _itemsize(model)


def task_inputs(
    model,
    task: Task | TaskTokens,
    metric: str,
    max_rows,
    max_bytes,
    *,
    method: str | None = None,
    methods: Sequence[str] = (),
    ig_steps=None,
) -> tuple[EdgeGraph, TaskTokens, TaskMetric]:
    """The model's graph, the task's token rows and its metric: where every method starts,
    after the checks every discovery entry point makes before any pass, each a one-line
    ValueError: the model in eval mode, ``method`` among ``methods``, ``metric`` among
    :data:`METRICS`, ``ig_steps`` a whole number >= 1 for eap-ig, and not both ``max_rows`` and
    ``max_bytes``."""
    check_eval(model)
    if method is not None and method not in methods:
        raise ValueError(f"method must be one of {', '.join(methods)}, got {method!r}")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if method == "eap-ig" and (not isinstance(ig_steps, int) or ig_steps < 1):
        raise ValueError(f"ig_steps must be a whole number >= 1, got {ig_steps!r}")
    if max_rows is not None and max_bytes is not None:
        raise ValueError("pass max_rows or max_bytes (rows per pass are planned from it), not both")
    batch = task.tokens(model) if isinstance(task, Task) else task
    return EdgeGraph.from_model(model), batch, batch.metric(metric)


def patched_metrics(
    model,
    batch: TaskTokens,
    metric: TaskMetric,
    deltas: WriterOutputs,
    runs: Sequence[Sequence[tuple[str, Reader]]],
    *,
    max_rows: int | None = None,
    max_bytes: int | str | None = None,
    held: int = 0,
    progress: bool = False,
    fixed: Sequence = (),
) -> Float[Tensor, "runs rows"]:
    """The metric of every task row under each run (a set of edges patched), in the batched
    passes of :func:`interp.engine.run_patched`: as many runs per pass as ``max_rows`` /
    ``max_bytes`` allow (rows split when not even one run of every row fits). The numbers do
    not depend on the split. ``fixed``: raw hooks applied to every pass, before the edges' own."""
    checked = []  # whether the first pass has checked the q/k/v inputs

    def hooks(members: list[int], rows: slice) -> list:
        part, n = deltas.rows(rows.start, rows.stop), rows.stop - rows.start
        additions = []
        for block, p in enumerate(members):
            into: dict[Reader, Tensor] = {}
            for writer, reader in runs[p]:
                into[reader] = into.get(reader, 0) + part[writer]
            block_rows = slice(block * n, (block + 1) * n)
            additions += [(reader, block_rows, delta) for reader, delta in into.items()]
        check, checked[:] = not checked, [True]
        return reader_hooks(model, additions, check=check)

    return run_patched(
        model, batch.corrupted, list(runs),
        row_metric=row_metric(metric), fixed=fixed, max_rows=max_rows, max_bytes=max_bytes,
        held=held, held_what="the writers' clean-minus-corrupted outputs", progress=progress,
        pass_hooks=hooks,
    )  # fmt: skip
