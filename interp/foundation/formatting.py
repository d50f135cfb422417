"""Text and small HTML for results' ``repr`` and ``_repr_html_``: the bottom of the house.

Result objects (``InductionResult``, ``CachedRun``, ``PathPatchResult``...) of every layer
define ``__repr__`` and ``_repr_html_`` with the helpers here, so this module imports nothing
of interp. The rules they follow:

* **no tensor values**: a tensor is shown by its shape, dtype and size (:func:`tensor_text`),
  never by its numbers (a repr that prints pages of floats hides what was computed);
* **tables are the top rows** of the result's DataFrame (:func:`table_html`), numbers to
  four significant digits (:func:`format_cell`, shared with the report pages);
* **every text from data is escaped** with ``html.escape`` (model names, prompts, token
  strings, column names, cells): a token ``</script><script>...`` shows as those characters.
  The HTML made here holds no script, no style element and no event attribute, so it
  cannot change the notebook around it.

Whole pages shown inline are :mod:`interp.pages.display`'s (presentation).
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

__all__ = [
    "esc",
    "tensor_text",
    "nbytes",
    "megabytes",
    "table_html",
    "summary_html",
    "head_names",
    "grouped_names",
    "number",
    "format_cell",
    "MAX_ROWS",
    "SHOWN",
    "visible_token",
]

MAX_ROWS = 10  # table rows a summary shows; the whole table is one attribute away
_BOX = (
    "font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:13px;"
    "line-height:1.4;max-width:60em"
)
_TABLE = "border-collapse:collapse;font-size:12px;margin:4px 0"
_CELL = "border:1px solid #d0d7de;padding:2px 6px;text-align:{align}"
_HEAD_CELL = _CELL + ";background:#f6f8fa"


SHOWN = {" ": "·", "\n": "⏎", "\t": "⇥"}  # whitespace drawn visibly in token strings


def visible_token(token: str) -> str:
    """A token string with its whitespace drawn (``·`` space, ``⏎`` newline, ``⇥`` tab), as
    every page and table shows tokens: a token of spaces or a newline stays visible, and a
    newline token does not break a line or a CSV cell."""
    return "".join(SHOWN.get(ch, ch) for ch in token)


def esc(text: object) -> str:
    """``text`` as HTML text (``&``, ``<``, ``>``, quotes escaped)."""
    return html.escape(str(text), quote=True)


def nbytes(tensor) -> int:
    """Bytes a tensor holds (0 for None)."""
    if tensor is None:
        return 0
    return int(tensor.numel()) * int(tensor.element_size())


def megabytes(n_bytes: int) -> str:
    """``n_bytes`` in MB (10^6 bytes), to 3 significant digits."""
    return f"{n_bytes / 1e6:.3g} MB"


def _dtype(tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def tensor_text(tensor) -> str:
    """``float32 [1, 4, 12, 12]``: a tensor described by dtype and shape, never its values."""
    if tensor is None:
        return "None"
    return f"{_dtype(tensor)} {list(tensor.shape)}"


def head_names(table: pd.DataFrame) -> list[str]:
    """``L1H0``-style names of a table's ``layer, head`` rows, in its order."""
    return [
        f"L{int(layer)}H{int(head)}"
        for layer, head in zip(table["layer"], table["head"], strict=True)
    ]


_LAYER = re.compile(r"(?<=blocks\.)\d+(?=\.)")


def grouped_names(names: Iterable[str]) -> dict[str, list[int]]:
    """Hook names with the layer taken out: ``blocks.{L}.attn.hook_pattern`` -> its layers,
    in first-seen order (names without a layer map to ``[]``)."""
    groups: dict[str, list[int]] = {}
    for name in names:
        match = _LAYER.search(name)
        key = _LAYER.sub("{L}", name, count=1) if match else name
        layers = groups.setdefault(key, [])
        if match:
            layers.append(int(match.group()))
    return groups


def format_cell(value: object) -> tuple[str, bool]:
    """Cell text and whether it is text (left-aligned) rather than a number; the same text in
    notebook tables and report pages."""
    if value is None or value is pd.NA:
        return "", True  # missing (e.g. no head for an MLP row)
    if isinstance(value, bool):
        return str(value), True
    if pd.api.types.is_float(value):
        v = float(value)
        return ("NaN" if math.isnan(v) else f"{v:.4g}"), False
    if isinstance(value, int) or pd.api.types.is_integer(value):
        return str(int(value)), False
    return str(value), True


def table_html(
    df: pd.DataFrame, *, max_rows: int = MAX_ROWS, columns: Sequence[str] | None = None
) -> str:
    """The first ``max_rows`` rows of ``df`` (optionally only ``columns``) as an escaped HTML
    table, with a line saying how many rows there are in all."""
    shown = df if columns is None else df[[c for c in columns if c in df.columns]]
    head = "".join(
        f'<th style="{_HEAD_CELL.format(align="left")}">{esc(c)}</th>' for c in shown.columns
    )
    rows = []
    for row in shown.head(max_rows).itertuples(index=False, name=None):
        cells = []
        for value in row:
            text, is_text = format_cell(value)
            style = _CELL.format(align="left" if is_text else "right")
            cells.append(f'<td style="{style}">{esc(text)}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    note = (
        f"first {min(max_rows, len(df))} of {len(df)} rows"
        if len(df) > max_rows
        else f"{len(df)} rows"
    )
    return (
        f'<div style="max-width:100%;overflow-x:auto"><table style="{_TABLE}"><thead>'
        f"<tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
        f'<div style="color:#57606a;font-size:12px">{esc(note)}</div>'
    )


def summary_html(
    title: str,
    items: Mapping[str, object] | Sequence[tuple[str, object]],
    *,
    table: str = "",
    table_title: str = "",
) -> str:
    """A titled box: ``items`` as a two-column list of (name, text), then an optional table
    (markup from :func:`table_html`) under ``table_title``. Names and texts are escaped."""
    pairs = items.items() if isinstance(items, Mapping) else items
    lines = "".join(
        f'<tr><th style="text-align:left;padding:1px 12px 1px 0;vertical-align:top;'
        f'font-weight:600">{esc(name)}</th><td style="padding:1px 0;text-align:left">'
        f"{esc(text)}</td></tr>"
        for name, text in pairs
    )
    parts = [
        f'<div style="{_BOX}"><div style="font-weight:700;font-size:14px;'
        f'margin-bottom:4px">{esc(title)}</div>',
        f'<table style="border-collapse:collapse">{lines}</table>',
    ]
    if table:
        if table_title:
            parts.append(f'<div style="font-weight:600;margin-top:6px">{esc(table_title)}</div>')
        parts.append(table)
    parts.append("</div>")
    return "".join(parts)


def number(value: float, digits: int = 4) -> str:
    """A float to ``digits`` significant digits; ``NaN`` for an undefined value."""
    value = float(value)
    return "NaN" if math.isnan(value) else f"{value:.{digits}g}"
