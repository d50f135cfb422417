"""Patched runs of a task computed from their first patched position on, over a recorded prefix.

A model's attention is causal: a patch at position ``p`` changes no position before ``p``, at
any layer. A patched run whose interventions all act at positions ``>= s`` (a ``resid_pre``
grid cell at ``(L, p)``: ``s = p``) therefore equals the unpatched base run at positions
``< s``, and only positions ``s ...`` need computing; their attention reads the base run's keys
and values at the earlier positions (:func:`interp.engine.passes.forward_read` with a
``prefix``). One pass holds runs of one ``s`` that start at different layers: the pass enters
at position ``s``, and at each start layer ``L`` the base run's residual entering ``L``
(recorded once, :func:`base_states`) joins the batch as the blocks of rows of the runs starting
there (replacing the pass's own rows at the first), so no run recomputes the layers below its
start or the positions before ``s``. A ``resid_pre`` grid over ``n`` positions and ``N`` layers
then costs about ``N (N + 1) / 2 x n (n + 1) / 2`` layer-positions per row, against
``N (N + 1) / 2 x n x n`` for runs over every position (benchmarks/bench_patching.py).

Only ``patch`` and ``zero`` interventions at one position each qualify (noise draws depend on
the activation's shape), only with no ``fixed`` interventions, and only where
:func:`suffix_like_forward` finds, on one row, that the model gives the same logits this way;
every other run takes the dense passes of :func:`interp.engine.run_patched`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformers.cache_utils import DynamicCache

from interp.engine.hooks import compile_hooks
from interp.engine.passes import (
    STRUCTURE_ERRORS,
    HookFn,
    forward_read,
    prefix_cache,
    record_states,
    store_hook,
)
from interp.engine.sites import SITE_KINDS, Intervention, Site
from interp.foundation.fallbacks import warn_fallback

logger = logging.getLogger(__name__)

__all__ = ["run_offset", "base_states", "suffix_pass", "suffix_like_forward", "state_bytes"]

_SUFFIX_KINDS = ("patch", "zero")  # the same value whatever the activation's length


def _resid(layer: int) -> str:
    return f"blocks.{layer}.hook_resid_pre"


def run_offset(run: Sequence[Intervention], n_pos: int) -> int:
    """The first position ``run`` touches (0 where an intervention acts at every position or
    is not a patch or zero): positions before it are the base run's."""
    first = n_pos
    for item in run:
        if item.kind not in _SUFFIX_KINDS or item.site.pos is None:
            return 0
        first = min(first, int(item.site.pos) % n_pos)
    return 0 if first == n_pos else first


def state_bytes(model, n_rows: int, n_pos: int) -> int:
    """Bytes :func:`base_states` keeps: every layer's keys, values and entering residual."""
    n_layers, d_model = int(model.cfg.n_layers), int(model.cfg.d_model)
    size = torch.finfo(model.cfg.dtype).bits // 8 if hasattr(model.cfg, "dtype") else 4
    return 3 * n_layers * n_rows * n_pos * d_model * size


def base_states(
    model, tokens: Int[Tensor, "rows pos"]
) -> tuple[DynamicCache, dict[int, Float[Tensor, "rows pos d_model"]]]:
    """The base rows' keys and values at every layer, and the residual entering each layer."""
    store: dict[str, Tensor] = {}
    layers = range(int(model.cfg.n_layers))
    states = record_states(
        model, tokens, [(_resid(i), store_hook(store, _resid(i))) for i in layers]
    )
    return states, {i: store[_resid(i)] for i in layers}


def _shifted(item: Intervention, start: int) -> Intervention:
    """``item`` on the activations of positions ``start ...``: its position and source cut."""
    site = item.site
    spec = SITE_KINDS[site.kind]
    pos = int(site.pos)  # one counted from the end is the same position in the shorter one
    moved = Site(site.kind, site.layer, head=site.head, pos=pos - start if pos >= 0 else pos)
    if item.kind != "patch":
        return replace(item, site=moved)
    index = [slice(None)] * item.source.ndim
    index[spec.pos_axis] = slice(start, None)
    return replace(item, site=moved, source=item.source[tuple(index)])


def _growing_hooks(
    n_rows: int,
    starts: Sequence[int],
    runs: Sequence[list[tuple[str, HookFn]]],
    joining: dict[int, Tensor],
) -> list[tuple[str, HookFn]]:
    """Hooks giving run ``p`` (started at ``starts[p]``, ascending) its block of rows: at
    each start layer ``L``, ``joining[L]`` (the base rows' recorded residual there) joins once
    per run starting at ``L`` (at the first, it replaces the pass's own, so that a run starts
    from the same numbers however the runs are split into passes); then each run's hooks act
    on its block."""
    counts: dict[int, int] = {}
    for layer in starts:
        counts[layer] = counts.get(layer, 0) + 1
    first = starts[0]
    per_hook: dict[str, list[tuple[int, HookFn]]] = {_resid(layer): [] for layer in counts}
    for p, hooks in enumerate(runs):
        for name, fn in hooks:
            per_hook.setdefault(name, []).append((p, fn))
    grow = {_resid(layer): (layer, n) for layer, n in counts.items()}

    def make(name: str, items: list[tuple[int, HookFn]]) -> HookFn:
        def hook(act: Tensor, hook) -> Tensor:
            if name in grow:
                layer, n = grow[name]
                new = joining[layer].to(act.device, act.dtype).repeat(n, *([1] * (act.ndim - 1)))
                act = new if layer == first else torch.cat([act, new])
            for p, fn in items:
                fn(act[p * n_rows : (p + 1) * n_rows], hook)  # in place (see hooks._write)
            return act

        return hook

    return [(name, make(name, items)) for name, items in per_hook.items()]


def suffix_pass(
    model,
    tokens: Int[Tensor, "rows pos"],
    start: int,
    runs: Sequence[Sequence[Intervention]],
    states: tuple[DynamicCache, dict[int, Tensor]],
    read_at: Int[Tensor, " rows"],
    rows: slice,
) -> Float[Tensor, "batch d_vocab"]:
    """Logits of ``runs`` (each acting at positions ``>= start`` only, in order of their first
    layer; their patch sources cut to ``rows`` already) on ``tokens[rows]``, read at
    ``read_at`` (``>= start``), computed on positions ``start ...`` over the base ``states``;
    run-major blocks of rows."""
    layers = [min(item.site.layer for item in run) for run in runs]
    if layers != sorted(layers):
        raise ValueError("suffix_pass needs its runs in order of their first layer")
    cache, resid = states
    joining = {layer: resid[layer][rows, start:] for layer in set(layers)}
    compiled = [compile_hooks(model, [_shifted(item, start) for item in run]) for run in runs]
    n_rows = len(range(*rows.indices(len(tokens))))
    hooks = _growing_hooks(n_rows, layers, compiled, joining)
    at = (read_at[rows] - start).repeat(len(runs))
    prefix = prefix_cache(cache, rows, start)
    return forward_read(model, tokens[rows, start:], hooks, at, prefix=prefix)


def suffix_like_forward(model, tokens: Int[Tensor, "rows pos"], read_at: Int[Tensor, " rows"]):
    """Whether :func:`suffix_pass` gives this model's logits, checked on the first row: two
    runs re-patching the base residual at a middle position, one at layer 0 and one at the
    last layer, against the dense read (float rounding: 1e-5). When not (it raises one of
    :data:`~interp.engine.passes.STRUCTURE_ERRORS`, or differs), the caller takes the dense
    passes and a warning (once per reason and process) says so; out of memory is raised."""
    at = int(read_at[0])
    start = at // 2
    if start < 1:
        return False  # nothing before the read to reuse: the dense passes are the same work
    reason = _suffix_refused(model, tokens[:1], read_at[:1], start)
    if reason is None:
        return True
    warn_fallback(
        logger,
        f"suffix_pass:{reason.split(':')[0]}",
        "patched runs from their first patched position (suffix_pass) are not used: %s; "
        "running every position (the dense passes, slower)",
        reason,
    )
    return False


def _suffix_refused(model, probe: Tensor, read: Tensor, start: int) -> str | None:
    """Why :func:`suffix_pass` cannot stand for the dense read on ``probe``, or None."""
    try:
        states = base_states(model, probe)
        last = int(model.cfg.n_layers) - 1
        runs = [
            [Intervention(Site("resid_pre", layer, pos=start), "patch", source=states[1][layer])]
            for layer in sorted({0, last})
        ]
        fast = suffix_pass(model, probe, start, runs, states, read, slice(0, 1))
        dense = forward_read(model, probe, (), read)
    except torch.OutOfMemoryError:
        raise
    except STRUCTURE_ERRORS as exc:  # a structure the suffix pass cannot follow
        return f"it raised {type(exc).__name__}: {str(exc).strip()[:200]}"
    dense = dense.expand(len(runs), -1)
    if fast.shape != dense.shape or not torch.allclose(fast, dense, rtol=1e-5, atol=1e-5):
        return "its logits differ from the dense passes'"
    return None
