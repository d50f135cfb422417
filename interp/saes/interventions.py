"""Interventions on one SAE feature: set feature ``j`` of ``sae`` to a value (0 ablates it,
another run's activation patches it) at one position or all. Both helpers make the one
:class:`interp.engine.feature_edit.FeatureEdit` (of an SAE; its docstring gives the change),
which ``run_cached(interventions=...)``, ``interp.intervene`` and ``run_patched`` take beside
:class:`interp.Intervention` objects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jaxtyping import Float
from torch import Tensor

from interp.engine import feature_edit

if TYPE_CHECKING:
    from interp.engine.feature_edit import FeatureEdit

__all__ = ["ablate_feature", "patch_feature"]


def ablate_feature(sae, feature: int, *, pos: int | None = None) -> FeatureEdit:
    """Zero-ablate ``feature`` (at ``pos``, or everywhere): subtract ``f_j W_dec[j]``."""
    return feature_edit.FeatureEdit(sae, feature, pos, 0.0)


def patch_feature(
    sae, feature: int, source: Float[Tensor, "batch pos"], *, pos: int | None = None
) -> FeatureEdit:
    """Set ``feature`` to its activations in another run, ``source`` ``[batch pos]`` (e.g.
    ``run_cached(model, clean, saes=[sae])[f"{sae.hook_name}.hook_sae_acts"][..., j]``)."""
    return feature_edit.FeatureEdit(sae, feature, pos, source.detach())
