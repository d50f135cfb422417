"""What a run will cost in memory, before it runs, and how many rows fit a budget.

The estimates (:mod:`interp.engine.estimates`), the planner (:mod:`interp.engine.plan`) and
the allocator policy (:mod:`interp.engine.allocator`) are the engine's; this module keeps
their import path. docs/memory.md explains the policy and its measurements.
"""

from __future__ import annotations

from interp.engine.allocator import (
    drop_retained_patterns,
    release_retained,
    return_freed_memory,
    trim_freed_memory,
)
from interp.engine.estimates import (
    estimate_cache_bytes,
    estimate_forward_bytes,
    estimate_loss_bytes,
    estimate_run_bytes,
    format_size,
    parse_size,
)
from interp.engine.plan import MemoryBudgetError, check_budget, rows_per_chunk

__all__ = [
    "MemoryBudgetError",
    "parse_size",
    "format_size",
    "estimate_cache_bytes",
    "estimate_forward_bytes",
    "estimate_loss_bytes",
    "estimate_run_bytes",
    "check_budget",
    "rows_per_chunk",
    "drop_retained_patterns",
    "release_retained",
    "return_freed_memory",
    "trim_freed_memory",
]
