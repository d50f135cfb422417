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
from interp.models.norms import check_qkv_input, qkv_weights

__all__ = ["reader_hooks", "Addition"]

_REFUSAL = "edges into q/k/v inputs are not supported for it"
# (reader, batch rows it applies to, the change [rows pos d_model])
Addition = tuple[Reader, slice, Float[Tensor, "rows pos d_model"]]


def shared_norm(model) -> bool:
    """Parallel blocks whose attention and MLP read one norm (GPT-J, Phi): no ``ln2``."""
    return "blocks.0.hook_mlp_out" in model.hook_dict and "blocks.0.ln2.hook_in" not in (
        model.hook_dict
    )


def _hook_of(reader: Reader, shared: bool) -> str:
    """The hook where ``reader``'s input is moved."""
    if reader.kind == "logits":
        return "ln_final.hook_in"
    if reader.kind == "mlp":
        return f"blocks.{reader.layer}.{'mlp' if shared else 'ln2'}.hook_in"
    if reader.kind in QKV:
        return f"blocks.{reader.layer}.attn.hook_{reader.kind}"
    raise ValueError(f"unknown reader {reader}")


class _Norms:
    """Each layer's ``ln1`` input ``x`` and ``ln1(x)`` in this pass (recorded at ``ln1.hook_in``),
    and ``ln1`` of moved inputs: what q/k/v readers and a shared-norm MLP read."""

    def __init__(self, model):
        self.model = model
        self.normed: dict[int, tuple[Tensor, Tensor]] = {}  # layer -> (x, ln1(x))
        self.busy: set[int] = set()  # calling ln1 fires ln1.hook_in again: do not recurse

    def ln1(self, layer: int, x: Tensor) -> Tensor:
        self.busy.add(layer)
        try:
            return self.model.blocks[layer].ln1(x)
        finally:
            self.busy.discard(layer)

    def see(self, layer: int) -> HookFn:
        def hook(x: Tensor, hook) -> None:
            if layer not in self.busy:
                self.normed[layer] = (x, self.ln1(layer, x))

        return hook

    def moved(self, layer: int, items: Sequence[Addition]) -> list[Tensor]:
        """``ln1(x + delta) - ln1(x)`` on each item's rows, the norm applied to as many items
        at once as make one batch of this pass (a norm works row by row, so each row is what it
        would be alone; the few norm calls, not the hundreds, are what small models spend time
        on)."""
        x, base = self.normed[layer]
        changes: list[Tensor] = []
        start = 0
        while start < len(items):
            stop, rows = start, 0
            while stop < len(items) and (stop == start or rows + len(items[stop][2]) <= len(x)):
                rows += len(items[stop][2])
                stop += 1
            group = items[start:stop]
            shifted = self.ln1(layer, torch.cat([x[r] + d for _, r, d in group]))
            parts = shifted.split([len(d) for _, _, d in group])
            changes += [part - base[r] for part, (_, r, _) in zip(parts, group, strict=True)]
            start = stop
        return changes


def _add(items: Sequence[Addition], norms: _Norms | None = None, layer: int = 0) -> HookFn:
    """Each item's change added on its rows (``norms``: through ``ln1``, a shared-norm MLP)."""

    def hook(x: Tensor, hook) -> Tensor:
        out = x.clone()  # never in place: the stream itself must not move
        changes = [d for _, _, d in items] if norms is None else norms.moved(layer, items)
        for (_, rows, _), change in zip(items, changes, strict=True):
            out[rows] = out[rows] + change
        return out

    return hook


def _heads(model, norms: _Norms, layer: int, which: str, items, check: bool) -> HookFn:
    """Each q/k/v reader's head moved by ``(ln1(x + delta) - ln1(x)) @ W[layer, head]``."""
    weights = qkv_weights(model, which)
    W = weights[0]

    def hook(act: Float[Tensor, "batch pos head d_head"], hook) -> Tensor:
        out = act.clone()
        if check:  # a property of each head, over all rows: once a head
            for h in sorted({reader.head for reader, _, _ in items}):
                normed = norms.normed[layer][1]
                check_qkv_input(act, normed, weights, layer, h, which, _REFUSAL)
        for (reader, rows, _), change in zip(items, norms.moved(layer, items), strict=True):
            h = reader.head
            out[rows, :, h] = out[rows, :, h] + change @ W[layer, h]
        return out

    return hook


def reader_hooks(model, additions: Sequence[Addition], *, check: bool = False) -> list:
    """Forward hooks giving each reader its additions, on the batch rows of each.

    ``check``: verify that ``ln1(x) W + b`` is the model's own ``hook_q/k/v`` for every head
    that gets a change (a RuntimeError naming the hook where it is not).
    """
    shared = shared_norm(model)
    by_hook: dict[str, list[Addition]] = {}
    for addition in additions:
        by_hook.setdefault(_hook_of(addition[0], shared), []).append(addition)
    norms = _Norms(model)
    through_ln1 = {
        r.layer for r, _, _ in additions if r.kind in QKV or (r.kind == "mlp" and shared)
    }
    hooks: list = [(f"blocks.{lay}.ln1.hook_in", norms.see(lay)) for lay in sorted(through_ln1)]
    for name, items in by_hook.items():
        reader = items[0][0]
        if reader.kind in QKV:
            hooks.append((name, _heads(model, norms, reader.layer, reader.kind, items, check)))
        elif reader.kind == "mlp" and shared:
            hooks.append((name, _add(items, norms, reader.layer)))
        else:
            hooks.append((name, _add(items)))
    return hooks
