"""Per-position grids over a task by named position: ``IO``, ``S1``, ``S2``, ``END``, ...

Over rows of different lengths, position ``p`` is a different token in each row, so a
per-position grid (``resid_pre``, ``heads_pos``, ...) is reported by label instead: rows carry
``positions`` (label -> index, :class:`interp.tasks.TaskRow`), and the cell ``(site, label)``
patches, in row ``i``, the position ``positions[label][i]`` alone.

The patch is made at every position with a source that is the base run's own activation
everywhere except at row ``i``'s labelled position, where it is the source run's. A patch at a
hook of layer ``L`` changes nothing before that hook, so the base activation there is what the
patched run holds anyway: the cell equals patching that one position of each row (to float
rounding; tests/interventions/test_patching_named_positions.py checks it against each row alone).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch
from torch import Tensor

from interp.engine import SITE_KINDS, Intervention, Site
from interp.interventions.grids import GRIDS, grid_sites
from interp.tasks import TaskTokens

__all__ = ["named_labels", "named_runs", "label_column"]


def named_labels(batch: TaskTokens) -> list[str]:
    """The labels every row has, refused in one line when there are none."""
    if not batch.positions:
        raise ValueError(
            "positions='named' reports per-position grids by label, but the task's rows carry "
            "no positions; add a 'positions' column (label -> token index, e.g. "
            '{"IO": 1, "S2": 9, "END": -1}) to every row'
        )
    missing = {k: (v < 0).nonzero().flatten() for k, v in batch.positions.items()}
    labels = [k for k, rows in missing.items() if len(rows) == 0]
    if not labels:
        raise ValueError(
            "no position label is on every row of the task (labels "
            f"{', '.join(batch.positions)}); give every row the same labels"
        )
    return labels


def _with_one_position(
    base: Tensor, source: Tensor, index: Tensor, site: Site, pos_axis: int
) -> Tensor:
    """``base`` with row ``i``'s position ``index[i]`` (of ``site``'s head, if any) taken from
    ``source``: a patch source that changes that one position per row."""
    out = base.clone()
    rows = torch.arange(base.shape[0], device=base.device)
    index = index.to(base.device)
    if pos_axis == 1:
        if site.head is None:
            out[rows, index] = source[rows, index]
        else:
            out[rows, index, site.head] = source[rows, index, site.head]
    else:  # the pattern's query position: [batch head q_pos k_pos]
        out[rows, site.head, index] = source[rows, site.head, index]
    return out


def named_runs(
    model,
    batch: TaskTokens,
    grids: Sequence[str],
    labels: Sequence[str],
    source,
    base,
    layers,
) -> tuple[list[Site], list[str | None], list[list[Intervention]]]:
    """``(sites, labels, runs)``: one patched run per cell, the per-position grids by label
    (``source`` and ``base`` are cached runs holding every patched hook)."""
    n_pos = int(batch.clean.shape[1])
    sites, names, runs = [], [], []
    for grid in grids:
        kind, per_head, per_pos = GRIDS[grid]
        if not per_pos:
            for site in grid_sites(model, [grid], n_pos, layers=layers):
                sites.append(site)
                names.append(None)
                runs.append([Intervention(site, "patch", source=source[site.hook_name])])
            continue
        whole = [s for s in grid_sites(model, [grid], n_pos, layers=layers) if s.pos == 0]
        pos_axis = SITE_KINDS[kind].pos_axis
        for site in whole:
            cell = Site(site.kind, site.layer, head=site.head)
            for label in labels:
                value = _with_one_position(
                    base[cell.hook_name],
                    source[cell.hook_name],
                    batch.positions[label],
                    cell,
                    pos_axis,
                )
                sites.append(cell)
                names.append(label)
                runs.append([Intervention(cell, "patch", source=value)])
    return sites, names, runs


def label_column(frame: pd.DataFrame, labels: Sequence[str | None], repeat: int = 1) -> None:
    """Put the labels in ``frame["pos"]`` (text; missing for cells over all positions), each
    repeated ``repeat`` times (per-row tables)."""
    frame["pos"] = pd.array([x for x in labels for _ in range(repeat)], dtype="string")
