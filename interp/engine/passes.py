"""One forward pass with hooks: the only place the engine calls the model.

Every pass runs without Hugging Face's KV cache (two residual streams per layer and row that
no analysis reads), drops each layer's retained attention pattern as soon as the layer is done
(:func:`interp.engine.allocator.drop_retained_patterns`), and removes its hooks when it ends,
also when a hook or the model raises.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.engine.allocator import drop_retained_patterns, release_retained

__all__ = ["HookFn", "forward", "store_hook"]

HookFn = Callable[..., Tensor | None]  # a forward hook: (activation, hook) -> new value or None


def forward(
    model,
    tokens: Int[Tensor, "batch pos"],
    hooks: Sequence[tuple[str, HookFn]] = (),
    *,
    grad: bool = False,
) -> Float[Tensor, "batch pos d_vocab"]:
    """The logits of ``tokens`` with ``hooks`` applied (in order), under ``inference_mode``, or
    with gradients enabled when ``grad`` (attribution patching differentiates the logits after
    the pass); the retained patterns are dropped after the hooks that may read them."""
    fwd_hooks = [*hooks, *drop_retained_patterns(model)]
    mode = torch.enable_grad() if grad else torch.inference_mode()
    try:
        with mode, model.hooks(fwd_hooks=fwd_hooks, reset_hooks_end=True):
            return model(tokens, return_type="logits", use_cache=False)
    finally:
        release_retained(model)


def store_hook(store: dict, name: str, copy: bool = False) -> HookFn:
    """A hook keeping its activation in ``store[name]`` (a copy where later hooks edit it in
    place: what was kept must not change)."""

    def hook(act: Tensor, hook) -> None:
        store[name] = act.detach().clone() if copy else act.detach()

    return hook
