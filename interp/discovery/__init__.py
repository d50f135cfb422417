"""Circuit discovery (layer 3): the graph of writers and readers of the residual stream, and
every edge scored over a task by exact edge patching or a gradient estimate
(docs/discovery.md); circuits found from the scores and evaluated by faithfulness; SAE
features as writers (``feature_edge_scores``)."""

from __future__ import annotations

from interp.discovery.circuit import CIRCUIT_METHODS, Circuit, discover_circuit
from interp.discovery.evaluate import (
    ABLATIONS,
    CURVE_FRACTIONS,
    CircuitEvaluation,
    evaluate_circuit,
)
from interp.discovery.features import FEATURE_METHODS, feature_edge_scores
from interp.discovery.graph import EdgeGraph, Reader, edge_count, edge_name, split_edge
from interp.discovery.scores import METHODS, SCORE_COLUMNS, edge_scores

__all__ = [
    "EdgeGraph",
    "Reader",
    "edge_count",
    "edge_name",
    "split_edge",
    "edge_scores",
    "METHODS",
    "SCORE_COLUMNS",
    "Circuit",
    "discover_circuit",
    "CIRCUIT_METHODS",
    "CircuitEvaluation",
    "evaluate_circuit",
    "CURVE_FRACTIONS",
    "ABLATIONS",
    "feature_edge_scores",
    "FEATURE_METHODS",
]


# renamed in 0.6.0 (graphs.AttributionGraph is the other graph)
