"""A model's fingerprint: a hash of its weights, so that activations or shards of one model are
never mixed with another's (or with the same checkpoint changed in memory after loading)."""

from __future__ import annotations

import hashlib

import torch

__all__ = ["model_fingerprint"]


@torch.no_grad()
def model_fingerprint(model) -> str:
    """16 hex digits of a SHA-256 over every parameter and buffer (name, dtype, shape, bytes),
    in ``state_dict`` order: equal for the same weights loaded anywhere, on any device."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        value = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{value.dtype}|{tuple(value.shape)}|".encode())
        digest.update(
            value.reshape(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b""
        )
    return digest.hexdigest()[:16]
