"""Patching tables as TransformerLens's tensors: :func:`to_grid`.

:func:`interp.interventions.patch_activations` returns a tidy table, one row per cell. Code
written for ``transformer_lens.patching`` expects its tensors instead, indexed as
TransformerLens indexes them:

- ``[layer pos]``: ``resid_pre``, ``resid_mid``, ``resid_post``, ``attn_out``, ``mlp_out``
  (``get_act_patch_resid_pre``, ``..._resid_mid``, ``..._attn_out``, ``..._mlp_out``);
- ``[layer head]``: ``heads``, ``q``, ``k``, ``v``, ``pattern``
  (``get_act_patch_attn_head_out_all_pos``, ``..._q_all_pos``, ..., ``..._pattern_all_pos``);
- ``[layer pos head]``: ``heads_pos``, ``q_pos``, ``k_pos``, ``v_pos``
  (``get_act_patch_attn_head_out_by_pos``, ``..._q_by_pos``, ...);
- ``[layer head pos]``: ``pattern_pos`` (``get_act_patch_attn_head_pattern_by_pos``, whose
  axes TransformerLens orders head first; ``pos`` is the query position).

Entry ``[l, ...]`` is layer ``l``: a table patched over some ``layers=`` only has NaN in the
layers it skipped. A per-row table of a task (``per_row=True``) gains a leading ``row`` axis.
"""

from __future__ import annotations

import math

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from interp.interventions.grids import GRIDS

__all__ = ["to_grid", "GRID_AXES"]

# grid name -> TransformerLens's axes of its tensor
GRID_AXES = {
    name: (
        ("layer", "head", "pos")
        if name == "pattern_pos"  # TL indexes the pattern's by-position grid head first
        else ("layer", "pos", "head")
        if per_head and per_pos
        else ("layer", "head")
        if per_head
        else ("layer", "pos")
    )
    for name, (_, per_head, per_pos) in GRIDS.items()
}
_BY_SHAPE = {(kind, per_head, per_pos): name for name, (kind, per_head, per_pos) in GRIDS.items()}
_NEEDED = ("site", "layer", "head", "pos", "method")
_VALUES = ("metric", "recovered", "recovered_sem")


def _grid_names(frame: pd.DataFrame) -> pd.Series:
    """Each table row's grid name (``heads`` and ``heads_pos`` share the site ``head``)."""
    keys = zip(frame["site"], frame["head"].notna(), frame["pos"].notna(), strict=True)
    return pd.Series([_BY_SHAPE.get(key, "?") for key in keys], index=frame.index)


def _pick(frame: pd.DataFrame, grids: pd.Series, name: str, value, choices: list) -> pd.Series:
    """Which table rows to keep for ``name`` (``site`` or ``method``), refusing a choice the
    table needs but was not given, and one it does not have."""
    held = "grids" if name == "site" else "methods"
    if value is None and len(choices) > 1:
        raise ValueError(
            f"this table holds the {held} {', '.join(map(str, choices))} and to_grid makes one "
            f"tensor; pick one, e.g. to_grid(frame, {name}={choices[0]!r})"
        )
    if value is not None and value not in choices:
        raise ValueError(
            f"{name}={value!r} is not in this table; it holds the {held} "
            f"{', '.join(map(str, choices))}"
        )
    chosen = choices[0] if value is None else value
    column = grids if name == "site" else frame["method"]
    return column == chosen


def to_grid(
    frame: pd.DataFrame,
    column: str = "metric",
    *,
    site: str | None = None,
    method: str | None = None,
) -> Float[Tensor, "*axes"]:
    """One grid of a patching table as TransformerLens's tensor (module docstring: the axes).

    ``column`` is ``metric`` (what ``transformer_lens.patching`` returns: the patched metric),
    ``recovered`` or ``recovered_sem``. A table of several grids needs ``site=`` (a grid name:
    ``resid_pre``, ``heads``, ``heads_pos``, ...), one of both methods ``method=``. Returns
    float32, as TransformerLens's are; ``[row ...]`` first for a ``per_row=True`` table.
    """
    if not isinstance(frame, pd.DataFrame) or any(c not in frame.columns for c in _NEEDED):
        got = list(frame.columns) if isinstance(frame, pd.DataFrame) else type(frame).__name__
        raise ValueError(
            f"to_grid takes a patch_activations table (columns {', '.join(_NEEDED)}, ...), "
            f"got {got}"
        )
    if column not in _VALUES or column not in frame.columns:
        raise ValueError(
            f"column must be one of the table's {', '.join(c for c in _VALUES if c in frame)}, "
            f"got {column!r}"
        )
    if frame.empty:
        raise ValueError("to_grid got an empty table: patch at least one site")
    if site is not None and site not in GRIDS:
        raise ValueError(f"site must be a grid name ({', '.join(GRIDS)}), got {site!r}")
    grids = _grid_names(frame)
    keep = _pick(frame, grids, "site", site, list(dict.fromkeys(grids)))
    keep &= _pick(frame, grids, "method", method, list(dict.fromkeys(frame["method"])))
    cells, name = frame[keep], grids[keep].iloc[0]
    axes = (("row",) if "row" in frame.columns else ()) + GRID_AXES[name]
    index = [torch.tensor(cells[axis].to_numpy(dtype="int64")) for axis in axes]
    shape = [int(i.max()) + 1 for i in index]
    grid = torch.full(shape, math.nan, dtype=torch.float32)
    grid[tuple(index)] = torch.tensor(cells[column].to_numpy(dtype="float64")).float()
    return grid
