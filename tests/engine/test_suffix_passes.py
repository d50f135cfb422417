"""Patched runs computed from their first patched position on (interp.engine.suffix).

A run whose patches all sit at positions >= s runs on positions s... only, over the base run's
keys and values before s, and joins the batch at its own start layer from the base run's
residual. Proofs, against an independent dense reference (each row and run alone through
``run_cached``, full logits): ``run_patched`` read at each row's last token gives the same
numbers (<= 1e-5) for per-position sites of every kind, zeros, runs over two layers, and runs
it must leave to the dense passes (every position, noise), on every zoo architecture (learned
positions, rotary, parallel residual, GQA, Gemma 2's soft-caps) and the bundled model; the fast
path is really taken where the model allows it, and where it does not (Gemma 2's logits are not
read at one position; a model the one-row check refuses) the numbers are the same.
"""

from __future__ import annotations

import pytest
import torch

import interp.engine.batch_plan as batch_plan
import interp.engine.batched as batched
from interp.engine import Intervention, Site, run_cached, run_patched
from interp.engine.suffix import run_offset, suffix_like_forward
from interp.interventions.inputs import task_row_metric
from tests.task_models import random_id_task
from tests.zoo import ZOO_ARCHS

ATOL = 1e-5  # float32 logits of differently shaped passes


def _task(n_rows=3, n_pos=7, seed=0, vocab=200):
    return random_id_task([n_pos] * n_rows, seed=seed, vocab=vocab, corrupt=n_pos // 2)


def _runs(model, source, n_pos):
    """Per-position patches of every kind the fast path takes, a zero, a two-site run, and
    runs it must leave to the dense passes (every position; noise)."""
    layers = range(int(model.cfg.n_layers))
    runs = []
    for layer in layers:
        for pos in (1, n_pos // 2, n_pos - 1, -2):
            for kind, head in (("resid_pre", None), ("attn_out", None), ("head", 1), ("k", 0)):
                site = Site(kind, layer, head=head, pos=pos)
                runs.append([Intervention(site, "patch", source=source[site.hook_name])])
        pattern = Site("pattern", layer, head=2, pos=n_pos - 2)
        runs.append([Intervention(pattern, "patch", source=source[pattern.hook_name])])
        runs.append([Intervention(Site("resid_pre", layer, pos=3), "zero")])
        runs.append(
            [
                Intervention(
                    Site("resid_pre", layer),
                    "patch",
                    source=source[f"blocks.{layer}.hook_resid_pre"],
                )
            ]
        )
    last = int(model.cfg.n_layers) - 1
    early, late = Site("head", 0, head=0, pos=4), Site("resid_pre", last, pos=2)
    runs.append([Intervention(s, "patch", source=source[s.hook_name]) for s in (early, late)])
    runs.append([Intervention(Site("resid_pre", 0, pos=3), "noise", std=0.5)])
    return runs


def _source(model, tokens):
    """The hooks :func:`_runs` patches, cached on ``tokens``."""
    suffixes = (
        "hook_resid_pre",
        "hook_attn_out",
        "attn.hook_z",
        "attn.hook_k",
        "attn.hook_pattern",
    )
    names = [f"blocks.{i}.{s}" for i in range(int(model.cfg.n_layers)) for s in suffixes]
    return run_cached(model, tokens, hooks=names)


def _dense(model, tokens, run, row):
    """Row ``row`` of ``tokens`` run alone with ``run`` (its sources cut to that row)."""
    items = [
        item
        if item.kind != "patch"
        else Intervention(item.site, "patch", source=item.source[row : row + 1])
        for item in run
    ]
    return run_cached(model, tokens[row : row + 1], interventions=items).logits[0]


def _spy(monkeypatch, module):
    calls = []
    real = module.suffix_pass

    def spy(*args, **kwargs):
        calls.append(args[2])  # the first position computed
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "suffix_pass", spy)
    return calls


def _check_task(model, monkeypatch):
    batch = _task().tokens(model)
    tokens, n_pos = batch.corrupted, int(batch.corrupted.shape[1])
    runs = _runs(model, _source(model, batch.clean), n_pos)
    metric = batch.metric("logit_diff")
    calls = _spy(monkeypatch, batched)
    row_metric = task_row_metric(metric)
    values = run_patched(
        model, tokens, runs, row_metric=row_metric, read_at=batch.last, max_rows=40
    )
    for p, run in enumerate(runs):
        for row in range(len(batch)):
            logits = _dense(model, tokens, run, row)[None]
            expected = metric(logits.expand(len(batch), -1, -1))[row]
            assert torch.allclose(values[p, row], expected, atol=ATOL, rtol=0), (p, run[0], row)
    return calls, tokens, batch.last


@pytest.mark.parametrize("arch", ZOO_ARCHS)
def test_every_zoo_architecture_gives_the_dense_numbers(zoo, arch, monkeypatch):
    model = zoo.model(arch)
    calls, tokens, last = _check_task(model, monkeypatch)
    fits = suffix_like_forward(model, tokens, last)
    # the fast path runs exactly where the model's one-row check allows it and the logits are
    # read at one position (Gemma 2 soft-caps them: no read there, so no fast path)
    assert bool(calls) == (fits and arch != "gemma2"), arch
    if arch in ("gpt2", "gpt_neox", "llama", "gpt_neox_parallel"):  # learned, rotary, parallel
        assert calls and fits, f"{arch}: the fast path should fit"


def test_the_bundled_model_gives_the_dense_numbers(bundled_model, monkeypatch):
    calls, _, _ = _check_task(bundled_model, monkeypatch)
    assert sorted(set(calls)) == [1, 2, 3, 5, 6]  # every first position of _runs (7 tokens)


def test_a_model_the_check_refuses_falls_back(gpt2_model, monkeypatch):
    monkeypatch.setattr(batch_plan, "suffix_like_forward", lambda *args: False)
    calls, _, _ = _check_task(gpt2_model, monkeypatch)
    assert calls == []


def test_the_first_position_of_a_run():
    source = torch.zeros(1, 6, 8)
    at = [Intervention(Site("resid_pre", 0, pos=p), "patch", source=source) for p in (4, 2, -1)]
    assert run_offset(at, 6) == 2 and run_offset(at[2:], 6) == 5
    assert run_offset([*at, Intervention(Site("resid_pre", 1), "zero")], 6) == 0
    assert run_offset([Intervention(Site("resid_pre", 0, pos=3), "noise", std=1.0)], 6) == 0
    assert run_offset([], 6) == 0
