"""No silent fallback: where the library takes a slower or approximate path than the one it
tried first, it says so once per process, with :func:`warn_fallback`.

Once, because a fallback found on one prompt is found on every prompt of the same model (a
patching grid checks the fast read before each call); by ``key``, so that two different
fallbacks each say their own line. :func:`reset_fallback_warnings` forgets what was said (tests).
"""

from __future__ import annotations

import logging

__all__ = ["warn_fallback", "reset_fallback_warnings", "warned_fallbacks"]

_WARNED: set[str] = set()  # the keys warned about in this process (state: not a public constant)


def warn_fallback(logger: logging.Logger, key: str, message: str, *args: object) -> bool:
    """Log ``message % args`` as a warning on ``logger`` the first time ``key`` is seen in this
    process; later calls with the same key log nothing. Returns whether it logged."""
    if key in _WARNED:
        return False
    _WARNED.add(key)
    logger.warning(message, *args)
    return True


def reset_fallback_warnings() -> None:
    """Forget every key warned about, so the next fallback of each kind warns again."""
    _WARNED.clear()


def warned_fallbacks() -> frozenset[str]:
    """The keys warned about in this process so far."""
    return frozenset(_WARNED)
