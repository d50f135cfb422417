"""ACDC (interp/discovery/acdc.py): the batched, speculative pruning is the plain sequential
algorithm decision for decision (against a sequential ACDC written here with plain hooks, and
the pruning loop against a plain loop on a made-up metric), it finds exactly the true edges of
the ground-truth models, its circuit evaluates to what its scores say, it runs on every
architecture, budgets change nothing, and bad input is refused."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from interp.discovery import EdgeGraph, discover_circuit, edge_scores, evaluate_circuit
from interp.discovery.acdc import ACDC_COLUMNS, acdc, acdc_order, prune
from tests.circuit_models import TRUE_EDGES, chain_model
from tests.discovery.test_discovery_scores import _task
from tests.edge_oracle import _writer, replace_edges
from tests.zoo import ZOO_ARCHS, attn_only_model

ATOL = 1e-5  # float32, 2 layers: one run computed two ways, in score units


def _plain_prune(order, metric_of, start, span, threshold):
    """ACDC as written in the paper: one edge at a time against the current state."""
    removed, current, scores = [], start, {}
    for edge in order:
        value = metric_of([*removed, edge])
        scores[edge] = (current - value) / span
        if abs(scores[edge]) <= threshold:
            removed.append(edge)
            current = value
    return removed, scores, current


def _made_up_metric(n_edges: int, seed: int):
    """A nonlinear metric of the set of removed edges (order-free), with interactions."""
    rng = random.Random(seed)
    sizes = [0.0, 0.0, 1e-3, 0.02, 0.3, 1.0]
    weight = [rng.choice(sizes) * rng.choice([-1, 1]) for _ in range(n_edges)]
    pairs = [(rng.randrange(n_edges), rng.randrange(n_edges)) for _ in range(n_edges // 3)]

    def metric_of(state) -> float:
        gone = set(state)
        linear = math.fsum(weight[e] for e in sorted(gone))
        coupled = math.fsum(0.5 for a, b in pairs if a in gone and b in gone)
        return 3.0 * math.tanh(1.0 - linear - coupled)

    return metric_of


@pytest.mark.parametrize("seed", range(6))
def test_the_speculative_loop_is_the_plain_loop(seed):
    order = list(range(60))
    metric_of = _made_up_metric(len(order), seed)
    start, span = metric_of([]), 2.0
    expected = _plain_prune(order, metric_of, start, span, 0.01)
    calls = []
    for window in (1, 2, 7, 32, 1000):
        removed, scores, final, n_calls, n_states = prune(
            order, lambda states: [metric_of(s) for s in states], start, span, 0.01, window=window
        )
        assert (removed, scores, final) == expected, window  # exact: same states, same values
        assert n_states >= len(order) and n_calls <= n_states
        calls.append(n_calls)
    assert calls[0] == len(order)  # window 1: one state per call, the plain loop
    assert 0 < len(expected[0]) < len(order)  # some edges kept, some removed: not vacuous


def _order_by_hand(model) -> list[str]:
    """ACDC's order for an attention-only model, written out: logits, then layer by layer
    down, each layer's v, k, q readers from the last head; each reader's writers from the
    last head back to embed."""
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)

    def writers_before(layer):
        return ["embed"] + [f"L{lay}H{h}" for lay in range(layer) for h in range(n_heads)]

    order = [f"{w}->logits" for w in reversed(writers_before(n_layers))]
    for layer in reversed(range(n_layers)):
        for which in "vkq":
            for h in reversed(range(n_heads)):
                order += [f"{w}->L{layer}H{h}.{which}" for w in reversed(writers_before(layer))]
    return order


def test_acdc_is_sequential_acdc_with_plain_hooks():
    model = attn_only_model(normalization_type=None)  # no norm: tests/edge_oracle.py applies
    task = _task(model, seed=3, rows=4)
    batch = task.tokens(model)
    order = _order_by_hand(model)
    assert order == [f"{w}->{r}" for w, r in acdc_order(EdgeGraph.from_model(model))]
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.corrupted)

        def metric_of(edges) -> float:
            logits = replace_edges(model, batch.clean, lambda s: _writer(model, cache, s), edges)
            return float(batch.logit_diff(logits).double().mean())

        c = float(batch.logit_diff(model(batch.clean)).double().mean())
        k = float(batch.logit_diff(model(batch.corrupted)).double().mean())
        threshold = 0.02
        removed, scores, final = _plain_prune(order, metric_of, c, c - k, threshold)
    frame = acdc(model, task, threshold=threshold)
    assert list(frame.columns) == ACDC_COLUMNS
    ours = frame.set_index("edge")
    assert np.abs(ours.loc[order, "score"].to_numpy() - [scores[e] for e in order]).max() < ATOL
    assert set(ours.index[~ours["in_circuit"]]) == set(removed)
    assert abs(frame.attrs["circuit_metric"] - final) < ATOL * abs(c - k)
    # decisions are not on a knife edge, and the circuit is neither empty nor everything
    assert min(abs(abs(s) - threshold) for s in scores.values()) > 1e-4
    assert 5 < len(removed) < len(order) - 5
    assert frame.attrs["calls"] < len(order) / 2  # batched: fewer calls than edges


@pytest.mark.parametrize("saturated", [False, True], ids=["chain", "saturated"])
def test_acdc_finds_exactly_the_true_edges(saturated):
    model, task, true_edges = chain_model(saturated=saturated)
    frame = acdc(model, task, threshold=1e-3)
    kept = frame.loc[frame["in_circuit"], "edge"]
    assert tuple(kept) == true_edges == TRUE_EDGES
    # every true edge is tried after its downstream ones are kept: it loses everything
    assert np.allclose(frame.set_index("edge").loc[list(true_edges), "score"], 1.0, atol=ATOL)
    circuit = discover_circuit(model, task, "acdc", threshold=1e-3)
    assert circuit.edges == true_edges and circuit.method == "acdc"
    assert circuit.params == {"metric": "logit_diff", "threshold": 1e-3}
    assert circuit.scores.equals(frame)
    assert edge_scores(model, task, "acdc", threshold=1e-3).equals(frame)
    assert evaluate_circuit(model, task, circuit).faithfulness == pytest.approx(1.0, abs=ATOL)


def _consistent(model, task, frame) -> float:
    """The circuit's faithfulness (patch ablation), checked against the telescoping identity
    ``f = 1 - sum(score of the removed edges)`` (m(M) = C exactly, m(empty) = K to float)."""
    kept = list(frame.loc[frame["in_circuit"], "edge"])
    result = evaluate_circuit(model, task, kept)
    removed_sum = float(frame.loc[~frame["in_circuit"], "score"].sum())
    assert abs(result.faithfulness - (1.0 - removed_sum)) < ATOL * max(1.0, abs(removed_sum))
    if 0 < len(kept) < len(frame):  # the circuit's own run: ACDC's final state
        measured = float(result.per_row["circuit_metric"].mean())
        span = frame.attrs["clean_metric"] - frame.attrs["corrupted_metric"]
        assert abs(measured - frame.attrs["circuit_metric"]) < ATOL * max(1.0, abs(span))
    return result.faithfulness


def test_threshold_zero_keeps_every_edge_that_moves_and_a_huge_one_none(zoo):
    model = zoo.model("gpt2")
    task = _task(model, seed=4, rows=3)
    zero = acdc(model, task, threshold=0)
    assert (zero.loc[~zero["in_circuit"], "score"] == 0).all()
    assert (zero.loc[zero["in_circuit"], "score"] != 0).all()
    assert _consistent(model, task, zero) == pytest.approx(1.0, abs=ATOL)
    huge = acdc(model, task, threshold=1e9)
    assert not huge["in_circuit"].any()
    assert _consistent(model, task, huge) == 0.0  # the empty circuit, exactly
    span = huge.attrs["clean_metric"] - huge.attrs["corrupted_metric"]
    assert abs(huge.attrs["circuit_metric"] - huge.attrs["corrupted_metric"]) < ATOL * abs(span)
    middle = acdc(model, task, threshold=0.05)
    f = _consistent(model, task, middle)
    n_removed = int((~middle["in_circuit"]).sum())
    assert abs(1.0 - f) <= n_removed * 0.05  # each removal moves the metric by <= threshold
    assert 0 < middle["in_circuit"].sum() < len(middle)


@pytest.mark.parametrize("arch", ZOO_ARCHS)
def test_acdc_runs_on_every_architecture(zoo, arch):
    model = zoo.model(arch)
    task = _task(model, seed=5, rows=3)
    frame = acdc(model, task, threshold=0.05)
    assert list(frame["edge"]) == list(EdgeGraph.from_model(model).edge_names)
    assert frame["score"].notna().all() and 0 < frame["in_circuit"].sum() < len(frame)
    _consistent(model, task, frame)


def test_budgets_change_nothing(zoo):
    model = zoo.model("llama")
    task = _task(model, seed=6, rows=4)
    # threshold 0.3: 148 runs measured (0.05: 281), 12 of 82 edges kept, and no score within
    # 0.015 of the threshold. Budgets: max_rows=3 splits every run's rows unevenly (3 + 1, the
    # 1-row block too); max_rows=5 gives each run a pass of its own; 30MB packs several runs
    # per pass, less than a call's. Each pass costs the same ~20 ms however few its rows.
    plain = acdc(model, task, threshold=0.3)
    assert 0 < plain["in_circuit"].sum() < len(plain)
    for budget in ({"max_rows": 3}, {"max_rows": 5}, {"max_bytes": "30MB"}):
        other = acdc(model, task, threshold=0.3, **budget)
        assert other["in_circuit"].equals(plain["in_circuit"]), budget
        assert np.abs(other["score"] - plain["score"]).max() < ATOL, budget


def test_bad_input_is_refused_in_one_line():
    model, task, _ = chain_model()
    for bad in (-0.1, math.nan, "0.1", None, True):
        with pytest.raises(ValueError, match="threshold must be a number >= 0") as info:
            acdc(model, task, threshold=bad)
        assert "\n" not in str(info.value)
    with pytest.raises(TypeError, match="threshold"):
        acdc(model, task)  # keyword-only and required
    with pytest.raises(ValueError, match="pass threshold with method 'acdc'"):
        edge_scores(model, task, "acdc")
    with pytest.raises(ValueError, match="pass threshold with method 'acdc'"):
        edge_scores(model, task, "eap", threshold=0.1)
    with pytest.raises(ValueError, match="takes no interventions"):
        edge_scores(model, task, "acdc", threshold=0.1, interventions=[("hook_embed", id)])
    with pytest.raises(ValueError, match="takes threshold"):
        discover_circuit(model, task, "acdc", top_n=3)
    with pytest.raises(ValueError, match="metric must be one of"):
        acdc(model, task, threshold=0.1, metric="loss")
    with pytest.raises(ValueError, match="not both"):
        acdc(model, task, threshold=0.1, max_rows=2, max_bytes="1GB")
    same = type(task).from_records(
        [{**record, "corrupted": record["clean"]} for record in task.to_records()]
    )
    with pytest.raises(ValueError, match="too close to divide by"):
        acdc(model, same, threshold=0.1)
