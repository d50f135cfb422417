"""The ground-truth circuits of tests/circuit_models.py have exactly the true edges they claim.

Exact edge patching (denoising, dataset means) is computed two ways: with the hook-level
oracle ``tests.edge_oracle.patch_edges`` (every edge, ``embed`` included) and, for every head
sender, with
``interp.interventions.paths.path_patch(..., mlps="freeze")``, which patches the sender's
clean output into exactly the given reader's input. ``path_patch`` has no ``embed`` sender;
embed edges into layer 0 are checked against patching that head's own q/k/v activation (in a
model without norms, layer 0 reads only the embedding), and all of embed's edges at once
against the clean run.
"""

from __future__ import annotations

import pytest
import torch

from interp import Task
from interp.interventions.paths import path_patch
from tests.circuit_models import TRUE_EDGES, chain_model
from tests.edge_oracle import all_edges, attribution_edge, patch_edges, run_caches

EXACT_ZERO = 1e-5  # |recovered| of an edge that must have no effect


@pytest.fixture(scope="module", params=[False, True], ids=["chain", "saturated"])
def setup(request):
    model, task, true_edges = chain_model(saturated=request.param)
    batch = task.tokens(model)
    with torch.no_grad():
        clean = float(batch.logit_diff(model(batch.clean)).mean())
        corrupted = float(batch.logit_diff(model(batch.corrupted)).mean())
    return request.param, model, batch, true_edges, clean, corrupted


def _recovered(setup, edges) -> float:
    _, model, batch, _, clean, corrupted = setup
    with torch.no_grad():
        logits = patch_edges(model, batch.corrupted, batch.clean, edges)
    return (float(batch.logit_diff(logits).mean()) - corrupted) / (clean - corrupted)


def _parse(node: str):
    """``L1H0.k`` -> ``("head", 1, 0, "k")``; ``L0H0`` -> ``(0, 0)``; ``logits`` stays."""
    if node == "logits":
        return node
    head, _, which = node.partition(".")
    layer, h = (int(x) for x in head[1:].split("H"))
    return ("head", layer, h, which) if which else (layer, h)


def test_task_has_a_gap(setup):
    _, model, batch, true_edges, clean, corrupted = setup
    assert true_edges == TRUE_EDGES and len(batch) == 8
    assert clean > corrupted + 2.5  # the clean prompt copies b, the corrupted one cannot


def test_graph_names_and_count(setup):
    model = setup[1]
    edges = all_edges(model)
    # 3 heads per layer, 2 layers: 9 layer-0 readers from embed, 9 layer-1 readers from embed
    # and 3 layer-0 heads, logits from all 7 writers
    assert len(edges) == len(set(edges)) == 9 + 9 * 4 + 7
    assert set(TRUE_EDGES) <= set(edges)
    assert "L1H0->L0H0.q" not in edges and "L0H1->L0H2.k" not in edges


def test_each_true_edge_recovers_the_answer(setup):
    for edge in TRUE_EDGES:
        assert _recovered(setup, [edge]) > 0.99, edge


def test_every_other_edge_has_no_effect(setup):
    others = [e for e in all_edges(setup[1]) if e not in TRUE_EDGES]
    effects = {e: _recovered(setup, [e]) for e in others}
    assert max(abs(v) for v in effects.values()) <= EXACT_ZERO, effects


def test_the_true_edges_together_recover_one(setup):
    assert _recovered(setup, list(TRUE_EDGES)) == pytest.approx(1.0, abs=1e-4)


def test_path_patch_agrees_on_every_head_edge(setup):
    """The library's path patching, one sender and one reader at a time, is the same number."""
    _, model, batch, _, _, _ = setup
    head_edges = [e for e in all_edges(model) if not e.startswith("embed")]
    for edge in head_edges:
        sender, reader = edge.split("->")
        result = path_patch(
            model,
            batch.clean,
            batch.corrupted,
            sender=_parse(sender),
            receivers=[_parse(reader)],
            metric=batch.logit_diff,
            mlps="freeze",
        )
        theirs = float(result.table["recovered"].iloc[0])
        assert theirs == pytest.approx(_recovered(setup, [edge]), abs=1e-5), edge


def test_embed_edges_into_layer_0_equal_patching_the_head_input(setup):
    """Layer 0 of a model without norms reads only the embedding: the embed edge into a head's
    q/k/v is that head's clean q/k/v activation patched into the corrupted run."""
    _, model, batch, _, clean, corrupted = setup
    with torch.no_grad():
        _, cache = model.run_with_cache(batch.clean)
        for h in range(int(model.cfg.n_heads)):
            for which in "qkv":
                name = f"blocks.0.attn.hook_{which}"

                def patch(act, hook, h=h, name=name):
                    act = act.clone()
                    act[:, :, h] = cache[name][:, :, h]
                    return act

                logits = model.run_with_hooks(batch.corrupted, fwd_hooks=[(name, patch)])
                theirs = (float(batch.logit_diff(logits).mean()) - corrupted) / (clean - corrupted)
                ours = _recovered(setup, [f"embed->L0H{h}.{which}"])
                assert theirs == pytest.approx(ours, abs=1e-5), (h, which)


def test_all_edges_of_one_sender_equal_patching_it(setup):
    """Every edge out of embed at once is the clean run; every edge out of a head at once is
    path patching that head into all its readers."""
    _, model, batch, _, _, _ = setup
    edges = all_edges(model)
    assert _recovered(setup, [e for e in edges if e.startswith("embed->")]) == pytest.approx(
        1.0, abs=1e-5
    )
    for sender in ("L0H0", "L0H1", "L0H2"):
        result = path_patch(
            model,
            batch.clean,
            batch.corrupted,
            sender=_parse(sender),
            receivers=[_parse(e.split("->")[1]) for e in edges if e.startswith(sender + "->")],
            metric=batch.logit_diff,
            mlps="freeze",
        )
        ours = _recovered(setup, [e for e in edges if e.startswith(sender + "->")])
        assert float(result.table["recovered"].iloc[0]) == pytest.approx(ours, abs=1e-5)


@pytest.mark.parametrize("edge", ["L0H0->L1H0.k", "embed->L0H0.v"])
def test_attribution_patching_misses_the_chain_only_when_saturated(setup, edge):
    """The gradient at L1H0's key is ~0 when its attention is saturated in both runs, so
    attribution patching scores the key edge, and the edge feeding it, ~0; exact finds them."""
    saturated, model, batch, _, clean, corrupted = setup
    exact = _recovered(setup, [edge])
    assert exact >= 0.5
    for at in ("clean", "corrupted"):
        estimate = attribution_edge(model, batch, edge, at=at) / (clean - corrupted)
        if saturated:
            assert abs(estimate) <= 0.01 * exact, (at, estimate, exact)
        else:
            assert estimate >= 0.1, (at, estimate, exact)  # soft attention: the gradient sees it


def test_attribution_patching_is_exact_into_logits(setup):
    """The metric is linear in the final stream: the logits edge's attribution is exact."""
    _, model, batch, _, clean, corrupted = setup
    for at in ("clean", "corrupted"):
        estimate = attribution_edge(model, batch, "L1H0->logits", at=at) / (clean - corrupted)
        assert estimate == pytest.approx(_recovered(setup, ["L1H0->logits"]), abs=1e-5)


def test_attribution_of_every_other_edge_is_zero(setup):
    """The zero edges are zero for the gradient methods too (their readers' weights annihilate
    the sender's difference, or the metric does not see the reader): EAP and EAP-IG rank the
    true edges first whenever they score them above 0."""
    _, model, batch, _, clean, corrupted = setup
    caches = run_caches(model, batch)  # the same two runs for every edge
    for edge in (e for e in all_edges(model) if e not in TRUE_EDGES):
        for kw in ({"at": "clean"}, {"at": "corrupted"}, {"ig_steps": 5}):
            estimate = attribution_edge(model, batch, edge, caches=caches, **kw)
            estimate /= clean - corrupted
            assert abs(estimate) <= EXACT_ZERO, (edge, kw, estimate)


def test_integrated_gradients_find_the_chain(setup):
    """Along the input path the key passes through unsaturated attention: 5 steps score every
    true edge clearly above 0, and 50 steps come within 1% of exact."""
    _, model, batch, _, clean, corrupted = setup
    for edge in TRUE_EDGES:
        exact = _recovered(setup, [edge])
        few = attribution_edge(model, batch, edge, ig_steps=5) / (clean - corrupted)
        many = attribution_edge(model, batch, edge, ig_steps=50) / (clean - corrupted)
        assert few >= 0.2 and many == pytest.approx(exact, abs=0.01), (edge, few, many)


def test_a_wrong_answer_of_c_would_add_a_value_edge():
    """The zero of ``embed->L1H0.v`` rests on ``wrong`` not being ``c`` (the corrupting
    token): with ``wrong = c`` the value edge moves the metric, and the zero test would fail."""
    model, task, _ = chain_model()
    records = task.to_records()
    for r in records:
        r["wrong"] = next(y for x, y in zip(r["clean"], r["corrupted"], strict=True) if x != y)
    batch = Task.from_records(records).tokens(model)
    with torch.no_grad():
        clean = float(batch.logit_diff(model(batch.clean)).mean())
        corrupted = float(batch.logit_diff(model(batch.corrupted)).mean())
    setup = (False, model, batch, TRUE_EDGES, clean, corrupted)
    assert _recovered(setup, ["embed->L1H0.v"]) > 0.05


def test_the_true_circuit_is_faithful_and_each_edge_needed(setup):
    """Faithfulness as evaluate_circuit defines it: the clean run with every edge outside the
    circuit given its corrupted sender. The true circuit gives 1; without any one true edge
    the chain breaks (below 0.01); the empty circuit is the corrupted run (0)."""
    _, model, batch, _, clean, corrupted = setup
    edges = all_edges(model)

    def faithfulness(circuit) -> float:
        outside = [e for e in edges if e not in circuit]
        with torch.no_grad():
            logits = patch_edges(model, batch.clean, batch.corrupted, outside)
        return (float(batch.logit_diff(logits).mean()) - corrupted) / (clean - corrupted)

    assert faithfulness(TRUE_EDGES) == pytest.approx(1.0, abs=1e-5)
    assert faithfulness(edges) == pytest.approx(1.0, abs=1e-5)
    assert faithfulness([]) == pytest.approx(0.0, abs=1e-5)
    for dropped in TRUE_EDGES:
        assert faithfulness([e for e in TRUE_EDGES if e != dropped]) < 0.01, dropped
