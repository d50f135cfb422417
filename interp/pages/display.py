"""How results show themselves in a notebook: a short ``repr`` and a small HTML summary.

The helpers results use live in :mod:`interp.foundation.formatting` (the bottom layer, so that
results of every layer can use them); this module adds :func:`page_iframe`:

* a whole :class:`interp.pages.html.Report` page is shown in an ``<iframe srcdoc>``: the page keeps
  its own Content-Security-Policy and script hashes, its plotly.js / CircuitsVis bundle is
  inlined once inside that frame, and its scripts run sandboxed (``sandbox="allow-scripts"``:
  no access to the notebook, its cookies or storage).
"""

from __future__ import annotations

from interp.foundation.formatting import esc

__all__ = ["page_iframe"]


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
