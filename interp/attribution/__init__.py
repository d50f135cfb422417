"""Direct logit attribution: what each component wrote into the residual stream, read through
the final norm and the unembedding, for one prompt, a batch or every row of a task.

Modules, bottom to top: ``residual`` (the final residual stream split into what each component
wrote), ``core`` (one row's table and the identity that checks it: its rows add up to the
logit), ``rows`` (the one path: rows of prompts, targets and positions in batched passes under a
budget), ``direct`` (the doors onto it: :func:`logit_attribution` for a prompt or a task,
:func:`logit_attribution_batch`, :func:`task_attribution`), ``shards`` (a task split into
partial sums and merged), ``lens`` (:func:`logit_lens`), ``features`` (SAE features as rows).
"""

from __future__ import annotations

from interp.attribution.direct import (
    COMPONENTS,
    AttributionError,
    TokenError,
    heads_table,
    logit_attribution,
    logit_attribution_batch,
    resolve_token,
    task_attribution,
    top_contributors,
)
from interp.attribution.lens import logit_lens

__all__ = [
    "AttributionError",
    "TokenError",
    "COMPONENTS",
    "heads_table",
    "logit_attribution",
    "logit_attribution_batch",
    "logit_lens",
    "resolve_token",
    "task_attribution",
    "top_contributors",
]
