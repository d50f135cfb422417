"""Turn :class:`Intervention` objects into forward hooks, and apply them for a ``with`` block.

The hook compiler is the engine's (:mod:`interp.engine.hooks`, where each kind's value is
defined); this module keeps its import path.
"""

from __future__ import annotations

from interp.engine.hooks import HookFn, compile_hooks, intervene

__all__ = ["compile_hooks", "intervene", "HookFn"]
