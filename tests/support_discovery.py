"""The circuit-discovery checks of tests/support.py: ``edge_scores`` by each method,
``evaluate_circuit`` and ``interp discover``, each against plain transformers, plain
TransformerLens hooks or the library on the same model (nothing of interp's edge delivery:
``interp.discovery.inputs`` is not used here).

- ``exact``: the dataset's clean and corrupted metrics equal transformers'; an edge into
  ``logits`` equals the writer's direct effect by path patching (receivers ``logits``, MLPs
  frozen), for a head of the last layer and the last MLP (or layer 0's head 1). Under
  post-norms (Gemma 2) a head's output is its ``z W_O`` through the post-norm with each run's
  own scale, which path patching (one head's z into the layer, the norm recomputed) does not
  give: the head's edge is then checked against the corrupted run with ``ln_final``'s input
  moved by that output's clean-minus-corrupted, read from plain hooks.
- ``eap`` and ``eap-ig``: the edges into ``logits`` add up (over every writer; biases are
  equal in both runs) to ``(final_clean - final_corrupted) . dm/d final``, with the gradient
  taken by autograd through a plain hook on the final residual stream: on the corrupted run
  (EAP), or averaged over the runs whose layer-0 stream is shifted by ``k / steps`` of the
  clean-minus-corrupted input embeddings (EAP-IG).
- ``evaluate_circuit``: the full graph gives exactly 1 and the empty circuit exactly 0; the
  empty circuit's run is transformers' corrupted run and the model's its clean run, row by
  row; removing every edge into layer 0 is the clean run with layer 0's heads (``hook_z``) and
  MLP output patched from the corrupted run by plain hooks.
- ``acdc``: the kept circuit's faithfulness, measured afresh by ``evaluate_circuit``, is 1 -
  the sum of the removed edges' scores (they telescope), and every decision obeys the
  threshold.
- ``interp discover``: ``edges.csv`` equals ``edge_scores`` on the model loaded here,
  ``circuit.json`` keeps the top edges by ``|score|`` and its faithfulness is
  ``evaluate_circuit``'s.

Imported by tests/support.py (after the helpers it uses here are defined); import that
module, not this one.
"""

from __future__ import annotations

import torch

from tests.support import Case, _reference_logits
from tests.support_interventions import ATOL_PATCH, ATOL_PATH, _near

IG_STEPS = 3  # eap-ig points: enough to differ from EAP, few enough to stay fast


def _task(case: Case, rows: int = 3, n_pos: int = 8):
    """Token-id rows of one length (run as given); the corrupted rows redraw a middle span;
    each row its own answer and wrong token."""
    from interp.tasks import Task

    vocab = min(int(case.model.cfg.d_vocab), 40)  # the toys have 40 tokens
    g = torch.Generator().manual_seed(4)
    clean = torch.randint(2, vocab, (rows, n_pos), generator=g)
    corrupted = clean.clone()
    corrupted[:, 2:5] = torch.randint(2, vocab, (rows, 3), generator=g)
    return Task.from_records(
        [
            {"clean": c.tolist(), "corrupted": k.tolist(), "answer": 5 + i, "wrong": 7 + 2 * i}
            for i, (c, k) in enumerate(zip(clean, corrupted, strict=True))
        ]
    )


def _metric_rows(case: Case, tokens: torch.Tensor, task) -> torch.Tensor:
    """Each row's logit difference at its last token from transformers' logits."""
    logits = _reference_logits(case, tokens)
    answers = torch.tensor([row.answer for row in task.rows])
    wrong = torch.tensor([row.wrong for row in task.rows])
    rows = torch.arange(len(task))
    return (logits[rows, -1, answers] - logits[rows, -1, wrong]).double()


def _final(case: Case) -> str:
    return f"blocks.{int(case.model.cfg.n_layers) - 1}.hook_resid_post"


def _scores_and_truth(case: Case, method: str):
    from interp.discovery import edge_scores

    task = _task(case)
    batch = task.tokens(case.model)
    frame = edge_scores(case.model, task, method, ig_steps=IG_STEPS)
    clean = _metric_rows(case, batch.clean, task).mean()
    corrupted = _metric_rows(case, batch.corrupted, task).mean()
    _near(frame.attrs["clean_metric"], float(clean), ATOL_PATCH, f"{method}'s clean metric")
    _near(frame.attrs["corrupted_metric"], float(corrupted), ATOL_PATCH, "the corrupted metric")
    if frame["score"].isna().any():
        raise AssertionError(f"{method} gives NaN scores although the metrics differ")
    return frame.set_index("edge")["score"], task, batch, float(clean - corrupted)


def check_edge_scores_exact(case: Case) -> None:
    from interp.interventions import path_patch

    scores, _, batch, gap = _scores_and_truth(case, "exact")
    last = int(case.model.cfg.n_layers) - 1
    writers = [(f"L{last}H0", (last, 0))]
    mlp = f"MLP{last}"
    writers.append((mlp, ("mlp", last)) if f"{mlp}->logits" in scores else ("L0H1", (0, 1)))
    for writer, sender in writers:
        if writer.startswith("L") and getattr(case.model.blocks[last], "ln1_post", None):
            _near(
                float(scores[f"{writer}->logits"]) * gap + _corrupted_mean(case, batch),
                _post_normed_head_into_logits(case, batch, last, 0),
                ATOL_PATH,
                f"{writer}->logits against its post-normed output moved into ln_final by hooks",
            )
            continue
        direct = path_patch(
            case.model,
            batch.clean,
            batch.corrupted,
            sender=sender,
            receivers="logits",
            metric=batch.metric(),
            mlps="freeze",
        )
        _near(  # in metric units: a recovered fraction divides by a gap that may be small
            float(scores[f"{writer}->logits"]) * gap + direct.corrupted_metric,
            float(direct.table["metric"][0]),
            ATOL_PATH,
            f"{writer}->logits against the writer's direct effect by path patching",
        )
    if not scores.abs().max() > 1e-3:
        raise AssertionError("every exact score is 0: the identities would be trivial")


def _corrupted_mean(case: Case, batch) -> float:
    return float(batch.metric()(case.model(batch.corrupted)).double().mean())


def _post_normed_head_into_logits(case: Case, batch, layer: int, head: int) -> float:
    """The corrupted run's mean metric with ``ln_final``'s input moved by the head's clean
    minus corrupted ``(z W_O) / s * (1 + w)`` (``s`` the post-norm's scale in each run)."""
    model = case.model
    names = (f"blocks.{layer}.attn.hook_z", f"blocks.{layer}.ln1_post.hook_scale")
    outputs = []
    for tokens in (batch.clean, batch.corrupted):
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
        z, scale = cache[names[0]][:, :, head], cache[names[1]]
        weight = 1 + model.blocks[layer].ln1_post.original_component.weight.detach()
        outputs.append(z @ model.W_O[layer, head] / scale * weight)
    delta = outputs[0] - outputs[1]
    logits = model.run_with_hooks(
        batch.corrupted, fwd_hooks=[("ln_final.hook_in", lambda x, hook: x + delta)]
    )
    return float(batch.metric()(logits).double().mean())


def _final_gradient(case: Case, batch, shift: torch.Tensor | None) -> torch.Tensor:
    """d sum_rows metric / d final stream on the corrupted rows, the layer-0 stream shifted."""
    leaf = torch.zeros((*batch.corrupted.shape, int(case.model.cfg.d_model)), requires_grad=True)
    hooks = [(_final(case), lambda act, hook: act + leaf)]
    if shift is not None:
        hooks.append(("blocks.0.hook_resid_pre", lambda act, hook: act + shift))
    with torch.enable_grad():
        logits = case.model.run_with_hooks(batch.corrupted, fwd_hooks=hooks)
        (grad,) = torch.autograd.grad(batch.metric()(logits).sum(), leaf)
    return grad


def _check_gradient_method(case: Case, method: str) -> None:
    scores, _, batch, gap = _scores_and_truth(case, method)
    names = [_final(case), "blocks.0.hook_resid_pre"]
    with torch.no_grad():
        _, clean = case.model.run_with_cache(batch.clean, names_filter=lambda n: n in names)
        _, corrupted = case.model.run_with_cache(batch.corrupted, names_filter=lambda n: n in names)
    embed = clean[names[1]] - corrupted[names[1]]
    alphas = [k / IG_STEPS for k in range(IG_STEPS)] if method == "eap-ig" else [0.0]
    grad = sum(_final_gradient(case, batch, a * embed if a else None) for a in alphas)
    change = (clean[names[0]] - corrupted[names[0]]) * grad / len(alphas)
    want = float(change.double().sum()) / len(batch)
    into_logits = scores[[e for e in scores.index if e.endswith("->logits")]]
    _near(
        float(into_logits.sum()) * gap,
        want,
        ATOL_PATCH * max(1.0, abs(want)),
        f"{method}: the edges into logits summed against (final change) . gradient",
    )
    if not scores.abs().max() > 1e-3:
        raise AssertionError(f"every {method} score is 0: the identity would be trivial")


def check_edge_scores_eap(case: Case) -> None:
    _check_gradient_method(case, "eap")


def check_edge_scores_eap_ig(case: Case) -> None:
    _check_gradient_method(case, "eap-ig")


def check_evaluate_circuit(case: Case) -> None:
    from interp.discovery import EdgeGraph, evaluate_circuit

    task = _task(case)
    batch = task.tokens(case.model)
    graph = EdgeGraph.from_model(case.model)
    full = evaluate_circuit(case.model, task, graph.edge_names)
    empty = evaluate_circuit(case.model, task, [])
    if not (full.faithfulness == 1.0 and empty.faithfulness == 0.0):
        raise AssertionError(
            f"faithfulness of the full graph {full.faithfulness} and of the empty circuit "
            f"{empty.faithfulness}, not exactly 1 and 0"
        )
    for column, tokens in (("empty_metric", batch.corrupted), ("model_metric", batch.clean)):
        want = _metric_rows(case, tokens, task)
        got = torch.tensor(empty.per_row[column].to_numpy(), dtype=torch.float64)
        _near(float((got - want).abs().max()), 0.0, ATOL_PATCH, f"{column} against transformers")
    layer_0 = {str(r) for r in graph.readers if r.layer == 0}
    kept = [
        e for e, (_, r) in zip(graph.edge_names, graph.edges, strict=True) if str(r) not in layer_0
    ]
    ours = evaluate_circuit(case.model, task, kept).per_row["circuit_metric"].to_numpy()
    names = [
        n for n in ("blocks.0.attn.hook_z", "blocks.0.hook_mlp_out") if n in case.model.hook_dict
    ]
    with torch.no_grad():
        _, cache = case.model.run_with_cache(batch.corrupted, names_filter=lambda n: n in names)
        hooks = [(n, lambda act, hook, n=n: cache[n]) for n in names]
        theirs = batch.metric()(case.model.run_with_hooks(batch.clean, fwd_hooks=hooks))
    gap = float((torch.tensor(ours) - theirs.double()).abs().max())
    _near(gap, 0.0, ATOL_PATH, "layer 0's inputs removed against patching layer 0 (max |diff|)")


ACDC_THRESHOLD = 0.01  # of clean - corrupted: prunes some edges of the toys, keeps others


def check_edge_scores_acdc(case: Case) -> None:
    """ACDC's scores telescope: the kept circuit's faithfulness, measured afresh by
    evaluate_circuit, is 1 - the sum of the removed edges' scores; each decision obeys the
    threshold."""
    from interp.discovery import edge_scores, evaluate_circuit

    task = _task(case)
    frame = edge_scores(case.model, task, "acdc", threshold=ACDC_THRESHOLD)
    kept = frame["in_circuit"].astype(bool)
    if kept.all() or not kept.any():
        raise AssertionError(f"ACDC kept {int(kept.sum())} of {len(frame)} edges: trivial")
    removed = frame.loc[~kept, "score"]
    if not (removed.abs() <= ACDC_THRESHOLD).all():
        raise AssertionError("ACDC removed an edge whose score is above the threshold")
    if not (frame.loc[kept, "score"].abs() > ACDC_THRESHOLD).all():
        raise AssertionError("ACDC kept an edge whose score is within the threshold")
    result = evaluate_circuit(case.model, task, list(frame.loc[kept, "edge"]))
    _near(
        result.faithfulness,
        1.0 - float(removed.sum()),
        ATOL_PATCH * max(1.0, float(removed.abs().sum())),
        "the kept circuit's faithfulness against 1 - the removed edges' scores",
    )


def check_cli_discover(case: Case) -> None:
    """``interp discover`` on the checkpoint: edges.csv equals edge_scores in Python on the
    model loaded here, circuit.json's edges are the top ones by |score| and its faithfulness
    is evaluate_circuit's."""
    import json
    import tempfile
    from pathlib import Path

    import pandas as pd

    from interp.discovery import edge_scores, evaluate_circuit
    from tests.support import _cli

    task = _task(case)
    top_n = 8
    with tempfile.TemporaryDirectory() as folder:
        path, out = Path(folder) / "task.jsonl", Path(folder) / "out"
        path.write_text("".join(json.dumps(r) + "\n" for r in task.to_records()))
        _cli(
            case,
            ["discover", "--model", str(case.directory), "--task", str(path), "--method", "eap"]
            + ["--top-n", str(top_n), "--out", str(out)],
        )
        edges = pd.read_csv(out / "edges.csv")
        circuit = json.loads((out / "circuit.json").read_text())
    ours = edge_scores(case.model, task, "eap")
    if list(edges["edge"]) != list(ours["edge"]):
        raise AssertionError("edges.csv lists other edges than edge_scores")
    gap = float((edges["score"] - ours["score"]).abs().max())
    _near(gap, 0.0, ATOL_PATCH, "edges.csv's scores against edge_scores (max |diff|)")
    size = ours["score"].abs()
    if sorted(circuit["edges"]) != sorted(ours.loc[size.nlargest(top_n).index, "edge"]):
        raise AssertionError("circuit.json's edges are not the top edges by |score|")
    result = evaluate_circuit(case.model, task, circuit["edges"])
    _near(circuit["faithfulness"], result.faithfulness, ATOL_PATCH, "circuit.json's faithfulness")
