"""When a head's circuit counts as numerically zero: its scores are then undefined, not 0."""

from __future__ import annotations

from jaxtyping import Float
from torch import Tensor

__all__ = ["ZERO_RTOL", "negligible"]

# Eigenvalues are "numerically zero" below this fraction of the product of the factors'
# Frobenius norms, ||W_O|| ||W_U W_E|| ||W_V||: float32 rounding of the products is ~1e-7 per
# term times sqrt of the summed lengths (d_vocab, d_model), ~1e-5 at GPT-2's sizes. Random
# weights give Σ|λ| ≈ 6e-3 of that bound at GPT-2 small's shape (4e-2 at d_model 64), so only a
# head ~600x more self-cancelling than a random one is flagged.
ZERO_RTOL = 1e-5


def negligible(size: Float[Tensor, "layer head"]) -> Tensor:
    """Heads whose circuit is numerically zero next to the model's largest: ``size`` (a norm
    per head) at most ``ZERO_RTOL`` of its maximum. Catches heads scaled to float32 denormals,
    which a ratio of their own norms would still score (from 2 or 3 significant bits)."""
    size = size.double()
    return ~(size > ZERO_RTOL * size.max()) if size.numel() else size.bool()
