"""One feature edit for every sparse dictionary: set (``value``) or scale (``scale``) feature
``feature`` at position ``pos`` (every position when None) in every row; ``value`` defaults to
0, which ablates the feature.

The first argument says whose feature:

- a transcoder layer (an int, or ``layer=``): the edit is made inside the transcoder splice
  (``run_cached(transcoders=tc, feature_edits=[...])``, ``interp.feature_intervention``), on
  the layer's features before they are decoded;
- an SAE (or ``sae=``): the edit is its own forward hook at the SAE's hook
  (``run_cached(interventions=[...])``, ``interp.intervene``, ``run_patched``).

Either way the error term stays the one of the unedited features, so the stream moves by
exactly ``(new - old) W_dec[feature]``: at an SAE's hook ``x`` becomes
``x + (v - f_j) W_dec[j]``. ``value`` is a number, or a tensor broadcastable to ``[batch pos]``
(another run's activations of the feature, for patching). The dictionaries are duck-typed (the
engine does not import the analyses): an SAE needs ``hook_name``, ``d_sae``, ``encode``,
``W_dec`` and ``decoder_flag()`` (:class:`interp.dictionaries.Dictionary` has it).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

__all__ = ["FeatureEdit"]


@dataclass(frozen=True, init=False, repr=False)
class FeatureEdit:
    """Set or scale one feature of a transcoder layer or an SAE (module docstring):
    ``FeatureEdit(layer, feature, pos, value=...)`` or ``FeatureEdit(sae, feature, pos)``."""

    dictionary: object  # the transcoder layer (an int) or the SAE
    feature: int
    pos: int | None
    value: float | Tensor | None
    scale: float | None

    def __init__(
        self,
        dictionary: object = None,
        feature: int | None = None,
        pos: int | None = None,
        value: float | Tensor | None = None,
        scale: float | None = None,
        *,
        layer: int | None = None,
        sae: object = None,
    ):
        given = [d for d in (dictionary, layer, sae) if d is not None]
        if len(given) != 1:
            raise ValueError("a FeatureEdit names one dictionary: a transcoder layer or an SAE")
        if value is not None and scale is not None:
            raise ValueError("a FeatureEdit takes exactly one of value= and scale=")
        what = _index(given[0])
        if (layer is not None and what is None) or (what is not None and what < 0):
            raise ValueError(f"layer must be a transcoder layer's index >= 0, got {given[0]!r}")
        if _index(feature) is None or _index(feature) < 0:
            raise ValueError(f"feature must be an index >= 0, got {feature!r}")
        feature = _index(feature)
        if what is None:  # an SAE: its feature and its decoder checked now
            what = given[0]
            d_sae = int(what.d_sae)
            if not feature < d_sae:
                raise ValueError(f"feature must be an index in 0 .. {d_sae - 1}, got {feature!r}")
            odd = what.decoder_flag()
            if odd is not None:  # the edit adds (v - f_j) W_dec[j] to the hook's whole activation
                raise ValueError(
                    f"feature edits take an SAE writing f W_dec + b_dec at its hook; this one "
                    f"has {odd[0]}={odd[1]!r}"
                )
        value = 0.0 if value is None and scale is None else value
        items = (what, feature, pos, value, scale)
        for name, item in zip(self.__dataclass_fields__, items, strict=True):
            object.__setattr__(self, name, item)

    @property
    def layer(self) -> int | None:
        """The transcoder layer edited (None for an SAE's edit)."""
        return self.dictionary if isinstance(self.dictionary, int) else None

    @property
    def sae(self) -> object:
        """The SAE edited (None for a transcoder layer's edit)."""
        return None if isinstance(self.dictionary, int) else self.dictionary

    def __repr__(self) -> str:
        which = f"layer={self.layer}" if self.layer is not None else f"sae={self.sae!r}"
        how = f"scale={self.scale}" if self.scale is not None else f"value={_shown(self.value)}"
        return f"FeatureEdit({which}, feature={self.feature}, pos={self.pos}, {how})"

    def target(self, f: Float[Tensor, "batch pos"]) -> Float[Tensor, "batch pos"]:
        """The feature's new values, given its values ``f`` (every position)."""
        if self.scale is not None:
            return f * self.scale
        target = torch.as_tensor(self.value, dtype=f.dtype, device=f.device)
        target = target.expand_as(f) if target.dim() < 2 else target
        if target.shape != f.shape:
            raise ValueError(
                f"a patched feature value must be one number or [batch pos] = "
                f"{tuple(f.shape)}, got {tuple(target.shape)}"
            )
        return target

    def check_pos(self, n_pos: int) -> None:
        """Refuse a position outside a prompt of ``n_pos`` tokens."""
        if self.pos is not None and not -n_pos <= self.pos < n_pos:
            raise ValueError(
                f"feature {self.feature} at position {self.pos}: the prompt has {n_pos} positions"
            )

    def apply(self, acts: Float[Tensor, "batch pos d_dict"]) -> None:
        """Make the edit on a layer's features ``acts``, in place (the transcoder splice)."""
        self.check_pos(acts.shape[1])
        where = slice(None) if self.pos is None else self.pos
        acts[:, where, self.feature] = self.target(acts[..., self.feature])[:, where]

    def hook(self) -> tuple[str, object]:
        """The forward hook ``(hook_name, fn)`` making an SAE's edit."""
        if self.sae is None:
            raise ValueError(
                f"{self} edits a transcoder layer: pass it as run_cached(transcoders=..., "
                "feature_edits=[...]), not as an intervention"
            )
        return (self.sae.hook_name, self._edit)

    def _edit(self, x: Float[Tensor, "batch pos d_in"], hook) -> Tensor:
        self.check_pos(x.shape[1])
        with torch.no_grad():
            f = self.sae.encode(x)[..., self.feature]  # [batch pos]
        target = self.target(f)
        change = torch.zeros_like(f)
        where = slice(None) if self.pos is None else self.pos
        change[:, where] = target[:, where] - f[:, where]
        direction = self.sae.W_dec[self.feature].detach().to(x.dtype)
        return x + change[..., None].to(x.dtype) * direction


def _index(value) -> int | None:
    """``value`` as an int when it is an integer (a layer's or a feature's index), else None."""
    if isinstance(value, bool) or isinstance(value, Tensor) and value.dim() != 0:
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _shown(value) -> str:
    return f"tensor{list(value.shape)}" if isinstance(value, Tensor) else repr(value)
