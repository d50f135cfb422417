"""Changes delivered to readers' inputs only: the one mechanism every discovery method uses.

A reader's input is the residual stream where it reads it (the input of its norm). An edge
``W->R`` moves ``R``'s input by ``delta`` (the writer's clean minus corrupted output) and
nothing else: the stream itself, and every other reader, are untouched; everything after ``R``
is recomputed.

- ``logits``: ``ln_final``'s input becomes ``x + delta``.
- ``MLP{l}``: its norm's input (``ln2``) becomes ``x + delta``; where attention and MLP share
  one norm (GPT-J, Phi) the MLP's input moves by ``ln1(x + delta) - ln1(x)``.
- ``L{l}H{h}.q/k/v``: that head's projection alone reads ``ln1(x + delta)``, so its
  ``hook_q/k/v`` (before rotary) moves by ``(ln1(x + delta) - ln1(x)) @ W[l, h]``. The norm is
  recomputed here because TransformerLens's ``hook_q_input`` needs ``use_split_qkv_input``.
  Under grouped-query attention ``h`` of k and v is the key/value head.

Each addition applies to a slice of the batch rows (one patched run per block of rows). With
``delta`` a zero tensor that requires grad, the gradient of the metric with respect to it is
the gradient with respect to that reader's input (EAP).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from interp.discovery.graph import QKV, Reader
from interp.engine import HookFn

__all__ = ["reader_hooks", "Addition"]

CHECK_ATOL = 1e-4  # float32: our ln1(x) W + b against the model's own hook_q/k/v

# (reader, batch rows it applies to, the change [rows pos d_model])
Addition = tuple[Reader, slice, Float[Tensor, "rows pos d_model"]]


def shared_norm(model) -> bool:
    """Parallel blocks whose attention and MLP read one norm (GPT-J, Phi): no ``ln2``."""
    return "blocks.0.hook_mlp_out" in model.hook_dict and "blocks.0.ln2.hook_in" not in (
        model.hook_dict
    )


def _rows_of(addition: Addition) -> int:
    """The batch rows an addition applies to."""
    return int(addition[2].shape[0])


def _weights(model, which: str) -> tuple[Tensor, Tensor | None]:
    W = getattr(model, f"W_{which.upper()}")
    try:
        b = getattr(model, f"b_{which.upper()}")
    except AttributeError:  # the bridge raises for a bias the checkpoint does not have
        b = None
    return W, b


def reader_hooks(model, additions: Sequence[Addition], *, check: bool = False) -> list:
    """Forward hooks giving each reader its additions, on the batch rows of each.

    ``check``: verify that ``ln1(x) W + b`` is the model's own ``hook_q/k/v`` for every head
    that gets a change (a RuntimeError naming the hook where it is not).
    """
    shared = shared_norm(model)
    normed: dict[int, Tensor] = {}  # layer -> (x, ln1(x)) of this pass
    busy: set[int] = set()  # calling ln1 below fires ln1.hook_in again: do not recurse
    by_hook: dict[str, list[tuple[Reader, slice, Tensor]]] = {}
    norm_layers: set[int] = set()
    for reader, rows, delta in additions:
        if reader.kind == "logits":
            name = "ln_final.hook_in"
        elif reader.kind == "mlp" and shared:
            name = f"blocks.{reader.layer}.mlp.hook_in"
            norm_layers.add(reader.layer)
        elif reader.kind == "mlp":
            name = f"blocks.{reader.layer}.ln2.hook_in"
        elif reader.kind in QKV:
            name = f"blocks.{reader.layer}.attn.hook_{reader.kind}"
            norm_layers.add(reader.layer)
        else:
            raise ValueError(f"unknown reader {reader}")
        by_hook.setdefault(name, []).append((reader, rows, delta))

    def see(layer: int) -> HookFn:
        def hook(x: Tensor, hook) -> None:
            if layer in busy:
                return
            busy.add(layer)
            try:
                normed[layer] = (x, model.blocks[layer].ln1(x))
            finally:
                busy.discard(layer)

        return hook

    def moved(layer: int, rows: slice, delta: Tensor) -> Tensor:
        x, base = normed[layer]
        busy.add(layer)
        try:
            return model.blocks[layer].ln1(x[rows] + delta) - base[rows]
        finally:
            busy.discard(layer)

    def moved_all(layer: int, items) -> list[Tensor]:
        """``moved`` for every item of one hook, the norm applied to as many of them at once
        as make one batch of this pass (a norm works row by row, so each row is what it would
        be alone; the few norm calls, not the hundreds, are what small models spend time on)."""
        x, base = normed[layer]
        changes: list[Tensor] = []
        start = 0
        while start < len(items):
            stop, rows = start, 0
            while stop < len(items) and (stop == start or rows + _rows_of(items[stop]) <= len(x)):
                rows += _rows_of(items[stop])
                stop += 1
            group = items[start:stop]
            busy.add(layer)
            try:
                shifted = model.blocks[layer].ln1(torch.cat([x[r] + d for _, r, d in group]))
            finally:
                busy.discard(layer)
            parts = shifted.split([_rows_of(item) for item in group])
            changes += [part - base[r] for part, (_, r, _) in zip(parts, group, strict=True)]
            start = stop
        return changes

    def add(items) -> HookFn:
        def hook(x: Tensor, hook) -> Tensor:
            out = x.clone()  # never in place: the stream itself must not move
            for _, rows, delta in items:
                out[rows] = out[rows] + delta
            return out

        return hook

    def shared_mlp(layer: int, items) -> HookFn:
        def hook(act: Tensor, hook) -> Tensor:
            out = act.clone()
            for _, rows, delta in items:
                out[rows] = out[rows] + moved(layer, rows, delta)
            return out

        return hook

    def heads(layer: int, which: str, items) -> HookFn:
        W, b = _weights(model, which)

        def hook(act: Float[Tensor, "batch pos head d_head"], hook) -> Tensor:
            out = act.clone()
            if check:  # a property of each head, over all rows: once a head
                for h in sorted({reader.head for reader, _, _ in items}):
                    _check(act, normed[layer][1], W[layer, h], b, layer, h, which)
            for (reader, rows, _), change in zip(items, moved_all(layer, items), strict=True):
                h = reader.head
                out[rows, :, h] = out[rows, :, h] + change @ W[layer, h]
            return out

        return hook

    hooks: list = [(f"blocks.{lay}.ln1.hook_in", see(lay)) for lay in sorted(norm_layers)]
    for name, items in by_hook.items():
        reader = items[0][0]
        if reader.kind in QKV:
            hooks.append((name, heads(reader.layer, reader.kind, items)))
        elif reader.kind == "mlp" and shared:
            hooks.append((name, shared_mlp(reader.layer, items)))
        else:
            hooks.append((name, add(items)))
    return hooks


def _check(act, normed, W, b, layer, h, which) -> None:
    ours = normed @ W + (0.0 if b is None else b[layer, h])
    gap = float((ours - act[:, :, h]).abs().max())
    if gap > CHECK_ATOL * max(1.0, float(act[:, :, h].abs().max())):
        raise RuntimeError(
            f"blocks.{layer}.attn.hook_{which} is not ln1(x) W_{which.upper()} + "
            f"b_{which.upper()} on this model (off by {gap:.2e}); edges into q/k/v inputs "
            "are not supported for it"
        )
