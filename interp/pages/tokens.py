"""Token strings shaded by a value, as escaped HTML: the markup of ``Report.add_tokens``.

Each token is ``html.escape``-d text inside a ``<span>``; its background is computed from the
number alone (an orange of opacity ``value / max``), so nothing of the token reaches an
attribute. Whitespace is shown (``·`` for a space, ``⏎`` for a newline) so that tokens made of
it stay visible.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from interp.foundation.formatting import visible_token

__all__ = ["token_spans"]

_shown = visible_token  # whitespace drawn visibly, as the tables show it too


def token_spans(
    tokens: Sequence[str], values: Sequence[float], *, scale: float, mark: int | None = None
) -> str:
    """One line of token spans, each shaded by ``value / scale`` (clipped to [0, 1]) with its
    value as a tooltip; ``mark``: the index of a token drawn with an outline."""
    if len(tokens) != len(values):
        raise ValueError(f"{len(tokens)} tokens but {len(values)} values")
    parts = []
    for i, (token, value) in enumerate(zip(tokens, values, strict=True)):
        alpha = 0.0 if not scale > 0 else min(1.0, max(0.0, float(value) / scale))
        outline = " outline: 1px solid #1f2328;" if i == mark else ""
        parts.append(
            f'<span class="interp-token" title="{float(value):.3f}" '
            f'style="background: rgba(255, 140, 0, {alpha:.3f});{outline}">'
            f"{html.escape(_shown(str(token)), quote=True)}</span>"
        )
    return '<div class="interp-tokens">' + "".join(parts) + "</div>"
