"""Circuit discovery (layer 3): the graph of writers and readers of the residual stream, and
every edge scored over a task by exact edge patching or a gradient estimate
(docs/discovery.md); circuits found from the scores and evaluated by faithfulness; SAE
features as writers (``feature_edge_scores``)."""

from __future__ import annotations

from interp.foundation.doors import exports, lazy_package

_EXPORTS = exports(
    __name__,
    {
        ".graph": ("EdgeGraph", "Reader", "edge_count", "edge_name", "split_edge"),
        ".scores": ("edge_scores", "METHODS", "SCORE_COLUMNS"),
        ".circuit": ("Circuit", "discover_circuit", "CIRCUIT_METHODS"),
        ".evaluate": ("CircuitEvaluation", "evaluate_circuit", "CURVE_FRACTIONS", "ABLATIONS"),
        ".features": ("feature_edge_scores", "FEATURE_METHODS"),
    },
)

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_package(__name__, _EXPORTS)
