"""Direct logit attribution: what each component wrote into the residual stream, read through
the final norm and the unembedding, for one prompt, a batch or every row of a task.

Modules, bottom to top: ``residual`` (the residual stream split into components), ``core``
(rows that add up to the logit), ``batch`` and ``task`` (many prompts, task rows with standard
errors), ``shards`` (task attribution split into partial sums and merged), ``direct`` (the
public entry points: :func:`logit_attribution`, :func:`logit_lens`), ``features`` (SAE
features as rows).
"""

from __future__ import annotations

from interp.attribution.direct import (
    COMPONENTS,
    AttributionError,
    TokenError,
    heads_table,
    logit_attribution,
    logit_attribution_batch,
    logit_lens,
    resolve_token,
    top_contributors,
)

__all__ = [
    "AttributionError",
    "TokenError",
    "COMPONENTS",
    "heads_table",
    "logit_attribution",
    "logit_attribution_batch",
    "logit_lens",
    "resolve_token",
    "top_contributors",
]
