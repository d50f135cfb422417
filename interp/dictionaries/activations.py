"""The activation functions of sparse dictionaries (SAEs and transcoders): one meaning each.

With ``h`` the pre-activations ``[... d_dict]``:

- ``relu``: ``max(h, 0)`` (SAELens calls it ``standard``);
- ``jumprelu``: ``h' * (h > threshold)``;
- ``topk``: the ``k`` largest entries of ``h`` kept as ``h'``, every other entry 0 (ties as
  ``torch.topk`` picks);
- ``batchtopk``: the ``int(k * n)`` largest entries of ``max(h, 0)`` over all ``n`` rows of the
  call together (SAELens's BatchTopK training SAE: a row's features depend on the batch).

``h'`` is ``max(h, 0)`` when ``floor`` (SAELens: ``ReLU(h) * (h > θ)``, and TopK's kept values
through ReLU), and ``h`` itself otherwise (circuit-tracer: ``h * (h > θ)``, so a negative
threshold lets ``θ < h < 0`` through, and TopK keeps a negative value among the ``k``). The two
libraries differ only there, so one parameter keeps each format's numbers bit for bit: each
function is the same operations, in the same order, as the library it reads.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

__all__ = ["ACTIVATIONS", "ALIASES", "activate", "activation_name", "check_activation"]

ACTIVATIONS = ("relu", "jumprelu", "topk", "batchtopk")  # the activation functions interp runs
# other names the formats write for them: SAELens's architecture "standard", circuit-tracer's
# config.yaml "jump_relu"
ALIASES = {"standard": "relu", "jump_relu": "jumprelu"}


def activation_name(name: str) -> str:
    """``name`` as one of :data:`ACTIVATIONS` (an alias resolved); a ValueError otherwise."""
    name = ALIASES.get(name, name)
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; interp runs {', '.join(ACTIVATIONS)}")
    return name


def _floored(h: Tensor, floor: bool) -> Tensor:
    return torch.relu(h) if floor else h


def activate(
    name: str,
    h: Float[Tensor, "... d_dict"],
    *,
    threshold: Float[Tensor, " d_dict"] | None = None,
    k: float | None = None,
    floor: bool = True,
) -> Float[Tensor, "... d_dict"]:
    """Features from pre-activations ``h`` (the module docstring's formulas)."""
    if name == "relu":
        return torch.relu(h)
    if name == "jumprelu":
        return _floored(h, floor) * (h > threshold).to(h.dtype)
    if name == "topk":
        kept = torch.topk(h, k=int(k), dim=-1, sorted=False).indices
        return _floored(h, floor) * torch.zeros_like(h).scatter_(-1, kept, 1.0)
    if name == "batchtopk":
        acts = h.relu()  # one top-k over every row of the call
        flat = acts.flatten()
        top = torch.topk(flat, int(k * acts.shape[:-1].numel()), dim=-1)
        return torch.zeros_like(flat).scatter(-1, top.indices, top.values).reshape(acts.shape)
    raise ValueError(f"unknown activation {name!r}; interp runs {', '.join(ACTIVATIONS)}")


def check_activation(
    name: str,
    *,
    threshold: Tensor | None,
    k: float | None,
    d_dict: int,
    what: str,
    width: str = "d_dict",
) -> None:
    """Refuse settings ``name`` cannot run with: a threshold for ``jumprelu`` alone, ``k`` for
    ``topk`` (an integer in 1 .. d_dict) and ``batchtopk`` (0 < k <= d_dict) alone. ``what``
    and ``width`` name the dictionary and its width in the message (``"SAE"``, ``"d_sae"``)."""
    if (name == "jumprelu") != (threshold is not None):
        raise ValueError(f"a jumprelu {what} needs a threshold, and only jumprelu takes one")
    if (name in ("topk", "batchtopk")) != (k is not None):
        raise ValueError(f"a {name} {what} needs k, and only topk and batchtopk take one")
    if name == "topk" and not (float(k).is_integer() and 1 <= k <= d_dict):
        raise ValueError(f"a topk {what} needs k between 1 and {width}={d_dict}, got k={k}")
    if name == "batchtopk" and not 0 < k <= d_dict:
        raise ValueError(f"a batchtopk {what} needs 0 < k <= {width}={d_dict}, got k={k}")
