"""Edge discovery under post-norms (Gemma 2): a head writes its ``z W_O`` through the attention
post-norm with its run's scale frozen. The heads of a layer then add up to the layer's normed
attention output, so patching every edge out of all of a layer's heads is patching that output
(plain hooks), and the MLP writer is the normed MLP output."""

from __future__ import annotations

import pytest
import torch

from interp.discovery import EdgeGraph, edge_scores, evaluate_circuit
from interp.discovery.runs import patched_metrics, writer_outputs
from tests.discovery.test_discovery_scores import _task

ATOL = 1e-5  # float32, 2 layers: one patched run computed two ways


@pytest.fixture(scope="module")
def gemma(zoo):
    return zoo.model("gemma2")


def _patched_by_hooks(model, batch, names: list[str]) -> float:
    """The corrupted run with each hook in ``names`` set to its clean value (plain hooks)."""
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.clean, names_filter=lambda n: n in names)
        hooks = [(name, lambda x, hook, v=cache[name]: v) for name in names]
        logits = model.run_with_hooks(batch.corrupted, fwd_hooks=hooks)
    return float(batch.metric()(logits).double().mean())


def test_heads_add_up_to_the_normed_attention_output(gemma):
    batch = _task(gemma).tokens(gemma)
    graph = EdgeGraph.from_model(gemma)
    outputs, _ = writer_outputs(gemma, batch.clean, graph)
    with torch.no_grad():
        _, cache = gemma.run_with_cache(batch.clean)
    for layer in range(graph.n_layers):
        stream = cache[f"blocks.{layer}.hook_resid_mid"] - cache[f"blocks.{layer}.hook_resid_pre"]
        assert torch.allclose(outputs.heads[layer].sum(2), stream, atol=ATOL)
        # one head alone is not the normed output of that head: the scale is the layer's
        z = cache[f"blocks.{layer}.attn.hook_z"][:, :, 0]
        alone = gemma.blocks[layer].ln1_post(z @ gemma.W_O[layer, 0])
        assert not torch.allclose(outputs.heads[layer][:, :, 0], alone, atol=1e-3)


@pytest.mark.parametrize("layer", [0, 1])
def test_every_edge_out_of_a_layers_heads_is_patching_its_attention_output(gemma, layer):
    task = _task(gemma)
    batch = task.tokens(gemma)
    graph = EdgeGraph.from_model(gemma)
    heads = {f"L{layer}H{h}" for h in range(graph.n_heads)}
    run = [(w, r) for w, r in graph.edges if w in heads]
    clean, _ = writer_outputs(gemma, batch.clean, graph)
    corrupted, _ = writer_outputs(gemma, batch.corrupted, graph)
    ours = patched_metrics(gemma, batch, batch.metric(), clean - corrupted, [run])
    expected = _patched_by_hooks(gemma, batch, [f"blocks.{layer}.hook_attn_out"])
    assert float(ours.double().mean()) == pytest.approx(expected, abs=ATOL)


def test_scores_and_circuits_run(gemma):
    task = _task(gemma)
    exact = edge_scores(gemma, task, "exact")
    eap = edge_scores(gemma, task, "eap")
    assert exact["score"].notna().all() and exact["score"].abs().max() > 1e-3
    # the last layer's edges into logits: the map from there on is the final norm only, and
    # EAP is its first-order estimate; they agree in sign where the effect is large
    last = exact[exact["target"] == "logits"].set_index("edge")["score"]
    first = eap.set_index("edge")["score"][last.index]
    big = last.abs() > 0.05
    assert (last[big] * first[big] > 0).all()
    full = evaluate_circuit(gemma, task, list(EdgeGraph.from_model(gemma).edge_names))
    empty = evaluate_circuit(gemma, task, [])
    assert full.faithfulness == pytest.approx(1.0, abs=ATOL)
    assert empty.faithfulness == pytest.approx(0.0, abs=ATOL)
