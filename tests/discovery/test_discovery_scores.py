"""Edge scores (interp/discovery/scores.py) against ground truth: patching every edge out of a
writer is patching the writer (the existing path patching), an edge into the logits is the
writer's direct effect, EAP is exact where the model is linear, EAP equals TransformerLens
4.3's edge attribution, and budgets change no number."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from interp import Task
from interp.discovery import EdgeGraph, edge_scores
from interp.discovery.runs import patched_metrics, writer_outputs
from interp.interventions.paths import complete_receivers, path_patch
from tests.zoo import attn_only_model

ATOL = 1e-5  # float32, 2 layers: one patched run computed two ways
ARCHS = ["gpt2", "llama", "gpt_neox_parallel", "gptj"]  # plain, GQA, parallel, shared norm


def _task(model, *, seed: int = 0, rows: int = 3, n_pos: int = 8, same_answer: bool = False):
    """Random ids; the corrupted rows differ in a middle span; answers per row."""
    g = torch.Generator().manual_seed(seed)
    vocab = int(model.cfg.d_vocab)
    clean = torch.randint(3, vocab, (rows, n_pos), generator=g)
    corrupted = clean.clone()
    corrupted[:, 2:5] = torch.randint(3, vocab, (rows, 3), generator=g)
    answers = torch.randint(3, vocab, (rows, 2), generator=g)
    if same_answer:
        answers[:] = answers[0]
    answers[:, 1] = torch.where(
        answers[:, 1] == answers[:, 0], answers[:, 0] % 2 + 1, answers[:, 1]
    )
    return Task.from_records(
        [
            {"clean": c.tolist(), "corrupted": k.tolist(), "answer": int(a), "wrong": int(w)}
            for c, k, (a, w) in zip(clean, corrupted, answers, strict=True)
        ]
    )


def _runs_mean(model, task, runs):
    graph = EdgeGraph.from_model(model)
    batch = task.tokens(model)
    clean, _ = writer_outputs(model, batch.clean, graph)
    corrupted, _ = writer_outputs(model, batch.corrupted, graph)
    values = patched_metrics(model, batch, batch.metric(), clean - corrupted, runs)
    return values.double().mean(dim=1)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_edge_out_of_a_writer_is_patching_the_writer(zoo, arch):
    model = zoo.model(arch)
    graph = EdgeGraph.from_model(model)
    task = _task(model)
    batch = task.tokens(model)
    senders = [("head", 0, 1), ("mlp", 0), ("head", 1, 2), ("mlp", 1)]
    names = ["L0H1", "MLP0", "L1H2", "MLP1"]
    runs = [[e for e in graph.edges if e[0] == name] for name in names]
    ours = _runs_mean(model, task, runs)
    for sender, value in zip(senders, ours, strict=True):
        expected = path_patch(
            model,
            batch.clean,
            batch.corrupted,
            sender=sender,
            receivers=complete_receivers(model, sender, mlps="freeze"),
            metric=batch.metric(),
            mlps="freeze",
        ).table["metric"][0]
        assert abs(float(value) - expected) < ATOL, (sender, float(value), expected)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_an_edge_into_the_logits_is_the_writers_direct_effect(zoo, arch):
    model = zoo.model(arch)
    task = _task(model, seed=1)
    batch = task.tokens(model)
    scores = edge_scores(model, task, "exact").set_index("edge")["score"]
    graph = EdgeGraph.from_model(model)
    for writer in graph.writers[1:]:
        sender = (
            ("mlp", int(writer[3:]))
            if writer.startswith("MLP")
            else tuple(int(x) for x in writer[1:].split("H"))
        )
        direct = path_patch(
            model,
            batch.clean,
            batch.corrupted,
            sender=sender,
            receivers="logits",
            metric=batch.metric(),
            mlps="freeze",
        )
        assert abs(scores[f"{writer}->logits"] - direct.table["recovered"][0]) < ATOL


def _frozen_patterns(model, tokens):
    """Hooks holding every attention pattern at ``tokens``' own, for any repeat of its rows."""
    from interp.engine import run_cached

    names = [f"blocks.{lay}.attn.hook_pattern" for lay in range(int(model.cfg.n_layers))]
    held = run_cached(model, tokens, hooks=names)

    def hold(name):
        def hook(act, hook):
            fixed = held[name]
            return fixed.repeat(act.shape[0] // fixed.shape[0], 1, 1, 1).to(act.dtype)

        return hook

    return [(name, hold(name)) for name in names]


def test_eap_is_exact_when_the_model_is_linear():
    model = attn_only_model(normalization_type=None)  # no norm: linear with patterns held
    task = _task(model, seed=2, rows=4)
    fixed = _frozen_patterns(model, task.tokens(model).corrupted)
    exact = edge_scores(model, task, "exact", interventions=fixed)
    eap = edge_scores(model, task, "eap", interventions=fixed)
    span = exact.attrs["clean_metric"] - exact.attrs["corrupted_metric"]
    assert abs(span) > 1e-3
    # in the scores' own unit, the recovered fraction (measured: 4e-6; one edge moves 0.5)
    assert np.abs(exact["score"] - eap["score"]).max() < ATOL
    assert (exact["score"].abs() > 1e-2).sum() > 10  # many edges matter, not a vacuous match


def _tl_name(node) -> str:
    if node.kind == "embed":
        return "embed"
    if node.kind in ("attn_head_out", "q_input", "k_input", "v_input"):
        tail = "" if node.kind == "attn_head_out" else "." + node.kind[0]
        return f"L{node.layer}H{node.head}{tail}"
    return "logits" if node.kind == "logits" else f"MLP{node.layer}"


def test_eap_equals_transformer_lens_edge_attribution(gpt2_dir):
    from transformer_lens.tools.analysis.attribution_patching import (
        EdgeAttributionConfig,
        attribution_patch,
    )

    from interp import load_model

    model = load_model(gpt2_dir, device="cpu")  # TransformerLens switches hook flags on it
    task = _task(model, seed=3, same_answer=True)  # its metric_fn sees one row, not its index
    batch = task.tokens(model)
    ours = edge_scores(model, task, "eap")
    span = ours.attrs["clean_metric"] - ours.attrs["corrupted_metric"]
    a, w = batch.answers[0][0], batch.wrong[0][0]
    result = attribution_patch(
        model,
        batch.clean,
        batch.corrupted,
        lambda logits: logits[0, -1, a] - logits[0, -1, w],
        EdgeAttributionConfig(granularity="edge"),
    )
    theirs: dict[str, float] = {}
    for (u, v), value in result.edge_scores.items():  # one score per position: summed
        name = f"{_tl_name(u)}->{_tl_name(v)}"
        theirs[name] = theirs.get(name, 0.0) + value
    assert set(theirs) == set(ours["edge"])
    tl = np.array([theirs[e] for e in ours["edge"]])
    assert np.abs(tl - ours["score"].to_numpy() * span).max() <= 1e-4 * np.abs(tl).max()


@pytest.mark.parametrize("method", ["exact", "eap", "eap-ig"])
def test_budgets_change_no_number(zoo, method):
    model = zoo.model("llama")
    task = _task(model, seed=4, rows=4)
    whole = edge_scores(model, task, method)
    for split in ({"max_rows": 3}, {"max_rows": 1}, {"max_bytes": "2MB"}):
        part = edge_scores(model, task, method, **split)
        scale = max(1.0, whole["score"].abs().max())  # a random model: scores of tens
        assert np.abs(part["score"] - whole["score"]).max() < ATOL * scale, split
    assert list(whole.columns) == ["edge", "source", "target", "score"]


@pytest.mark.parametrize("method", ["eap", "eap-ig"])
def test_gradient_methods_run_with_gradients_switched_off(gpt2_model, method):
    """A notebook that starts with torch.set_grad_enabled(False) (the tour does) still gets
    gradient scores, the same numbers as with gradients on."""
    task = _task(gpt2_model)
    on = edge_scores(gpt2_model, task, method)
    with torch.no_grad():
        off = edge_scores(gpt2_model, task, method)
    assert np.abs(off["score"] - on["score"]).max() == 0
    assert torch.is_grad_enabled()


def test_bad_input_is_refused(gpt2_model):
    task = _task(gpt2_model)
    with pytest.raises(ValueError, match="method must be one of"):
        edge_scores(gpt2_model, task, "acdc-ish")
    with pytest.raises(ValueError, match="not both"):
        edge_scores(gpt2_model, task, max_rows=2, max_bytes="1GB")
    frozen_scale = ("blocks.1.ln1.hook_scale", lambda act, hook: act)
    with pytest.raises(ValueError, match="use method='exact'"):
        edge_scores(gpt2_model, task, "eap", interventions=[frozen_scale])


def test_eap_ig_over_the_embeddings_edges_converges_to_exact_as_steps_grow(bundled_model):
    """EAP-IG integrates along the input path, so the sum of its scores over every edge out of
    ``embed`` is a Riemann sum of ``m(clean) - m(corrupted)``: its error against exact edge
    patching of those edges together (the clean run) falls as ``ig_steps`` grows. Single edges
    need not converge (docs/discovery.md has the table)."""
    from interp.tasks import induction

    task = induction(bundled_model, 4, seed=0, seq_len=6)
    graph = EdgeGraph.from_model(bundled_model)
    embed_edges = [e for e in graph.edges if e[0] == "embed"]
    scores = edge_scores(bundled_model, task, "exact")
    c, k = scores.attrs["clean_metric"], scores.attrs["corrupted_metric"]
    exact = (float(_runs_mean(bundled_model, task, [embed_edges])[0]) - k) / (c - k)
    assert abs(exact - 1.0) < ATOL  # every edge out of embed: the clean run
    errors = []
    for steps in (1, 8, 64):
        ig = edge_scores(bundled_model, task, "eap-ig", ig_steps=steps)
        errors.append(abs(ig.loc[ig["source"] == "embed", "score"].sum() - exact))
    assert errors[0] > errors[1] > errors[2] and errors[2] < 0.01, errors
    eap = edge_scores(bundled_model, task, "eap")
    one = edge_scores(bundled_model, task, "eap-ig", ig_steps=1)
    assert np.abs(eap["score"] - one["score"]).max() == 0  # one step is EAP


@pytest.mark.parametrize("arch", ["gpt2", "opt", "gptj", "llama"])
def test_reader_gradients_through_the_norm_equal_autograd(zoo, arch):
    """A layer's q/k/v readers' gradients (LayerNorm's backward written out and folded into
    the weights; other norms: autograd batched) equal autograd through ``ln1(x) @ W[h]``, one
    head at a time; and the norm's other reader (GPT-J's MLP) through ``ln1(x)``."""
    from interp.discovery.gradients import _layer_gradients, _python_layernorm

    model = zoo.model(arch)
    norm = model.blocks[1].ln1
    assert _python_layernorm(norm) == (arch in ("gpt2", "gptj"))  # both paths covered
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 5, int(model.cfg.d_model), generator=g) * 3 + 1
    heads = [
        (torch.randn(3, 5, W.shape[1], W.shape[3], generator=g), W[1].detach())
        for W in (model.W_Q, model.W_K, model.W_V)
    ]
    at_norm = torch.randn(3, 5, int(model.cfg.d_model), generator=g)
    ours = _layer_gradients(norm, x, heads, at_norm)
    expected = []
    for grad, W in heads:
        for h in range(W.shape[0]):
            leaf = x.clone().requires_grad_(True)
            (found,) = torch.autograd.grad(norm(leaf) @ W[h], leaf, grad[:, :, h])
            expected.append(found)
    leaf = x.clone().requires_grad_(True)
    expected.append(torch.autograd.grad(norm(leaf), leaf, at_norm)[0])
    expected = torch.stack(expected)
    assert ours.shape == expected.shape
    assert (ours - expected).abs().max() < 1e-5 * expected.abs().max()
