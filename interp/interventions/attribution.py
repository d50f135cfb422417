"""Deprecated old path (0.6.0; goes in 0.7.0): attribution patching is
:mod:`interp.interventions.attribution_patching` (``interp.attribution`` is direct logit
attribution; one name, one meaning). Importing this module warns (``DeprecationWarning``);
its names still work."""

from __future__ import annotations

from interp.foundation.doors import warn_moved_module
from interp.interventions.attribution_patching import (
    attribution_deltas,
    estimate_attribution_bytes,
)

__deprecated__ = "use interp.interventions.attribution_patching; this path goes in 0.7.0"

warn_moved_module(__name__, "import interp.interventions.attribution_patching")

__all__ = ["attribution_deltas", "estimate_attribution_bytes"]
