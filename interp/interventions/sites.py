"""Where an intervention acts (:class:`Site`) and what it does there (:class:`Intervention`).

They are the engine's vocabulary and live in :mod:`interp.engine.sites` (the table of site
kinds and their hooks is there); this module keeps their import path.
"""

from __future__ import annotations

from interp.engine.sites import ABLATIONS, HEAD_KINDS, SITE_KINDS, Intervention, Site

__all__ = ["Site", "Intervention", "SITE_KINDS", "ABLATIONS"]
_ = HEAD_KINDS  # re-exported for code that reads it from here
