"""The one path of direct logit attribution: rows in, one checked table per row out.

A row is a prompt's tokens, its target (answer, or answer minus wrong) and the position
explained; every entry point of :mod:`interp.attribution.direct` is a door onto
:func:`attribute_rows`. The model is folded once; rows of one length and position share
forward passes, unpadded, as many as fit ``max_bytes`` (:func:`interp.engine.row_chunks`): one
cached run of the folded copy (the residual parts) and, unless the model came folded, one of the
model (the logits its rows must add up to). :func:`interp.attribution.core._attribute` builds
and checks each row's table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Int
from torch import Tensor

from interp.attribution.core import _attribute, _position, _Target
from interp.attribution.residual import final_hooks, final_logits, parts_hooks, residual_parts
from interp.engine import estimate_cache_bytes, row_chunks, run_cached
from interp.models.layernorm import fold_layernorm, is_folded

__all__ = ["Row", "attribute_rows"]


@dataclass(frozen=True)
class Row:
    """One prompt to attribute: checked tokens, the target, and the position (``-1``: last)."""

    tokens: Int[Tensor, "1 pos"]
    target: _Target
    pos: int = -1


def _bytes_per_row(model, folded, n_pos: int, neurons: bool) -> int:
    """What one row of a pass keeps: the folded run's cache, and the unfolded run's logits."""
    kept = estimate_cache_bytes(
        folded, (1, n_pos), head_outputs=True, hooks=parts_hooks(folded, neurons=neurons)
    )
    if folded is not model:
        kept += estimate_cache_bytes(model, (1, n_pos), hooks=final_hooks(model))
    return kept


def attribute_rows(
    model,
    rows: Sequence[Row],
    *,
    neurons: bool = False,
    max_bytes: int | str | None = None,
) -> list[pd.DataFrame]:
    """The attribution frame of every row, in order (module docstring).

    Args:
        model: as :func:`interp.logit_attribution`: unfolded (folded into a copy here, and its
            own logits are the reference) or already folded.
        rows: at least one :class:`Row`.
        neurons: split each MLP row into neurons.
        max_bytes: a budget for the forward passes (the folded copy is not counted); raises
            :class:`interp.engine.MemoryBudgetError` when not even one row fits.
    """
    if not rows:
        raise ValueError("pass at least one prompt")
    positions = [_position(row.pos, int(row.tokens.shape[1])) for row in rows]
    folded = model if is_folded(model) else fold_layernorm(model)
    groups: dict[tuple[int, int], list[int]] = {}  # (length, position) -> row indices
    for i, row in enumerate(rows):
        groups.setdefault((int(row.tokens.shape[1]), positions[i]), []).append(i)
    frames: dict[int, pd.DataFrame] = {}
    for (n_pos, position), members in groups.items():
        kept = 0 if max_bytes is None else _bytes_per_row(model, folded, n_pos, neurons)
        for chunk in row_chunks(
            folded, len(members), n_pos, max_bytes, kept_per_row=kept, what="logit attribution"
        ):
            chosen = members[chunk]
            batch = torch.cat([rows[i].tokens for i in chosen]).to(folded.cfg.device)
            run = run_cached(
                folded, batch, head_outputs=True, hooks=parts_hooks(folded, neurons=neurons)
            )  # [batch pos ...]
            reference = (
                None if folded is model else run_cached(model, batch, hooks=final_hooks(model))
            )
            for k, i in enumerate(chosen):
                parts = residual_parts(folded, None, position, neurons=neurons, run=run, row=k)
                logits = (
                    None
                    if reference is None
                    else final_logits(model, None, position, run=reference, row=k)[0]
                )
                frames[i] = _attribute(
                    model, folded, rows[i].tokens, rows[i].target, position, parts, logits, neurons
                )
            del run, reference
    return [frames[i] for i in range(len(rows))]
