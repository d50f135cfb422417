"""Sparse autoencoders (SAELens's format and conventions) on TransformerLens 4 models.

The door: :func:`load_sae` reads every published format (``sae_format`` tells which) into an
:class:`SAE`, :func:`check_sae_fits` checks it against a model, :func:`train_sae` trains one,
:func:`feature_summary` and :func:`logit_effects` describe a feature, :func:`ablate_feature` and
:func:`patch_feature` intervene on one; :func:`bundled_saes` lists the SAEs shipped with interp.
"""

from __future__ import annotations

from interp.foundation.doors import exports, lazy_package

_EXPORTS = exports(
    __name__,
    {
        ".sae": ("SAE",),
        ".loading": ("load_sae", "check_sae_fits", "sae_format", "SAELoadError", "SAEFitError"),
        ".train": ("train_sae",),
        ".features": ("feature_summary", "logit_effects", "FeatureSummary"),
        ".interventions": ("ablate_feature", "patch_feature"),
        ".bundled": ("bundled_saes", "bundled_sae_path"),
    },
)

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_package(__name__, _EXPORTS)
