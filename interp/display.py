"""How results show themselves in a notebook: a short ``repr`` and a small HTML summary.

The helpers results use live in :mod:`interp.formatting` (the bottom layer, so that results of
every layer can use them) and are re-exported here; this module adds :func:`page_iframe`:

* a whole :class:`interp.html.Report` page is shown in an ``<iframe srcdoc>``: the page keeps
  its own Content-Security-Policy and script hashes, its plotly.js / CircuitsVis bundle is
  inlined once inside that frame, and its scripts run sandboxed (``sandbox="allow-scripts"``:
  no access to the notebook, its cookies or storage).
"""

from __future__ import annotations

from interp.formatting import (
    MAX_ROWS,
    esc,
    grouped_names,
    head_names,
    megabytes,
    nbytes,
    number,
    summary_html,
    table_html,
    tensor_text,
)

__all__ = [
    "esc",
    "tensor_text",
    "nbytes",
    "megabytes",
    "table_html",
    "summary_html",
    "page_iframe",
    "head_names",
    "grouped_names",
    "number",
    "MAX_ROWS",
]


def page_iframe(page: str, *, title: str, height: int) -> str:
    """A whole HTML page shown inline: ``<iframe srcdoc>`` with the page escaped into the
    attribute, sandboxed to run its own scripts only (an opaque origin: it cannot reach the
    notebook). The page's CSP and script hashes keep working inside the frame, also in a
    page not read as UTF-8 (the attribute is ASCII). The frame can be resized by dragging
    its corner."""
    # non-ASCII as character references: the frame gets the page's exact text (and its
    # script hashes still match) whatever encoding the notebook page around it is read in
    srcdoc = esc(page).encode("ascii", "xmlcharrefreplace").decode("ascii")
    return (
        f'<iframe srcdoc="{srcdoc}" sandbox="allow-scripts" title="{esc(title)}" '
        f'style="width:100%;height:{int(height)}px;border:1px solid #d0d7de;'
        f'resize:vertical"></iframe>'
    )
