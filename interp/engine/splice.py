"""SAEs spliced into a run: each at its hook, its feature activations kept.

An SAE here is anything with ``hook_name``, ``d_sae`` and ``splice(x, use_error_term=)``
(:class:`interp.saes.sae.SAE`; the engine does not import the analyses). At its hook the
part ``x`` it reads (one head's slice for a per-head SAE) becomes ``r + (x - r)`` with
``r`` its reconstruction of ``f = encode(x)``: the reconstruction plus the error, so the run is
the model's own (``use_error_term=True``, the default), or ``r`` alone, the run the SAE's
reconstruction gives. A transcoder (reading one hook, writing another) is refused. ``f`` is
kept under ``f"{hook_name}.hook_sae_acts"`` ``[batch pos d_sae]``.
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxtyping import Float
from torch import Tensor

from interp.engine.passes import HookFn

__all__ = ["SAE_ACTS", "sae_acts_name", "sae_hooks", "check_saes"]

SAE_ACTS = "hook_sae_acts"  # the suffix feature activations are cached under


def sae_acts_name(sae) -> str:
    """The cache key of ``sae``'s feature activations."""
    return f"{sae.hook_name}.{SAE_ACTS}"


def check_saes(model, saes: Sequence) -> None:
    """Refuse, before any run, an SAE at a hook the model lacks, or two at one hook."""
    seen: set[str] = set()
    for sae in saes:
        if sae.hook_name not in model.hook_dict:
            raise ValueError(
                f"an SAE reads {sae.hook_name!r}, which this model has no hook for; "
                "load an SAE trained on this model"
            )
        if getattr(sae, "output_hook_name", None) is not None:
            raise ValueError(
                f"a transcoder reads {sae.hook_name} and writes {sae.output_hook_name}; "
                "splice SAEs, which write what they read"
            )
        if sae.hook_name in seen:
            raise ValueError(f"two SAEs read {sae.hook_name}; splice one SAE per hook")
        seen.add(sae.hook_name)


def _hook(sae, store: dict, use_error_term: bool) -> HookFn:
    def hook(x: Float[Tensor, "batch pos ..."], hook) -> Tensor:
        out, acts = sae.splice(x, use_error_term=use_error_term)
        store[sae_acts_name(sae)] = acts.detach()
        return out

    return hook


def sae_hooks(saes: Sequence, store: dict, *, use_error_term: bool = True) -> list:
    """Forward hooks splicing each SAE in at its hook and keeping its features in ``store``."""
    return [(sae.hook_name, _hook(sae, store, use_error_term)) for sae in saes]
