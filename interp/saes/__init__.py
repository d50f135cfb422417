"""Sparse autoencoders (SAELens's format and conventions) on TransformerLens 4 models.

The door: :func:`load_sae` reads every published format (``sae_format`` tells which) into an
:class:`SAE`, :func:`check_sae_fits` checks it against a model, :func:`train_sae` trains one,
:func:`feature_summary` and :func:`logit_effects` describe a feature, :func:`ablate_feature` and
:func:`patch_feature` intervene on one; :func:`bundled_saes` lists the SAEs shipped with interp.
"""

from __future__ import annotations

import importlib

# public name -> its module, imported on first use (importing the package stays cheap)
_EXPORTS = {
    "SAE": "interp.saes.sae",
    "load_sae": "interp.saes.loading",
    "check_sae_fits": "interp.saes.loading",
    "sae_format": "interp.saes.loading",
    "SAELoadError": "interp.saes.loading",
    "SAEFitError": "interp.saes.loading",
    "train_sae": "interp.saes.train",
    "feature_summary": "interp.saes.features",
    "logit_effects": "interp.saes.features",
    "FeatureSummary": "interp.saes.features",
    "ablate_feature": "interp.saes.interventions",
    "patch_feature": "interp.saes.interventions",
    "bundled_saes": "interp.saes.bundled",
    "bundled_sae_path": "interp.saes.bundled",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
