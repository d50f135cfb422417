"""Self-contained, injection-safe HTML reports: headings, text, tables, plotly figures and
CircuitsVis attention views in one file that opens offline, from anywhere.

Safety model (see docs/visualisation.md):

* Every piece of text (titles, captions, table cells, token strings, prompts, model names)
  is *data*. In markup it is ``html.escape``-d; inside ``<script>`` it only ever appears in
  JSON data blocks (``<script type="application/json">``) whose ``<``, ``>``, ``&`` and
  U+2028/U+2029 are written as ``\\u003c``-style escapes, so no string can close the block.
  A data block is never executed: one fixed bootstrap script reads it with ``JSON.parse``.
* The page carries a Content-Security-Policy that allows exactly the page's own scripts (by
  SHA-256 hash) and no network access at all, so even a missed escape could neither run
  script nor send anything anywhere.
* plotly.js and the CircuitsVis bundle are inlined at most once per page, only when a figure
  or an attention view needs them. plotly.js is the official partial "cartesian" bundle
  vendored in ``interp/assets`` (1.5 MB, scatter/bar/heatmap and a few more) when every trace
  on the page is one it has, else the full bundle (4.8 MB) of the installed ``plotly``.
* :func:`write_text_atomic` writes a temporary file beside the target, fsyncs it and renames
  it over the target: an interrupted write leaves the old file (or none), never half a page.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from interp.foundation.files import write_text_atomic
from interp.foundation.formatting import format_cell as _format_cell
from interp.pages.assets import (
    ATTENTION_DECIMALS,
    PLOTLY_PARTIAL_VERSION,
    circuitsvis_js,
    partial_trace_types,
    plotly_js,
    script_json,
)
from interp.pages.assets import csp_hash as _csp_hash
from interp.pages.display import page_iframe
from interp.pages.style import _BOOTSTRAP, _CSP, _PLOTLY_CONFIG, _STYLE
from interp.pages.tokens import token_spans

__all__ = [
    "Report",
    "ATTENTION_DECIMALS",
    "PLOTLY_PARTIAL_VERSION",
    "partial_trace_types",
]


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


@dataclass(frozen=True)
class _Block:
    html: str  # the block's markup (already escaped)
    needs: frozenset[str] = frozenset()  # "plotly" / "circuitsvis"
    traces: frozenset[str] = frozenset()  # plotly trace types drawn
    kind: str = "text"  # heading / text / figure / table / attention (for repr)
    height: int = 30  # rough height in pixels, to size the notebook frame (_repr_html_)


_CAPTION_HEIGHT = 30
TABLE_BOX_HEIGHT = 512  # .interp-table's max-height of 32em, in pixels
# a CircuitsVis AttentionHeads view, plus 7 px per token (measured in Chromium, 1200 px wide)
ATTENTION_HEIGHT = 900
MAX_FRAME_HEIGHT = 1600  # taller pages scroll inside their notebook frame


class Report:
    """One self-contained HTML page built from results. Example::

        report = Report("Induction heads in gpt2")
        report.add_figure(head_heatmap(scores, "induction_score"), caption="per head")
        report.add_table(scores.sort_values("induction_score").tail(10))
        report.write("induction.html")

    Blocks appear in the order they are added. All text is shown as text (escaped).
    """

    def __init__(self, title: str):
        self.title = str(title)
        self._blocks: list[_Block] = []
        self._ids = 0

    def _next_id(self, kind: str) -> str:
        self._ids += 1
        return f"interp-{kind}-{self._ids}"

    def _add_view(
        self,
        kind: str,
        payload: dict,
        caption: str,
        *,
        needs: str,
        traces: frozenset[str] = frozenset(),
        height: int = 450,
    ) -> None:
        """An empty ``div`` and its JSON data block; the bootstrap script draws one into the
        other, so the data is never executed as script."""
        target = self._next_id(kind)
        self._blocks.append(
            _Block(
                f'<figure><div id="{target}" class="interp-{kind}"></div>'
                f'<script type="application/json" data-interp-kind="{kind}" '
                f'data-interp-target="{target}">{script_json(payload)}</script>'
                f"{_caption(caption)}</figure>",
                frozenset({needs}),
                traces,
                kind,
                height + _CAPTION_HEIGHT * bool(caption) + 30,
            )
        )

    def add_heading(self, text: str) -> None:
        self._blocks.append(_Block(f"<h2>{_esc(text)}</h2>", kind="heading", height=50))

    def add_text(self, text: str) -> None:
        """A paragraph of plain text (line breaks kept; never read as markup)."""
        lines = sum(1 + len(line) // 110 for line in str(text).split("\n"))
        self._blocks.append(_Block(f"<p>{_esc(text)}</p>", kind="text", height=20 + 22 * lines))

    def add_warnings(self, title: str, warnings: Sequence[str]) -> None:
        """A boxed list of warnings under a bold title (nothing when ``warnings`` is empty);
        shown as text, never read as markup."""
        if not warnings:
            return
        items = "".join(f"<li>{_esc(w)}</li>" for w in warnings)
        lines = sum(1 + len(w) // 100 for w in warnings)
        self._blocks.append(
            _Block(
                f'<div class="interp-warning" role="alert"><strong>{_esc(title)}</strong>'
                f"<ul>{items}</ul></div>",
                kind="warning",
                height=60 + 24 * lines,
            )
        )

    def add_figure(self, fig, caption: str = "") -> None:
        """A plotly figure, drawn from its JSON as the figure is now (later changes to
        ``fig`` do not show)."""
        import plotly.graph_objects as go
        import plotly.io as pio

        if not isinstance(fig, go.Figure):
            raise TypeError(
                f"add_figure takes a plotly.graph_objects.Figure, got {type(fig).__name__}"
            )
        # plotly's encoder turns numpy arrays, NaN (-> null) and dates into JSON
        figure = json.loads(pio.to_json(fig, validate=False, engine="json"))
        spec = {
            "data": figure.get("data", []),
            "layout": figure.get("layout", {}),
            "config": _PLOTLY_CONFIG,
        }
        traces = frozenset(str(t.get("type", "scatter")) for t in spec["data"])
        height = spec["layout"].get("height") or 450  # plotly's default height
        self._add_view("figure", spec, caption, needs="plotly", traces=traces, height=height)

    def add_table(self, df: pd.DataFrame, caption: str = "", max_rows: int = 50) -> None:
        """A table of ``df``'s first ``max_rows`` rows (numbers to 4 significant digits)."""
        if not isinstance(df, pd.DataFrame):
            raise TypeError(f"add_table takes a pandas DataFrame, got {type(df).__name__}")
        if max_rows < 1:
            raise ValueError(f"max_rows must be at least 1, got {max_rows}")
        shown = df.head(max_rows)
        # an unnamed index (0, 1, 2... or what sorting left of it) means nothing to a reader
        show_index = df.index.name is not None or any(n is not None for n in df.index.names)
        columns = [" / ".join(map(str, c)) if isinstance(c, tuple) else str(c) for c in df.columns]
        if show_index:
            columns = [str(df.index.name or "")] + columns
        head = "".join(f"<th>{_esc(c)}</th>" for c in columns)
        rows = []
        for index, row in zip(shown.index, shown.itertuples(index=False, name=None), strict=True):
            values = ((index,) if show_index else ()) + tuple(row)
            cells = []
            for value in values:
                text, is_text = _format_cell(value)
                cls = ' class="text"' if is_text else ""
                cells.append(f"<td{cls}>{_esc(text)}</td>")
            rows.append("<tr>" + "".join(cells) + "</tr>")
        note = ""
        if len(df) > len(shown):
            note = f'<p class="interp-note">showing the first {len(shown)} of {len(df)} rows</p>'
        self._blocks.append(
            _Block(
                f'<figure><div class="interp-table" tabindex="0"><table><thead><tr>{head}</tr>'
                f"</thead><tbody>{''.join(rows)}</tbody></table></div>{note}{_caption(caption)}"
                "</figure>",
                kind="table",
                height=min(26 * (len(shown) + 1), TABLE_BOX_HEIGHT)
                + 40
                + 25 * bool(note)
                + _CAPTION_HEIGHT * bool(caption),
            )
        )

    def add_tokens(
        self, lines: Sequence[tuple[Sequence[str], Sequence[float], int | None]], caption: str = ""
    ) -> None:
        """Lines of tokens shaded by a value each, ``(tokens, values, marked index)``, on one
        shared scale (the largest value); tokens are shown as text (:mod:`interp.pages.tokens`)."""
        scale = max((max(values, default=0.0) for _, values, _ in lines), default=0.0)
        body = "".join(token_spans(t, v, scale=scale, mark=m) for t, v, m in lines)
        self._blocks.append(
            _Block(
                f"<figure>{body}{_caption(caption)}</figure>",
                kind="tokens",
                height=24 * len(lines) + 40,
            )
        )

    def add_attention(
        self,
        tokens: list[str],
        pattern: Float[Tensor, "head q_pos k_pos"],
        head_names: list[str] | None = None,
        caption: str = "",
    ) -> None:
        """An interactive CircuitsVis view of one layer's (or any heads') attention patterns."""
        pattern = torch.as_tensor(pattern).detach()
        if pattern.ndim != 3:
            raise ValueError(
                f"pattern must be [head, q_pos, k_pos], got shape "
                f"{tuple(pattern.shape)}; pick one batch element and layer"
            )
        n_heads, n_q, n_k = pattern.shape
        tokens = [str(t) for t in tokens]
        if not (n_q == n_k == len(tokens)):
            raise ValueError(
                f"pattern is [head={n_heads}, q_pos={n_q}, k_pos={n_k}] but there "
                f"are {len(tokens)} tokens; they must agree"
            )
        if head_names is None:
            head_names = [f"H{h}" for h in range(n_heads)]
        head_names = [str(h) for h in head_names]
        if len(head_names) != n_heads:
            raise ValueError(f"{len(head_names)} head names for {n_heads} heads")
        values = pattern.to(torch.float64).cpu()
        if not torch.isfinite(values).all():
            raise ValueError(
                "the pattern holds NaN or infinite values; attention weights must be finite"
            )
        props = {
            "attention": values.round(decimals=ATTENTION_DECIMALS).tolist(),
            "tokens": tokens,
            "attentionHeadNames": head_names,
            # grey out the causal mask, unless weights there are non-zero (then show them)
            "maskUpperTri": bool((values.triu(1) == 0).all()),
        }
        self._add_view(
            "attention", props, caption, needs="circuitsvis", height=ATTENTION_HEIGHT + 7 * n_q
        )

    def to_html(self) -> str:
        """The whole page: markup, data blocks, and the scripts it needs, each once."""
        needs = frozenset().union(*(b.needs for b in self._blocks))
        scripts = []
        if "plotly" in needs:
            traces = frozenset().union(*(b.traces for b in self._blocks))
            scripts.append(plotly_js(partial=traces <= partial_trace_types()))
        if "circuitsvis" in needs:
            scripts.append(circuitsvis_js())
        if needs:
            scripts.append(_BOOTSTRAP)
        csp = _CSP.format(hashes=" ".join(_csp_hash(s) for s in scripts) or "'none'")
        parts = [
            '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n',
            f'<meta http-equiv="Content-Security-Policy" content="{_esc(csp)}">\n',
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n',
            '<meta name="generator" content="interp">\n',
            f"<title>{_esc(self.title)}</title>\n<style>\n{_STYLE}\n</style>\n</head>\n",
            f"<body>\n<main>\n<h1>{_esc(self.title)}</h1>\n",
        ]
        parts += [block.html + "\n" for block in self._blocks]
        parts.append("</main>\n")
        parts += [f"<script>{source}</script>\n" for source in scripts]
        parts.append("</body>\n</html>\n")
        return "".join(parts)

    def __repr__(self) -> str:
        counts = [f"{n} {kind}{'s' if n > 1 else ''}" for kind, n in self._kinds().items()]
        return f"Report({self.title!r}: {', '.join(counts) or 'empty'})"

    def _kinds(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for block in self._blocks:
            counts[block.kind] = counts.get(block.kind, 0) + 1
        return counts

    def _repr_html_(self) -> str:
        """The page inline in a notebook: an ``<iframe srcdoc>`` holding :meth:`to_html`
        (escaped), so the page keeps its CSP and runs its scripts, each bundle once, in a
        sandboxed frame of its own (:func:`interp.pages.display.page_iframe`)."""
        height = 120 + sum(block.height for block in self._blocks)
        return page_iframe(self.to_html(), title=self.title, height=min(MAX_FRAME_HEIGHT, height))

    def write(self, path: str | os.PathLike) -> Path:
        """Render and write the page atomically; returns the path written."""
        return write_text_atomic(path, self.to_html())


def _caption(caption: str) -> str:
    return f"<figcaption>{_esc(caption)}</figcaption>" if caption else ""
