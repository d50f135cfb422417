"""A sparse autoencoder at one hook of a model, in SAELens's conventions.

With ``x`` the activation at the hook and ``x' = x - b_dec`` when ``apply_b_dec_to_input``
(else ``x' = x``), the pre-activation is ``h = x' @ W_enc + b_enc`` and the features are

- ``standard``: ``f = ReLU(h)``;
- ``jumprelu``: ``f = ReLU(h) * (h > threshold)`` (a per-feature threshold);
- ``topk``: the ``k`` largest entries of ``h`` through ReLU, every other feature 0.

The reconstruction is ``x_hat = f @ W_dec + b_dec``. These are SAELens 6's ``encode`` and
``decode`` for its ``StandardSAE``, ``JumpReLUSAE`` and ``TopKSAE`` (``normalize_activations``
``"none"``); tests/test_sae_core.py computes them independently.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from jaxtyping import Float
from torch import Tensor

__all__ = ["ARCHITECTURES", "SAE"]

ARCHITECTURES = ("standard", "jumprelu", "topk")  # the SAELens architectures interp runs


class SAE(torch.nn.Module):
    """A sparse autoencoder at one hook of a model, SAELens conventions.

    Parameters ``W_enc [d_in d_sae]``, ``b_enc [d_sae]``, ``W_dec [d_sae d_in]``,
    ``b_dec [d_in]`` and, for ``jumprelu``, ``threshold [d_sae]``. ``hook_name`` is a
    TransformerLens hook name such as ``"blocks.1.hook_resid_pre"``; ``cfg`` is the
    ``cfg.json`` as loaded (unknown keys kept, written back by :meth:`save`).
    """

    def __init__(
        self,
        W_enc: Float[Tensor, "d_in d_sae"],
        b_enc: Float[Tensor, " d_sae"],
        W_dec: Float[Tensor, "d_sae d_in"],
        b_dec: Float[Tensor, " d_in"],
        *,
        architecture: str = "standard",
        hook_name: str,
        threshold: Float[Tensor, " d_sae"] | None = None,
        k: int | None = None,
        apply_b_dec_to_input: bool = False,
        cfg: dict | None = None,
    ):
        super().__init__()
        if architecture not in ARCHITECTURES:
            raise ValueError(
                f"unknown SAE architecture {architecture!r}; interp runs {', '.join(ARCHITECTURES)}"
            )
        d_in, d_sae = W_enc.shape
        shapes = {
            "b_enc": (b_enc, (d_sae,)),
            "W_dec": (W_dec, (d_sae, d_in)),
            "b_dec": (b_dec, (d_in,)),
        }
        if threshold is not None:
            shapes["threshold"] = (threshold, (d_sae,))
        for name, (tensor, shape) in shapes.items():
            if tuple(tensor.shape) != shape:
                raise ValueError(
                    f"SAE {name} has shape {tuple(tensor.shape)}; W_enc {d_in}x{d_sae} needs "
                    f"{shape}"
                )
        if (architecture == "jumprelu") != (threshold is not None):
            raise ValueError("a jumprelu SAE needs a threshold, and only a jumprelu SAE takes one")
        if (architecture == "topk") != (k is not None):
            raise ValueError("a topk SAE needs k, and only a topk SAE takes one")
        if k is not None and not 1 <= k <= d_sae:
            raise ValueError(f"a topk SAE needs k between 1 and d_sae={d_sae}, got k={k}")
        self.W_enc = torch.nn.Parameter(W_enc)
        self.b_enc = torch.nn.Parameter(b_enc)
        self.W_dec = torch.nn.Parameter(W_dec)
        self.b_dec = torch.nn.Parameter(b_dec)
        self.threshold = None if threshold is None else torch.nn.Parameter(threshold)
        self.architecture = architecture
        self.hook_name = hook_name
        self.k = k
        self.apply_b_dec_to_input = apply_b_dec_to_input
        self.d_in, self.d_sae = int(d_in), int(d_sae)
        self.cfg = dict(cfg or {})

    def __repr__(self) -> str:
        k = f", k={self.k}" if self.k is not None else ""
        return (
            f"SAE({self.architecture}, {self.hook_name}, d_in={self.d_in}, d_sae={self.d_sae}{k})"
        )

    def pre_activation(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        """``h = (x - b_dec if apply_b_dec_to_input) @ W_enc + b_enc``."""
        if self.apply_b_dec_to_input:
            x = x - self.b_dec
        return x @ self.W_enc + self.b_enc

    def encode(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        """Feature activations of ``x`` (the formulas of the module docstring)."""
        h = self.pre_activation(x)
        if self.architecture == "standard":
            return torch.relu(h)
        if self.architecture == "jumprelu":
            return torch.relu(h) * (h > self.threshold)
        values, indices = h.topk(self.k, dim=-1)
        return torch.zeros_like(h).scatter(-1, indices, torch.relu(values))

    def decode(self, acts: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_in"]:
        """The reconstruction ``acts @ W_dec + b_dec``."""
        return acts @ self.W_dec + self.b_dec

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_in"]:
        """``decode(encode(x))``."""
        return self.decode(self.encode(x))

    def save(self, folder: str | Path) -> None:
        """Write ``cfg.json`` and ``sae_weights.safetensors`` (SAELens's saved format)."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {
            "W_enc": self.W_enc,
            "b_enc": self.b_enc,
            "W_dec": self.W_dec,
            "b_dec": self.b_dec,
        }
        if self.threshold is not None:
            tensors["threshold"] = self.threshold
        save_file(
            {name: t.detach().contiguous().cpu() for name, t in tensors.items()},
            str(folder / "sae_weights.safetensors"),
        )
        cfg = {
            **self.cfg,
            "architecture": self.architecture,
            "d_in": self.d_in,
            "d_sae": self.d_sae,
            "hook_name": self.hook_name,
            "apply_b_dec_to_input": self.apply_b_dec_to_input,
        }
        if self.k is not None:
            cfg["k"] = self.k
        (folder / "cfg.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
