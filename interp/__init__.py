"""interp: mechanistic interpretability on TransformerLens 4's hooked models.

The most used names are here, imported on first use, so ``import interp`` stays cheap
(the command line starts fast) and has no side effects. The rest lives in the modules:
``interp.circuits`` (full circuits, materialising slices), ``interp.pages.plotting`` (figures),
``interp.pages.html``, ``interp.models.layernorm``, ``interp.attribution``, ``interp.induction``,
``interp.reference``.
"""

from __future__ import annotations

import importlib
import importlib.util

# public name -> module that defines it. The one door that does not use
# interp.foundation.doors.lazy_package: the package sits on the foundation's floor and imports
# nothing (docs/architecture.md), so it cannot import the foundation's helper.
_EXPORTS = {
    "load_model": "interp.models.loading",
    "bundled_models": "interp.models.loading",
    "ModelLoadError": "interp.models.loading",
    "run_cached": "interp.engine",
    "estimate_cache_bytes": "interp.engine",
    "CachedRun": "interp.engine",
    "PromptError": "interp.engine",
    "detect_induction_heads": "interp.induction",
    "run_induction_scan": "interp.induction",
    "copying_scores": "interp.circuits",
    "composition_scores": "interp.circuits",
    "fold_layernorm": "interp.models.layernorm",
    "logit_attribution": "interp.attribution",
    "logit_attribution_batch": "interp.attribution",
    "logit_lens": "interp.attribution",
    "Report": "interp.pages.html",
    "ReferenceGPT2": "interp.reference",
    "Site": "interp.interventions",
    "Intervention": "interp.interventions",
    "intervene": "interp.interventions",
    "patch_activations": "interp.interventions",
    "run_patched": "interp.interventions",
    "path_patch": "interp.interventions",
    "path_patch_senders": "interp.interventions",
    "ablation_effects": "interp.interventions",
    "edge_scores": "interp.discovery",
    "discover_circuit": "interp.discovery",
    "evaluate_circuit": "interp.discovery",
    "Circuit": "interp.discovery",
    "feature_edge_scores": "interp.discovery",
    "train_sae": "interp.saes.train",
    "load_sae": "interp.saes.loading",
    "feature_attribution": "interp.attribution.features",
    "SAE": "interp.saes.sae",
    "Task": "interp.tasks",
    "ActivationStore": "interp.stores.activations",
    "fill_store": "interp.stores.activations",
    "Sharding": "interp.foundation.executors.sharding",
    "load_transcoders": "interp.transcoders.loading",
    "check_transcoders_fit": "interp.transcoders.loading",
    "TranscoderSet": "interp.transcoders.transcoder",
    "train_transcoder": "interp.transcoders.train",
    "attribution_graph": "interp.graphs.attribute",
    "estimate_graph_bytes": "interp.graphs.budget",
    "AttributionGraph": "interp.graphs.graph",
    "frozen_feature_run": "interp.graphs.interventions",
    "feature_intervention": "interp.graphs.interventions",
    "FeatureEdit": "interp.engine",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.8.0"


def __getattr__(name: str):
    if name not in _EXPORTS:
        if not name.startswith("_") and importlib.util.find_spec(f"interp.{name}") is not None:
            return importlib.import_module(f"interp.{name}")  # interp.tasks.ioi(...) works
        raise AttributeError(f"module 'interp' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
