"""Deprecated old path (0.6.0; goes in 0.7.0): attribution patching is
:mod:`interp.interventions.attribution_patching` (``interp.attribution`` is direct logit
attribution; one name, one meaning). Importing this module warns (``DeprecationWarning``);
its names still work."""

from __future__ import annotations

import warnings

from interp.interventions.attribution_patching import (
    attribution_deltas,
    estimate_attribution_bytes,
)

__deprecated__ = "use interp.interventions.attribution_patching; this path goes in 0.7.0"

warnings.warn(
    "interp.interventions.attribution is deprecated and goes in 0.7.0: import "
    "interp.interventions.attribution_patching",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["attribution_deltas", "estimate_attribution_bytes"]
