"""Scripts a page inlines, made safe to inline: JSON data blocks and the JS bundles.

``<``, ``>``, ``&``, U+2028 and U+2029 in JSON become ``\\u003c``-style escapes, so no string
can close its ``<script>`` element; a bundle's own ``</script`` text becomes ``<\\/script``.
plotly.js is the official partial "cartesian" bundle vendored in ``interp/assets`` when every
trace on a page is one it has, else the full bundle of the installed ``plotly``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
from pathlib import Path

__all__ = [
    "script_json",
    "plotly_js",
    "partial_trace_types",
    "circuitsvis_js",
    "csp_hash",
    "PLOTLY_PARTIAL_VERSION",
    "ATTENTION_DECIMALS",
]

# the official partial bundle, unmodified (see interp/assets/README.md)
PLOTLY_PARTIAL = Path(__file__).parents[1] / "assets" / "plotly-cartesian.min.js"
PLOTLY_PARTIAL_VERSION = "4.1.1"  # version of the vendored partial plotly.js bundle
_TRACE_MODULE = re.compile(r'moduleType:"trace",name:"(\w+)"')

# attention weights are shown as colours and hover values, which resolve far less than 1e-4;
# 4 decimals keep a 12-head, 128-token layer at ~1.2 MB of JSON instead of ~2.8 MB
ATTENTION_DECIMALS = 4

# characters that could end a <script> element, open an HTML comment, or end a JS string
# in older parsers; in JSON they can only occur inside strings, where \uXXXX means the same
_SCRIPT_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
_SCRIPT_ESCAPE_TABLE = str.maketrans(_SCRIPT_ESCAPES)
_END_SCRIPT = re.compile(r"</(script)", re.IGNORECASE | re.ASCII)


def script_json(value) -> str:
    """JSON text that is safe anywhere inside a ``<script>`` element (and in JS source).

    ``json.dumps`` leaves ``</script>`` as it is; here ``<``, ``>``, ``&``, U+2028 and U+2029
    become ``\\u003c``-style escapes, which JSON (and JS) read back as the same characters.
    Non-finite numbers raise ``ValueError`` (JSON has none).
    """
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.translate(_SCRIPT_ESCAPE_TABLE)


def _inline_script(source: str) -> str:
    """A JS library's source made safe to inline: no ``</script`` can end the element early.

    ``<\\/script`` means the same inside JS strings, regexes and comments, where such text
    occurs in bundles (CircuitsVis has ``innerHTML="<script></script>"``). Source-map
    comments are dropped: the map is not shipped and browsers would try to fetch it.
    """
    out = []
    for line in source.splitlines(keepends=True):
        if line.startswith("//# sourceMappingURL="):
            continue
        out.append(line)
    text = "".join(out)
    if "<!--" in text:
        # with "<script" after it, "<!--" would make the parser swallow the real </script>;
        # neither bundle has one today, and no rewrite of it is valid JS everywhere
        raise ValueError("a script to inline contains '<!--'; it cannot be inlined safely")
    # HTML matches tag names ASCII-case-insensitively: so does re.I with re.A
    return _END_SCRIPT.sub(lambda m: "<\\/" + m.group(1), text)


@functools.cache
def plotly_js(partial: bool = False) -> str:
    """plotly.js ready to inline: the vendored partial bundle (``partial=True``) or the full
    one shipped in the installed plotly package."""
    if not partial:
        from plotly.offline import get_plotlyjs

        return _inline_script(get_plotlyjs())
    if not PLOTLY_PARTIAL.is_file():
        raise FileNotFoundError(
            f"the vendored plotly.js bundle is missing at {PLOTLY_PARTIAL}; reinstall interp"
        )
    return _inline_script(PLOTLY_PARTIAL.read_text(encoding="utf-8"))


@functools.cache
def partial_trace_types() -> frozenset[str]:
    """The trace types the vendored partial plotly.js bundle registers (read from it)."""
    if not PLOTLY_PARTIAL.is_file():
        return frozenset()
    return frozenset(_TRACE_MODULE.findall(PLOTLY_PARTIAL.read_text(encoding="utf-8")))


@functools.cache
def circuitsvis_js() -> str:
    """The CircuitsVis browser bundle (``dist/cdn/iife.js``) that ``RenderedHTML.local_src``
    inlines, read once from the installed package and made safe to inline."""
    import circuitsvis

    bundle = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"
    if not bundle.is_file():
        raise FileNotFoundError(
            f"the CircuitsVis bundle is missing at {bundle}; reinstall "
            "circuitsvis (pip install --force-reinstall circuitsvis)"
        )
    return _inline_script(bundle.read_text(encoding="utf-8"))


def csp_hash(source: str) -> str:
    """The Content-Security-Policy source allowing exactly this inline script (its SHA-256)."""
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"
