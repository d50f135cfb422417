"""Memory the forward pass leaves behind: retained attention patterns and glibc's heap.

TransformerLens 4.3's attention keeps every layer's last pattern alive, unread (``_pattern``);
:func:`drop_retained_patterns` and :func:`release_retained` drop them. glibc keeps freed
memory resident (1.4-2.5x what is in use, measured by benchmarks/bench_memory.py):
:func:`return_freed_memory` and :func:`trim_freed_memory` hand it back where that is worth
its page faults. Nothing here changes a result.
"""

from __future__ import annotations

import os

__all__ = ["drop_retained_patterns", "release_retained", "return_freed_memory", "trim_freed_memory"]

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
_FREED_MEMORY_RETURNED = 0  # the threshold set (0: none yet)


def drop_retained_patterns(model) -> list[tuple[str, object]]:
    """Forward hooks that drop each layer's retained pattern as soon as its attention is done
    (TransformerLens 4.3 keeps it, unread, on the attention module as ``_pattern``): without
    them a pass holds every layer's ``[batch head q_pos k_pos]`` pattern until it ends."""
    hooks = []
    for layer, block in enumerate(getattr(model, "blocks", [])):
        name = f"blocks.{layer}.attn.hook_out"
        attn = getattr(block, "attn", None)
        if attn is not None and name in model.hook_dict:

            def drop(act, hook, attn=attn):
                attn._pattern = None

            hooks.append((name, drop))
    return hooks


def release_retained(model) -> None:
    """Drop the attention patterns TransformerLens 4.3's attention keeps after a forward pass
    (``_pattern``, ``n_layers * batch * head * pos**2`` numbers that would stay allocated)."""
    for module in model.modules():
        if getattr(module, "_pattern", None) is not None:
            module._pattern = None


def return_freed_memory(threshold: int = 2**20) -> bool:
    """Make freed tensors of ``threshold`` bytes or more go back to the operating system at once.

    glibc raises its mmap threshold as large blocks are freed, after which tensors of up to
    32 MiB come from a heap that keeps freed memory resident: a forward pass then peaks ~40%
    above what it uses (measured by benchmarks/bench_memory.py). Fixing the threshold (glibc's
    ``mallopt(M_MMAP_THRESHOLD)``, what ``MALLOC_MMAP_THRESHOLD_`` sets) keeps the peak at
    what is in use, at the price of page faults on fresh memory (a scan ran 1.3-1.5x slower).
    Process-wide and harmless to results; interp calls it only where splitting cannot help:
    a ``run_cached`` budget under twice its estimate, or chunks where one row with glibc's
    slack would not fit. It leaves a ``MALLOC_MMAP_THRESHOLD_`` the user set alone; a later
    call only lowers the threshold (an attribution graph under ``max_bytes`` asks for less:
    :data:`interp.graphs.budget.FREED_AT`). Returns False where there is no glibc (macOS,
    Windows, musl).
    """
    global _FREED_MEMORY_RETURNED
    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return True  # the user chose glibc's threshold
    if _FREED_MEMORY_RETURNED and _FREED_MEMORY_RETURNED <= threshold:
        return True  # done already, at this threshold or a lower one
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt, trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        return False
    if not mallopt(_M_MMAP_THRESHOLD, int(threshold)):
        return False
    _FREED_MEMORY_RETURNED = int(threshold)
    trim(0)  # and hand back what the heap holds now
    return True


def trim_freed_memory() -> bool:
    """Hand back to the operating system the free memory glibc's heap still holds
    (``malloc_trim(0)``), so that the process's resident size is what it uses.

    ``run_cached`` calls it after a pass that keeps activations: glibc's default keeps the
    pass's freed working memory resident, 1.4-1.9x the cache on the benchmark, and after the
    trim the resident growth is within 7% of :func:`estimate_cache_bytes`. Returns False where
    there is no glibc.
    """
    global _LIBC
    if _LIBC is None:
        import ctypes
        import ctypes.util

        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.malloc_trim  # noqa: B018 - glibc only
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC is False:
        return False
    _LIBC.malloc_trim(0)
    return True


_LIBC = None  # glibc, once looked up; False where there is none
