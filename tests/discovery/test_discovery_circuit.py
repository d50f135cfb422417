"""Circuits (interp/discovery/circuit.py) and their faithfulness (evaluate.py): the full graph
gives exactly 1 and the empty circuit exactly 0, the empty circuit's run is the corrupted run,
removing edges agrees with plain hooks (tests/edge_oracle.py) and with patching whole
components, the ground-truth circuits give 1, the MIB curve and its areas are what they say,
and budgets change no number."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
import torch

from interp.discovery import (
    CURVE_FRACTIONS,
    Circuit,
    EdgeGraph,
    discover_circuit,
    edge_scores,
    evaluate_circuit,
)
from interp.discovery.evaluate import curve_sizes, ranked_edges
from tests.circuit_models import TRUE_EDGES, chain_model
from tests.discovery.test_discovery_scores import _task
from tests.edge_oracle import head_output, replace_edges
from tests.zoo import attn_only_model

ATOL = 1e-5  # float32, 2 layers: one run computed two ways, in metric units
ARCHS = ["gpt2", "llama", "gpt_neox_parallel", "gptj"]  # plain, GQA, parallel, shared norm


def _metric(batch, logits) -> torch.Tensor:
    return batch.metric()(logits).float()


@pytest.mark.parametrize("arch", ARCHS)
def test_full_graph_is_one_and_empty_circuit_is_zero_exactly(zoo, arch):
    model = zoo.model(arch)
    task = _task(model, rows=3)
    batch = task.tokens(model)
    names = EdgeGraph.from_model(model).edge_names
    for ablation in ("patch", "mean", "zero"):
        full = evaluate_circuit(model, task, names, ablation=ablation)
        empty = evaluate_circuit(model, task, [], ablation=ablation)
        assert full.faithfulness == 1.0 and empty.faithfulness == 0.0, ablation
        assert (full.per_row["faithfulness"] == 1.0).all()
        assert (empty.per_row["faithfulness"] == 0.0).all()
        assert (full.n_edges, empty.n_edges, full.n_total) == (len(names), 0, len(names))
    # every edge removed with corrupted senders: every reader reads the corrupted stream
    empty = evaluate_circuit(model, task, [], ablation="patch")
    with torch.no_grad():
        corrupted = _metric(batch, model(batch.corrupted))
        clean = _metric(batch, model(batch.clean))
    assert np.abs(empty.per_row["empty_metric"].to_numpy() - corrupted.numpy()).max() < ATOL
    # the model's own metric comes from run_logits (no KV cache, the engine's mask) and here from
    # a plain call: the same model by two code paths, so float32 rounding apart, not bits
    # (5.96e-7 seen on gptj; bits held on some machines and not on others)
    assert np.abs(empty.per_row["model_metric"].to_numpy() - clean.numpy()).max() < ATOL
    assert list(empty.per_row.columns) == [
        "row",
        "circuit_metric",
        "empty_metric",
        "model_metric",
        "faithfulness",
    ]


@pytest.mark.parametrize("arch", ARCHS)
def test_removing_layer_0_inputs_is_patching_layer_0(zoo, arch):
    """Every edge into layer 0's readers removed: layer 0 reads only the corrupted embedding,
    so it is the clean run with layer 0's head outputs (z) and MLP output patched from the
    corrupted run; later layers still read the clean embedding."""
    model = zoo.model(arch)
    task = _task(model, seed=1, rows=3)
    batch = task.tokens(model)
    graph = EdgeGraph.from_model(model)
    layer_0 = {str(r) for r in graph.readers if r.layer == 0}
    kept = [
        e for e, (_, r) in zip(graph.edge_names, graph.edges, strict=True) if str(r) not in layer_0
    ]
    ours = evaluate_circuit(model, task, kept).per_row["circuit_metric"].to_numpy()
    names = ["blocks.0.attn.hook_z", "blocks.0.hook_mlp_out"]
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.corrupted, names_filter=lambda n: n in names)
        hooks = [(n, lambda act, hook, n=n: cache[n]) for n in names]
        theirs = _metric(batch, model.run_with_hooks(batch.clean, fwd_hooks=hooks))
    assert np.abs(ours - theirs.numpy()).max() < ATOL


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("ablation", ["mean", "zero"])
def test_removing_embed_is_replacing_the_embedding(zoo, arch, ablation):
    """Every edge out of ``embed`` removed: every reader reads the mean (or zero) embedding,
    which is the clean run with the stream entering block 0 replaced."""
    model = zoo.model(arch)
    task = _task(model, seed=2, rows=3)
    batch = task.tokens(model)
    graph = EdgeGraph.from_model(model)
    kept = [e for e in graph.edge_names if not e.startswith("embed->")]
    ours = evaluate_circuit(model, task, kept, ablation=ablation).per_row["circuit_metric"]
    name = "blocks.0.hook_resid_pre"
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.clean, names_filter=[name])
        stream = cache[name]
        value = stream[batch.mask].mean(0) if ablation == "mean" else torch.zeros_like(stream[0, 0])
        hook = (name, lambda act, hook: value.expand_as(act).clone())
        theirs = _metric(batch, model.run_with_hooks(batch.clean, fwd_hooks=[hook]))
    assert np.abs(ours.to_numpy() - theirs.numpy()).max() < ATOL


@pytest.mark.parametrize("ablation", ["patch", "mean", "zero"])
def test_random_circuits_agree_with_plain_hooks(ablation):
    """An attention-only model without norms: removing edges with plain hooks
    (``replace_edges``, sender values from the corrupted run, their mean or zero)."""
    model = attn_only_model(normalization_type=None)
    task = _task(model, seed=3, rows=4)
    batch = task.tokens(model)
    names = list(EdgeGraph.from_model(model).edge_names)
    rng = random.Random(0)
    spread = 0.0
    with torch.no_grad():
        hooks = ["hook_embed", "hook_pos_embed"] + [
            f"blocks.{lay}.attn.hook_z" for lay in range(int(model.cfg.n_layers))
        ]
        _, clean = model.run_with_cache(batch.clean, names_filter=hooks)
        _, corrupted = model.run_with_cache(batch.corrupted, names_filter=hooks)

        def out(cache, sender):
            if sender == "embed":
                return cache["hook_embed"] + cache["hook_pos_embed"]
            layer, head = (int(x) for x in sender[1:].split("H"))
            return head_output(model, cache, layer, head)

        def value(sender):
            if ablation == "patch":
                return out(corrupted, sender)
            if ablation == "zero":
                return torch.zeros(int(model.cfg.d_model))
            return out(clean, sender)[batch.mask].mean(0)

        for size in (5, len(names) // 3, len(names) // 2):
            circuit = rng.sample(names, size)
            removed = [e for e in names if e not in circuit]
            theirs = _metric(batch, replace_edges(model, batch.clean, value, removed))
            ours = evaluate_circuit(model, task, circuit, ablation=ablation).per_row
            assert np.abs(ours["circuit_metric"].to_numpy() - theirs.numpy()).max() < ATOL, size
            apart = min(
                np.abs(ours["circuit_metric"] - ours[side]).max()
                for side in ("model_metric", "empty_metric")
            )
            spread = max(spread, apart)
    assert spread > 200 * ATOL  # not vacuous: a circuit's run is neither the model nor empty


@pytest.mark.parametrize("saturated", [False, True], ids=["chain", "saturated"])
def test_true_circuit_is_faithful_and_each_true_edge_is_needed(saturated):
    model, task, true_edges = chain_model(saturated=saturated)
    result = evaluate_circuit(model, task, true_edges)
    assert result.faithfulness == pytest.approx(1.0, abs=1e-5)
    assert np.abs(result.per_row["faithfulness"] - 1.0).max() < 1e-5
    for dropped in true_edges:
        less = evaluate_circuit(model, task, [e for e in true_edges if e != dropped])
        assert less.faithfulness < 0.5, dropped  # measured: 0 (the chain is broken)


def test_discover_circuit_top_n_and_threshold():
    model, task, _ = chain_model()
    scores = edge_scores(model, task, "exact")
    top = discover_circuit(model, task, "exact", top_n=3)
    assert isinstance(top, Circuit) and top.method == "exact"
    assert set(top.edges) == set(TRUE_EDGES) and len(top) == 3
    assert top.params == {"metric": "logit_diff", "top_n": 3}
    graph_order = list(EdgeGraph.from_model(model).edge_names)
    assert list(top.edges) == [e for e in graph_order if e in TRUE_EDGES]
    assert list(top.scores.columns) == ["edge", "source", "target", "score", "in_circuit"]
    assert np.array_equal(top.scores["score"], scores["score"])
    assert set(top.scores.loc[top.scores["in_circuit"], "edge"]) == set(TRUE_EDGES)
    by_threshold = discover_circuit(model, task, "exact", threshold=0.5)
    assert set(by_threshold.edges) == set(scores.loc[scores["score"].abs() >= 0.5, "edge"])
    assert set(by_threshold.edges) == set(TRUE_EDGES)
    ig = discover_circuit(model, task, "eap-ig", top_n=3, ig_steps=3)
    assert ig.params == {"metric": "logit_diff", "ig_steps": 3, "top_n": 3}
    assert set(ig.edges) == set(TRUE_EDGES)
    assert evaluate_circuit(model, task, ig).faithfulness == pytest.approx(1.0, abs=1e-5)


def test_ranking_is_by_absolute_score_then_graph_order():
    graph = EdgeGraph(n_layers=1, n_heads=1, n_kv_heads=1, mlps=False)  # 5 edges
    names = list(graph.edge_names)
    frame = pd.DataFrame({"edge": names[::-1], "score": [0.1, -0.5, 0.2, 0.2, -0.2]})
    # reversed names: scores by edge are names[4]=0.1, [3]=-0.5, [2]=0.2, [1]=0.2, [0]=-0.2
    assert ranked_edges(frame, graph) == [names[3], names[0], names[1], names[2], names[4]]


def test_bad_input_is_refused():
    model, task, _ = chain_model()
    with pytest.raises(ValueError, match="exactly one of top_n"):
        discover_circuit(model, task, "eap")
    with pytest.raises(ValueError, match="exactly one of top_n"):
        discover_circuit(model, task, "eap", top_n=3, threshold=0.1)
    with pytest.raises(ValueError, match="method must be one of"):
        discover_circuit(model, task, "greedy", top_n=3)
    with pytest.raises(ValueError, match="more than the graph"):
        discover_circuit(model, task, "eap", top_n=1000)
    with pytest.raises(ValueError, match="not in this model's graph"):
        evaluate_circuit(model, task, ["L0H0->L9H9.q"])
    with pytest.raises(ValueError, match="ablation must be one of"):
        evaluate_circuit(model, task, TRUE_EDGES, ablation="resample")
    same = type(task).from_records(
        [{**record, "corrupted": record["clean"]} for record in task.to_records()]
    )
    with pytest.raises(ValueError, match="NaN"):  # clean == corrupted: scores undefined
        discover_circuit(model, same, "eap", top_n=3)


def test_curve_and_its_areas():
    model, task, _ = chain_model()
    scores = edge_scores(model, task, "exact")
    result = evaluate_circuit(model, task, TRUE_EDGES, scores=scores)
    curve = result.curve
    n_total = len(scores)
    assert list(curve.columns) == ["fraction", "n_edges", "faithfulness"]
    assert tuple(curve["fraction"]) == CURVE_FRACTIONS
    assert (
        list(curve["n_edges"])
        == curve_sizes(n_total)
        == [max(1, round(f * n_total)) for f in CURVE_FRACTIONS]
    )
    assert curve["faithfulness"].iloc[-1] == 1.0  # every edge: exactly the full model
    # each point is the circuit of the top edges, evaluated on its own
    ranked = ranked_edges(scores, EdgeGraph.from_model(model))
    for n, f in zip(curve["n_edges"], curve["faithfulness"], strict=True):
        alone = evaluate_circuit(model, task, ranked[:n]).faithfulness
        assert f == pytest.approx(alone, abs=1e-6), n
    x, f = list(CURVE_FRACTIONS), list(curve["faithfulness"])
    area = sum((x[i + 1] - x[i]) * (f[i] + f[i + 1]) / 2 for i in range(len(x) - 1))
    gap = sum(
        (x[i + 1] - x[i]) * (abs(1 - f[i]) + abs(1 - f[i + 1])) / 2 for i in range(len(x) - 1)
    )
    assert result.cpr == pytest.approx(area, abs=1e-12)
    assert result.cmd == pytest.approx(gap, abs=1e-12)
    assert 0 < result.cmd < result.cpr  # not vacuous: the first points (1 edge) are below 1
    assert evaluate_circuit(model, task, TRUE_EDGES).curve is None  # no scores, no curve


def test_budgets_change_no_number(zoo, monkeypatch):
    import interp.engine.batched as batched  # the engine's one call of the model for these runs

    model = zoo.model("llama")
    task = _task(model, seed=4, rows=4)
    scores = edge_scores(model, task, "eap")
    circuit = discover_circuit(model, task, "eap", top_n=30)
    batches: list[int] = []

    def counted(model, tokens, *args, **kwargs):
        batches.append(int(tokens.shape[0]))
        return forward(model, tokens, *args, **kwargs)

    forward = batched.forward
    monkeypatch.setattr(batched, "forward", counted)
    whole = evaluate_circuit(model, task, circuit, scores=scores)
    # each distinct circuit but the full graph (the clean run), and the empty circuit
    n_runs = len({*curve_sizes(whole.n_total), whole.n_edges} - {whole.n_total}) + 1
    assert batches == [n_runs * 4]  # every run in one pass by default
    span = abs(whole.per_row["model_metric"].mean() - whole.per_row["empty_metric"].mean())
    for split in ({"max_rows": 3}, {"max_rows": 1}, {"max_bytes": "3MB"}):
        batches.clear()
        part = evaluate_circuit(model, task, circuit, scores=scores, **split)
        assert len(batches) > 1 and sum(batches) == n_runs * 4, (split, batches)
        # f = (c - e) / (m - e): metric errors of ATOL move f by at most this much
        f = np.array([whole.faithfulness, *whole.curve["faithfulness"]])
        got = np.array([part.faithfulness, *part.curve["faithfulness"]])
        assert (np.abs(got - f) <= ATOL * (1 + np.abs(f) + np.abs(1 - f)) / span).all(), split
        got, want = part.per_row["circuit_metric"], whole.per_row["circuit_metric"]
        assert np.abs(got - want).max() < ATOL, split
