"""Many prompts in one call: ``attribution_graph(model, [p1, p2, ...], tc)`` returns each
prompt's own graph (equal to the graph of that prompt alone), checks every prompt before it
builds any, and converts the transcoders once."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from interp.graphs.attribute import attribution_graph
from interp.graphs.graph import AttributionGraph
from interp.graphs.many import graphs_of_prompts, many_prompts
from tests.transcoder_folders import random_transcoders

PROMPTS = ["a b c a b", "the cat sat on the mat and the cat", torch.tensor([0, 5, 17, 230, 5])]


@pytest.fixture(scope="module")
def tc(gpt2_model):
    return random_transcoders(gpt2_model, d_tc=32)


def _same(got: AttributionGraph, want: AttributionGraph) -> None:
    # the same operations on the same inputs: bit-equal
    pd.testing.assert_frame_equal(got.nodes, want.nodes)
    assert torch.equal(got.adjacency, want.adjacency)
    assert torch.equal(got.tokens, want.tokens)
    assert torch.equal(got.logit_token_ids, want.logit_token_ids)
    assert torch.equal(got.logit_probabilities, want.logit_probabilities)
    assert got.scores() == want.scores()


@pytest.mark.parametrize("cap", [None, 6])
def test_each_graph_equals_the_graph_of_its_prompt_alone(gpt2_model, tc, cap):
    graphs = attribution_graph(gpt2_model, PROMPTS, tc, max_feature_nodes=cap, batch_size=8)
    assert isinstance(graphs, list) and len(graphs) == len(PROMPTS)
    for prompt, graph in zip(PROMPTS, graphs, strict=True):
        _same(graph, attribution_graph(gpt2_model, prompt, tc, max_feature_nodes=cap, batch_size=8))
    lengths = [len(g.tokens) for g in graphs]
    assert len(set(lengths)) == 3  # prompts of different lengths, each its own graph


def test_one_prompt_is_still_one_graph(gpt2_model, tc):
    assert not many_prompts([0, 5, 17]) and not many_prompts("a b") and not many_prompts([])
    assert many_prompts(["a b"]) and many_prompts([[0, 5, 17]])
    one = attribution_graph(gpt2_model, [0, 5, 17], tc)  # a flat list of ids is one prompt
    assert isinstance(one, AttributionGraph)
    (listed,) = attribution_graph(gpt2_model, [[0, 5, 17]], tc)
    _same(listed, one)


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        (["a b c", "   "], "prompt 1 is blank"),
        (["a b c", torch.tensor([7])], "prompt 1 has 1 token"),
        (["a b c", [1, 99999]], "prompt 1: "),
        ([torch.zeros(2, 4, dtype=torch.long)], "prompt 0 has 2 rows"),
        (
            ["a b c", " ".join(["a"] * 80)],
            "prompt 1: prompt has 81 tokens but the model's context",
        ),
    ],
)
def test_every_prompt_is_checked_before_any_graph_is_built(gpt2_model, tc, prompts, message):
    built = []
    with pytest.raises(ValueError, match=message):
        graphs_of_prompts(lambda *a, **k: built.append(a), gpt2_model, prompts, tc)
    assert built == []


def test_the_transcoders_are_checked_and_converted_once(gpt2_model, tc):
    seen = []
    half = tc.to(dtype=torch.bfloat16)
    graphs_of_prompts(lambda m, t, tc, **k: seen.append(tc), gpt2_model, PROMPTS, half)
    assert len(seen) == 3 and all(s is seen[0] for s in seen)  # one conversion for all
    assert seen[0].dtype == torch.float32 and half.dtype == torch.bfloat16  # given set untouched


def test_the_value_path_weights_are_read_once_for_all_prompts(gpt2_model, tc, monkeypatch):
    from interp.graphs import frozen

    reads = []
    real = frozen.value_path_weights

    def counted(model, n_layers):
        reads.append(n_layers)
        return real(model, n_layers)

    monkeypatch.setattr(frozen, "value_path_weights", counted)
    graphs = attribution_graph(gpt2_model, PROMPTS, tc, batch_size=8)
    assert len(reads) == 1 and frozen.value_path_weights is counted  # read once, then restored
    for prompt, graph in zip(PROMPTS, graphs, strict=True):
        _same(graph, attribution_graph(gpt2_model, prompt, tc, batch_size=8))
    assert len(reads) == 1 + len(PROMPTS)  # one read per single-prompt graph
