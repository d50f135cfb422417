"""Interventions on one SAE feature: set feature ``j`` of ``sae`` to a value (0 ablates it,
another run's activation patches it) at one position or all.

At the SAE's hook the activation ``x`` becomes ``x + (v - f_j) W_dec[j]`` with ``f = encode(x)``:
exactly the stream the SAE writes with ``f_j`` replaced by ``v`` and everything else (the
other features, ``b_dec``, the reconstruction error) unchanged. ``run_cached(interventions=...)``,
``interp.intervene`` and ``run_patched`` take a :class:`FeatureEdit` beside
:class:`interp.Intervention` objects (its ``hook()`` is a raw ``(hook_name, fn)`` hook).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from jaxtyping import Float
from torch import Tensor

from interp.saes.sae import decoder_flag

__all__ = ["FeatureEdit", "ablate_feature", "patch_feature"]


@dataclass(frozen=True, eq=False)
class FeatureEdit:
    """Set feature ``feature`` of ``sae`` to ``value`` at position ``pos`` (None: every
    position). ``value`` is a number, or a tensor broadcastable to ``[batch pos]`` (a clean
    run's activations of the feature, for patching)."""

    sae: object
    feature: int
    pos: int | None = None
    value: float | Tensor = field(default=0.0, repr=False)

    def __post_init__(self):
        d_sae = int(self.sae.d_sae)
        if isinstance(self.feature, bool) or not 0 <= int(self.feature) < d_sae:
            raise ValueError(f"feature must be an index in 0 .. {d_sae - 1}, got {self.feature!r}")
        odd = decoder_flag(self.sae)
        if odd is not None:  # the edit adds (v - f_j) W_dec[j] to the hook's whole activation
            raise ValueError(
                f"feature edits take an SAE writing f W_dec + b_dec at its hook; this one has "
                f"{odd[0]}={odd[1]!r}"
            )

    def hook(self) -> tuple[str, object]:
        """The forward hook ``(hook_name, fn)`` making the edit."""
        return (self.sae.hook_name, self._edit)

    def _edit(self, x: Float[Tensor, "batch pos d_in"], hook) -> Tensor:
        n_pos = x.shape[1]
        if self.pos is not None and not -n_pos <= self.pos < n_pos:
            raise ValueError(
                f"feature {self.feature} at position {self.pos}: the prompt has {n_pos} positions"
            )
        with torch.no_grad():
            f = self.sae.encode(x)[..., self.feature]  # [batch pos]
        target = torch.as_tensor(self.value, dtype=f.dtype, device=f.device)
        target = target.expand_as(f) if target.dim() < 2 else target
        if target.shape != f.shape:
            raise ValueError(
                f"a patched feature value must be one number or [batch pos] = "
                f"{tuple(f.shape)}, got {tuple(target.shape)}"
            )
        change = torch.zeros_like(f)
        where = slice(None) if self.pos is None else self.pos
        change[:, where] = target[:, where] - f[:, where]
        direction = self.sae.W_dec[self.feature].detach().to(x.dtype)
        return x + change[..., None].to(x.dtype) * direction


def ablate_feature(sae, feature: int, *, pos: int | None = None) -> FeatureEdit:
    """Zero-ablate ``feature`` (at ``pos``, or everywhere): subtract ``f_j W_dec[j]``."""
    return FeatureEdit(sae, feature, pos, 0.0)


def patch_feature(
    sae, feature: int, source: Float[Tensor, "batch pos"], *, pos: int | None = None
) -> FeatureEdit:
    """Set ``feature`` to its activations in another run, ``source`` ``[batch pos]`` (e.g.
    ``run_cached(model, clean, saes=[sae])[f"{sae.hook_name}.hook_sae_acts"][..., j]``)."""
    return FeatureEdit(sae, feature, pos, source.detach())
