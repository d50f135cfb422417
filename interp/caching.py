"""Run a prompt and keep exactly the activations an analysis asked for.

The runner is the engine's (:mod:`interp.engine.cache` for :func:`run_cached` and
:class:`CachedRun`, :mod:`interp.engine.tokens` for prompts); this module keeps their import
path.
"""

from __future__ import annotations

from interp.engine.cache import CachedRun, run_cached
from interp.engine.tokens import (
    RESID_KINDS,
    Prompt,
    PromptError,
    check_hook_names,
    to_tokens,
)

__all__ = ["CachedRun", "PromptError", "run_cached", "to_tokens", "RESID_KINDS"]
_ = (Prompt, check_hook_names)  # re-exported for code that reads them from here
