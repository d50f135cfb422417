"""The engine: one place that turns sites and interventions into hooks, runs forward passes,
keeps what an analysis asked for, and plans chunks of rows under a memory budget.

Analyses ask it for "these rows, these interventions, keep these activations, within this
budget" and get results back:

- :func:`run_cached` (:mod:`~.cache`): one pass, keeping chosen activations, under ``max_bytes``;
- :func:`run_patched` (:mod:`~.batched`): many patched runs of a prompt, or of every row of
  a task at once (each patched run a block of rows), in batched passes under ``max_bytes`` less
  what the caller holds (:func:`rows_per_pass`, :func:`task_blocks` plan them);
- :func:`row_chunks` (:mod:`~.plan`): the row slices an analysis that reduces as it goes
  (the induction scan, batched attribution) runs one pass each;
- :func:`compile_hooks` / :func:`intervene` (:mod:`~.hooks`): :class:`Intervention` objects
  (:mod:`~.sites`) as forward hooks; :func:`forward` (:mod:`~.passes`): the one call of the model.

Modules, bottom to top: ``allocator``, ``estimates``, ``plan``, ``tokens``, ``sites``,
``passes``, ``hooks``, ``cache``, ``suffix``, ``batched`` (docs/architecture.md);
``splice``, ``transcoder_splice`` and ``feature_edit`` (:class:`FeatureEdit`) put sparse
dictionaries into a pass.
"""

from __future__ import annotations

from interp.engine.allocator import (
    drop_retained_patterns,
    release_retained,
    return_freed_memory,
    trim_freed_memory,
)
from interp.engine.batched import MetricFn, RowMetricFn, check_eval, per_row, run_patched
from interp.engine.cache import CachedRun, run_cached, run_logits
from interp.engine.estimates import (
    estimate_attribution_bytes,
    estimate_cache_bytes,
    estimate_forward_bytes,
    estimate_loss_bytes,
    estimate_run_bytes,
    format_size,
    parse_size,
)
from interp.engine.feature_edit import FeatureEdit
from interp.engine.hooks import compile_hooks, intervene
from interp.engine.passes import HookFn, forward, store_hook
from interp.engine.plan import (
    LOGITS_BUDGET_BYTES,
    MemoryBudgetError,
    check_budget,
    row_chunks,
    rows_per_chunk,
    rows_per_pass,
    task_blocks,
)
from interp.engine.sites import ABLATIONS, HEAD_KINDS, SITE_KINDS, Intervention, Site
from interp.engine.tokens import (
    RESID_KINDS,
    Prompt,
    PromptError,
    TokenError,
    check_hook_names,
    hook_name,
    pair_tokens,
    resolve_token,
    to_tokens,
    token_strings,
)
from interp.engine.transcoder_splice import transcoder_acts_name

__all__ = [
    "run_cached",
    "run_logits",
    "CachedRun",
    "FeatureEdit",
    "transcoder_acts_name",
    "run_patched",
    "rows_per_pass",
    "task_blocks",
    "RowMetricFn",
    "row_chunks",
    "rows_per_chunk",
    "check_budget",
    "MemoryBudgetError",
    "compile_hooks",
    "intervene",
    "forward",
    "store_hook",
    "HookFn",
    "Site",
    "Intervention",
    "SITE_KINDS",
    "HEAD_KINDS",
    "ABLATIONS",
    "Prompt",
    "PromptError",
    "TokenError",
    "resolve_token",
    "to_tokens",
    "pair_tokens",
    "token_strings",
    "check_hook_names",
    "hook_name",
    "RESID_KINDS",
    "MetricFn",
    "per_row",
    "check_eval",
    "LOGITS_BUDGET_BYTES",
    "estimate_cache_bytes",
    "estimate_forward_bytes",
    "estimate_loss_bytes",
    "estimate_run_bytes",
    "estimate_attribution_bytes",
    "parse_size",
    "format_size",
    "drop_retained_patterns",
    "release_retained",
    "return_freed_memory",
    "trim_freed_memory",
]
