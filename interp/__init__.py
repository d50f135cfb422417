"""interp: mechanistic interpretability on TransformerLens 4's hooked models.

The public names below are imported on first use, so ``import interp`` stays cheap
(the command line starts fast) and has no side effects.
"""

from __future__ import annotations

import importlib

# public name -> module that defines it
_EXPORTS = {
    "load_model": "interp.loading",
    "bundled_models": "interp.loading",
    "ModelLoadError": "interp.loading",
    "run_cached": "interp.caching",
    "CachedRun": "interp.caching",
    "PromptError": "interp.caching",
    "to_tokens": "interp.caching",
    "detect_induction_heads": "interp.induction",
    "run_induction_scan": "interp.induction",
    "fold_layernorm": "interp.layernorm",
    "FoldError": "interp.layernorm",
    "logit_attribution": "interp.attribution",
    "logit_lens": "interp.attribution",
    "AttributionError": "interp.attribution",
    "TokenError": "interp.attribution",
    "Report": "interp.html",
    "write_text_atomic": "interp.html",
    "head_heatmap": "interp.plotting",
    "loss_by_position": "interp.plotting",
    "attribution_bars": "interp.plotting",
    "logit_lens_lines": "interp.plotting",
    "attention_heatmap": "interp.plotting",
    "ReferenceGPT2": "interp.reference",
    "ReferenceConfig": "interp.reference",
    "UnsupportedArchitectureError": "interp.reference",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'interp' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
