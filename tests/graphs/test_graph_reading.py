"""What a graph says about its prediction (interp.graphs.reading): hand-made graphs whose
shares are worked out here, the induction pattern's positions, and the page's escaping."""

from __future__ import annotations

import pandas as pd
import torch

from interp.graphs.graph import NODE_COLUMNS, AttributionGraph
from interp.graphs.reading import induction_sources, read_prediction
from interp.pages.graph import graph_page

TOKENS = [0, 7, 8, 9, 7]  # BOS, A B C, A: induction predicts B (8), copied from position 2
STRINGS = ["<bos>", " A", " B", " C", " A"]


def _graph(row: list[float], predicted: int = 8, tokens=TOKENS) -> AttributionGraph:
    """Two features (position 2 and 4), five token nodes and one logit; ``row`` is the logit's
    inputs from the seven sources."""
    nodes = [("feature", 0, 2, 11, tokens[2], 1.0, 0.0), ("feature", 1, 4, 12, tokens[4], 2.0, 0.0)]
    nodes += [("token", -1, p, -1, t, 0.0, 0.0) for p, t in enumerate(tokens)]
    nodes += [("logit", 2, len(tokens) - 1, -1, predicted, 0.0, 0.6)]
    adjacency = torch.zeros(len(nodes), len(nodes))
    adjacency[-1, :-1] = torch.tensor(row)
    return AttributionGraph(
        nodes=pd.DataFrame(nodes, columns=list(NODE_COLUMNS)),
        adjacency=adjacency,
        tokens=torch.tensor(tokens),
        logit_token_ids=torch.tensor([predicted]),
        logit_probabilities=torch.tensor([0.6]),
    )


def test_induction_sources_are_where_the_last_token_was_followed_by_the_prediction():
    assert induction_sources(TOKENS, 8) == [2]
    assert induction_sources([0, 7, 8, 7, 8, 7], 8) == [2, 4]
    assert induction_sources(TOKENS, 9) == []  # C follows B, not A
    assert induction_sources([7, 8, 7], 7) == []  # position 0 has no token before it
    assert induction_sources([0, 7, 7], 7) == []  # the last position is not a source


def test_the_shares_are_the_rows_own():
    # sources: feature@2, feature@4, tokens @0..4; the logit reads 3 from position 2 (feature 2,
    # token 1), 1.5 from position 4 (feature -1, token 0.5) and 0.5 from BOS: 3 / 5 and 1.5 / 5
    lines = read_prediction(_graph([2.0, -1.0, 0.5, 0.0, 1.0, 0.0, 0.5]), STRINGS, [" B"])
    assert lines[0] == "The model predicts ' B' (p = 0.60)."
    assert lines[1].startswith("Its strongest direct inputs: layer-0 feature 11 at position 2")
    assert "layer-1 feature 12 at position 4 (' A') (-1.00)" in lines[1]
    assert "induction step: ' A' was followed by ' B' at position 2" in lines[2]
    assert "60% comes from position 2" in lines[2] and "30% from the last position" in lines[2]


def test_no_pattern_no_induction_and_a_zero_row_is_said():
    lines = read_prediction(_graph([1.0, 0, 0, 0, 0, 0, 0], predicted=9), STRINGS, [" C"])
    assert lines[-1].startswith("Not an induction step: ' C' never follows")
    lines = read_prediction(_graph([0.0] * 7), STRINGS, [" B"])
    assert lines[-1].startswith("Nothing in the graph feeds this logit directly")


def test_hostile_strings_stay_text_on_the_page():
    hostile = ["<bos>", "<script>alert(1)</script>", " B", " C", "<script>alert(1)</script>"]
    lines = read_prediction(_graph([1.0, 1.0, 0, 0, 0, 0, 0]), hostile, ["</li><img src=x>"])
    data = {"nodes": [], "links": [], "metadata": {}, "qParams": {}}
    page = graph_page(data, {}, title="t", n_layers=2, info=[], reading=lines)
    assert "What the graph says" in page
    assert "<script>alert" not in page and "<img src=x>" not in page
    assert "&lt;/li&gt;&lt;img src=x&gt;" in page
