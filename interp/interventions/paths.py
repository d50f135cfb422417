"""Path patching: move a sender's effect along chosen paths only (Wang et al. 2022, IOI).

Three runs, as in the IOI paper and pyvene's replication (docs/path_patching.md):

1. Run the clean and the corrupted input; cache every head's ``z``, every ``mlp_out`` and the
   inputs of the norms the receivers read.
2. Run the *base* input (corrupted when denoising, clean when noising) with the sender's
   output taken from the *source* run and every other head's output frozen to its base value.
   MLPs are recomputed (``mlps="recompute"``, the IOI paper's choice: an MLP on the way is part
   of the path) or frozen (``mlps="freeze"``: only the direct edge moves, and MLPs can be
   receivers themselves). Record what each receiver reads from the residual stream.
3. Run the base input again, nothing frozen, giving each receiver the change recorded in
   step 2 and nothing else; measure the metric on the logits.

A receiver gets its input *change* (step-2 value minus base value) added to what it reads in
step 3, so receivers in several layers compose: a receiver's own change flows on to later
receivers. When nothing upstream of the receivers changed in step 3 (receivers in one layer,
the IOI paper's usage) this is exactly "patch the recorded input". A head's q/k/v input is
reached through its own ``hook_q/k/v`` (before rotary): ``ln1(x + change) W + b`` for that head
alone, checked against the model's own activation in every run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from interp.engine import (
    MemoryBudgetError,
    estimate_cache_bytes,
    format_size,
    parse_size,
    rows_per_pass,
)
from interp.engine.estimates import _itemsize
from interp.interventions.inputs import Rows, analysis_rows
from interp.interventions.patching import COLUMNS, DIRECTIONS  # one result shape for both
from interp.interventions.path_nodes import (
    PathPatchResult,
    Receiver,
    Sender,
    _has_mlps,
    _reaches,
    as_receiver,
    as_sender,
    complete_receivers,
    path_table,
)
from interp.interventions.path_runs import (
    cache_runs,
    deliver_changes,
    layer_hooks,
    read_point,
    record_changes,
)

__all__ = [
    "Sender",
    "Receiver",
    "PathPatchResult",
    "path_patch",
    "path_patch_senders",
    "complete_receivers",
    "COLUMNS",
    "DIRECTIONS",
    "MLP_MODES",
]

MLP_MODES = ("recompute", "freeze")  # MLPs in step 2: part of the path, or held at base
Metric = Callable[[Float[Tensor, "batch pos d_vocab"]], Tensor]


def _validate(model, sender: Sender, receivers: Sequence[Receiver], mlps: str, check_order: bool):
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    for item in (sender, *receivers):
        if item.layer is not None and not 0 <= item.layer < n_layers:
            raise ValueError(f"{item} is out of range: the model has {n_layers} layers")
        if item.head is not None and not 0 <= item.head < n_heads:
            raise ValueError(f"{item} is out of range: the model has {n_heads} heads per layer")
        if item.kind == "mlp" and not _has_mlps(model):
            raise ValueError(f"{item}: this model has no MLPs (attention only)")
    if mlps == "recompute" and any(r.kind == "mlp" for r in receivers):
        raise ValueError(
            "with mlps='recompute' an MLP is part of every path through it, not a "
            "receiver; pass mlps='freeze' to use MLP receivers"
        )
    if check_order:
        bad = [str(r) for r in receivers if not _reaches(model, sender, r)]
        if bad:
            raise ValueError(
                f"sender {sender} (layer {sender.layer}) cannot reach receivers "
                f"{', '.join(bad)}: they read the residual stream before it writes. "
                "Pass receivers in later layers (or 'logits')"
            )


def _settings(direction: str, mlps: str, receivers) -> list[Receiver]:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if mlps not in MLP_MODES:
        raise ValueError(f"mlps must be one of {MLP_MODES}, got {mlps!r}")
    if isinstance(receivers, (str, Receiver)) or (
        isinstance(receivers, tuple) and receivers and receivers[0] in ("head", "mlp")
    ):
        receivers = [receivers]  # one receiver given bare
    receivers = list(dict.fromkeys(as_receiver(r) for r in receivers))
    if not receivers:
        raise ValueError("pass at least one receiver")
    return receivers


def _run(
    model,
    inputs: Rows,
    senders: list[Sender],
    receivers: list[Receiver],
    direction: str,
    mlps: str,
    check_order: bool,
    per_pass: int,
    progress: bool | None,
    per_row: bool = False,
):
    for s in senders:
        _validate(model, s, receivers, mlps, check_order)
    reads = sorted({read_point(model, r) for r in receivers})
    runs = {
        "clean": cache_runs(model, inputs.clean, reads),
        "corrupted": cache_runs(model, inputs.corrupted, reads),
    }
    rows = int(inputs.clean.shape[0])
    clean_m, corrupt_m = (inputs.pooled(runs[k].logits) for k in runs)
    base, source = (
        (runs["corrupted"], runs["clean"])
        if direction == "denoising"
        else (runs["clean"], runs["corrupted"])
    )
    chunks = [senders[i : i + per_pass] for i in range(0, len(senders), per_pass)]
    show = len(chunks) > 4 if progress is None else progress
    values = []
    for chunk in tqdm(chunks, desc="path patching", disable=not show):
        changes = record_changes(model, base, source, chunk, reads, mlps)
        logits = deliver_changes(model, base.tokens.repeat(len(chunk), 1), receivers, changes)
        values += [inputs.pooled(block) for block in logits.split(rows)]
    table = path_table(
        senders,
        receivers,
        torch.stack(values).double(),
        clean_m.double(),
        corrupt_m.double(),
        task=inputs.task,
        per_row=per_row,
    )
    return PathPatchResult(
        table=table,
        clean_metric=float(clean_m.mean()),
        corrupted_metric=float(corrupt_m.mean()),
        direction=direction,
        mlps=mlps,
        n_rows=rows if inputs.task else 1,
        clean_metric_rows=tuple(clean_m.tolist()) if inputs.task else (),
        corrupted_metric_rows=tuple(corrupt_m.tolist()) if inputs.task else (),
    )


def path_patch(
    model,
    clean,
    corrupted=None,
    *,
    sender,
    receivers,
    metric: Metric | str | None = None,
    direction: str = "denoising",
    mlps: str = "recompute",
    check_order: bool = True,
    per_row: bool = False,
) -> PathPatchResult:
    """Patch ``sender`` only along its paths into ``receivers`` (all at once); one result row.

    ``path_patch(model, clean, corrupted, sender=..., receivers=..., metric=...)`` patches a
    prompt pair; ``path_patch(model, task, sender=..., receivers=..., metric="logit_diff")``
    every row of an :class:`interp.Task`, each read with its own answer and wrong, reporting
    dataset means and ``recovered_sem`` (:func:`interp.interventions.path_nodes.path_table`).

    Args:
        sender: ``(layer, head)``, ``("head", layer, head)``, ``("mlp", layer)`` or a ``Sender``.
        receivers: one or several of ``("head", layer, head, "q"|"k"|"v")``, ``("mlp", layer)``
            (with ``mlps="freeze"``) and ``"logits"`` (the final residual stream, read through
            ``ln_final`` with its scale recomputed).
        metric: for a pair, ``logits [batch pos d_vocab] -> Tensor [batch]`` (averaged) or a
            scalar (built-ins may name tokens by text); for a task, ``"logit_diff"`` (the
            default) or ``"prob_diff"``.
        direction: ``"denoising"`` (clean sender into the corrupted run) or ``"noising"``.
        mlps: ``"recompute"`` (IOI paper: paths may pass through MLPs) or ``"freeze"`` (the
            direct edge only).
        check_order: refuse receivers the sender cannot reach (False runs them; they then
            change nothing, which the tests prove).
        per_row: over a task only: one table row per task row (column ``row``).
    """
    receivers = _settings(direction, mlps, receivers)
    inputs = analysis_rows(
        model, clean, corrupted, metric, call="path_patch", per_row=per_row, prompt_rows=True
    )
    return _run(
        model,
        inputs,
        [as_sender(sender)],
        receivers,
        direction,
        mlps,
        check_order,
        1,
        False,
        per_row,
    )


def path_patch_senders(
    model,
    clean,
    corrupted=None,
    *,
    receivers,
    metric: Metric | str | None = None,
    senders: Sequence | None = None,
    direction: str = "denoising",
    mlps: str = "recompute",
    senders_per_pass: int | None = None,
    max_bytes: int | str | None = None,
    progress: bool | None = None,
    per_row: bool = False,
) -> PathPatchResult:
    """Path-patch every sender (default: every head) into the same receivers; one row each.

    Takes a prompt pair or a task as :func:`path_patch` does. A receiver a sender cannot reach
    gets no change from it (exactly; so the heads at or after the receivers' layers show the
    base run's metric). ``senders_per_pass`` senders share one batched forward pass per step; a
    progress bar shows when there are more than four passes (``progress`` forces it on or
    off). ``result.grid()`` is the layer x head table. ``senders_per_pass`` defaults to 8; or
    pass ``max_bytes`` (bytes or text such as ``"500MB"``, not with ``senders_per_pass``) for
    as many senders per pass as fit: the clean and corrupted caches are held throughout, each
    sender adds its recorded changes and one forward pass per prompt (or task) row. Raises
    :class:`interp.engine.MemoryBudgetError` when not even one sender fits.
    """
    receivers = _settings(direction, mlps, receivers)
    inputs = analysis_rows(
        model, clean, corrupted, metric, call="path_patch", per_row=per_row, prompt_rows=True
    )
    if senders is None:
        senders = [
            (lay, hd)
            for lay in range(int(model.cfg.n_layers))
            for hd in range(int(model.cfg.n_heads))
        ]
    senders = [as_sender(s) for s in senders]
    if senders_per_pass is not None and max_bytes is not None:
        raise ValueError(
            "pass senders_per_pass or max_bytes (a memory budget the senders per "
            "pass are planned from), not both"
        )
    if max_bytes is not None:
        senders_per_pass = _senders_fitting(model, inputs.clean, receivers, len(senders), max_bytes)
    senders_per_pass = 8 if senders_per_pass is None else senders_per_pass
    if not senders or senders_per_pass < 1:
        raise ValueError("pass at least one sender and senders_per_pass >= 1")
    return _run(
        model,
        inputs,
        senders,
        receivers,
        direction,
        mlps,
        False,
        senders_per_pass,
        progress,
        per_row,
    )


def _senders_fitting(
    model, tokens: Tensor, receivers: Sequence[Receiver], n_senders: int, max_bytes: int | str
) -> int:
    """Senders per pass under ``max_bytes``: the two caches are held, each sender takes one
    block of prompt rows per pass and keeps its changes at every read point."""
    rows, n_pos = tokens.shape
    z, mlp, _, _ = layer_hooks(model)
    reads = sorted({read_point(model, r) for r in receivers})
    held = 2 * estimate_cache_bytes(model, (rows, n_pos), hooks=[*z, *mlp.values(), *reads])
    changes = len(reads) * n_pos * int(model.cfg.d_model) * _itemsize(model)
    per_pass = rows_per_pass(
        model,
        int(n_pos),
        n_senders * int(rows),
        None,
        max_bytes,
        held,
        "path patching's clean and corrupted caches",
        kept_per_row=changes,
        what="one path-patched run",
        advice="raise max_bytes or use fewer or shorter prompts",
    )
    budget = parse_size(max_bytes)
    if per_pass < rows:
        raise MemoryBudgetError(
            f"one sender patches all {rows} prompt rows in one pass, but only "
            f"{per_pass} fit max_bytes={format_size(budget)}; raise max_bytes "
            f"to about {format_size(held + (budget - held) * rows / per_pass)}"
            " or use fewer prompts"
        )
    return per_pass // int(rows)
