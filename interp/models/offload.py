"""Reading the weights of a model whose layers accelerate offloaded to CPU or disk.

With ``load_model(..., device_map="auto", max_memory=...)`` the layers that do not fit are
offloaded by accelerate: their parameters are ``meta`` placeholders and the real values are
loaded for the duration of each module's forward call. TransformerLens's stacked weights
(``model.W_O``) then raise. Analyses that read weights go through :func:`stacked_weight` or
:func:`materialized`, which load the weights for as long as they are read, through
accelerate's own hooks (TransformerLens's ``align_offloaded_subtree``); nothing is copied into
the model, so it stays offloaded.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

__all__ = ["is_offloaded", "offloaded_modules", "materialized", "stacked_weight"]


def offloaded_modules(model) -> list[str]:
    """Names of the modules the model's ``hf_device_map`` puts on ``cpu`` or ``disk``
    (empty for a model loaded without a device map)."""
    original = getattr(model, "original_model", None)
    device_map = getattr(original, "hf_device_map", None) or {}
    if not device_map or not any(p.device.type == "meta" for p in model.parameters()):
        return []  # an all-CPU map keeps real weights: nothing is offloaded
    return sorted(
        k or "<whole model>" for k, v in device_map.items() if str(v).lower() in ("cpu", "disk")
    )


def is_offloaded(model) -> bool:
    """True when some of the model's weights are loaded only while a module runs."""
    return bool(offloaded_modules(model))


@contextlib.contextmanager
def materialized(model, module: torch.nn.Module | None = None):
    """Within the block, ``module``'s (default: the whole model's) offloaded weights hold
    their real values. Reading the whole model this way needs memory for all its weights."""
    if not is_offloaded(model):
        yield
        return
    from transformer_lens.model_bridge.generalized_components.base import align_offloaded_subtree

    with align_offloaded_subtree(model if module is None else module):
        yield


def stacked_weight(model, name: str) -> Tensor:
    """``getattr(model, name)`` (``"W_O"``, ``"W_Q"``, ...), also for an offloaded model, where
    it is read one block at a time so that only one block's weights are loaded at once."""
    if not is_offloaded(model):
        return getattr(model, name)
    path = {
        "W_Q": "attn.W_Q",
        "W_K": "attn.W_K",
        "W_V": "attn.W_V",
        "W_O": "attn.W_O",
        "b_Q": "attn.b_Q",
        "b_K": "attn.b_K",
        "b_V": "attn.b_V",
        "b_O": "attn.b_O",
        "W_in": "mlp.W_in",
        "W_out": "mlp.W_out",
    }.get(name)
    if path is None:
        with materialized(model):
            return getattr(model, name).detach().clone()
    parts = []
    for block in model.blocks:
        with materialized(model, block):
            value = block
            for attr in path.split("."):
                value = getattr(value, attr)
            parts.append(value.detach().clone())
    return torch.stack(parts)
