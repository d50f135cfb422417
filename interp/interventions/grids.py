"""Patching grids: the sites a grid name stands for, the result table's columns, ``recovered``.

Shared by :func:`interp.interventions.patch_activations` (one prompt pair or a task) and the
task's shards (:mod:`interp.interventions.shards`), so that all return one table shape.

``recovered = (metric - corrupted_metric) / (clean_metric - corrupted_metric)``: 0 is the
corrupted run's value, 1 the clean run's. When the two are numerically equal it is undefined:
NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
from torch import Tensor

from interp.engine import Site

__all__ = [
    "GRIDS",
    "COLUMNS",
    "DIRECTIONS",
    "METHODS",
    "EQUAL_RTOL",
    "grid_sites",
    "recovered",
    "undefined",
    "site_frame",
]

COLUMNS = ["site", "layer", "head", "pos", "method", "metric", "recovered"]  # result table
DIRECTIONS = ("denoising", "noising")  # base run corrupted (denoising) or clean (noising)
METHODS = ("exact", "attribution", "both")  # forward passes, a gradient estimate, or both
# grid name -> (site kind, per head, per position)
GRIDS = {
    "resid_pre": ("resid_pre", False, True),
    "resid_mid": ("resid_mid", False, True),
    "resid_post": ("resid_post", False, True),
    "attn_out": ("attn_out", False, True),
    "mlp_out": ("mlp_out", False, True),
    "heads": ("head", True, False),
    "heads_pos": ("head", True, True),
    "q": ("q", True, False),
    "k": ("k", True, False),
    "v": ("v", True, False),
    "pattern": ("pattern", True, False),
    "q_pos": ("q", True, True),
    "k_pos": ("k", True, True),
    "v_pos": ("v", True, True),
    "pattern_pos": ("pattern", True, True),  # per query (destination) position
}
# float32 metrics closer than this (relative) are "numerically equal": recovered is undefined
EQUAL_RTOL = 1e-6


def grid_sites(
    model, grids: Sequence[str], n_pos: int, *, layers: Sequence[int] | None = None
) -> list[Site]:
    """Every site of the named grids (``GRIDS``), layer-major.

    Key and value grids have one site per key/value head: with grouped-query attention
    (``n_key_value_heads < n_heads``) that is the shared head a group of query heads reads.
    """
    unknown = [g for g in grids if g not in GRIDS]
    if unknown:
        raise ValueError(f"unknown sites {unknown}; choose from {', '.join(GRIDS)}")
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    n_kv_heads = int(getattr(model.cfg, "n_key_value_heads", None) or n_heads)
    chosen = range(n_layers) if layers is None else [int(layer) for layer in layers]
    hook_names = set(model.hook_dict)
    heads = {"k": n_kv_heads, "v": n_kv_heads}
    heads = {kind: heads.get(kind, n_heads) for kind, _, _ in GRIDS.values()}
    sites = []
    for grid in grids:
        kind, per_head, per_pos = GRIDS[grid]
        for layer in chosen:
            Site(kind, layer, head=0 if per_head else None).check(model, hook_names)
            sites += [
                Site(kind, layer, head=head, pos=pos)
                for head in (range(heads[kind]) if per_head else [None])
                for pos in (range(n_pos) if per_pos else [None])
            ]
    return sites


def undefined(clean: float, corrupted: float) -> bool:
    """Whether ``recovered`` is undefined: the two metrics are numerically equal (or one is
    NaN). The rule of every recovered share (patching, path patching, circuit discovery)."""
    return not abs(clean - corrupted) > EQUAL_RTOL * max(1.0, abs(clean), abs(corrupted))


def recovered(values: Tensor, clean: float, corrupted: float) -> tuple[list[float], bool]:
    """``(recovered per value, undefined)``; all NaN when undefined."""
    if undefined(clean, corrupted):
        return [math.nan] * len(values), True
    return ((values - corrupted) / (clean - corrupted)).tolist(), False


def site_frame(sites: Sequence[Site], method: str, values: Tensor) -> pd.DataFrame:
    """The columns ``site, layer, head, pos, method, metric`` of one value per site."""
    return pd.DataFrame(
        {
            "site": [s.kind for s in sites],
            "layer": [s.layer for s in sites],
            "head": pd.array([s.head for s in sites], dtype="Int64"),
            "pos": pd.array([s.pos for s in sites], dtype="Int64"),
            "method": method,
            "metric": values.double().numpy(),
        }
    )
