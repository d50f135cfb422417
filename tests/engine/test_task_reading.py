"""Reading a task's runs at one position per row (``run_patched(read_at=...)``).

With ``read_at`` a pass stops at the residual entering ``ln_final`` and unembeds one position of
each row. Proofs: the numbers equal full logits read at the same positions (<= 1e-5) on a
learned-position GPT-2, a rotary GPT-NeoX and the bundled model, with rows of different lengths;
the fast read is really taken there (the metric sees ``[batch d_vocab]``); padded rows read at
their own last token give each row run alone; a model whose logits are not
``unembed(ln_final(resid))`` falls back to full logits and keeps its numbers.
"""

from __future__ import annotations

import pytest
import torch

from interp import load_model
from interp.engine import Intervention, Site, run_cached, run_patched
from interp.engine.passes import reads_like_forward
from tests.task_models import random_id_task

ATOL = 1e-5  # float32 logits, one position unembedded against all of them


@pytest.fixture(scope="module")
def bundled():
    return load_model("tiny-induction")


def _task(lengths, seed=0, vocab=300):
    return random_id_task(lengths, seed=seed, vocab=vocab, corrupt=2)


def _runs(model, source):
    """A patched run per (layer, head) and per layer's resid_pre, from ``source``'s cache."""
    runs = []
    for layer in range(model.cfg.n_layers):
        site = Site("resid_pre", layer)
        runs.append([Intervention(site, "patch", source=source[site.hook_name])])
        for head in range(model.cfg.n_heads):
            site = Site("head", layer, head=head)
            runs.append([Intervention(site, "patch", source=source[site.hook_name])])
    return runs


def _metric(batch, seen: list):
    """The task's logit difference per batch row, noting the logits' rank it was given."""
    metric = batch.metric("logit_diff")

    def value(logits, rows):
        seen.append(logits.ndim)
        answers = tuple(metric.answers[i] for i in rows.tolist())
        wrong = tuple(metric.wrong[i] for i in rows.tolist())
        read = type(metric)(metric.kind, answers, wrong, batch.lengths[rows])
        return read(logits)

    return value


def _source(model, batch):
    """The clean run's cache of every hook :func:`_runs` patches."""
    names = {
        Site(kind, layer, **({"head": 0} if kind == "head" else {})).hook_name
        for layer in range(model.cfg.n_layers)
        for kind in ("resid_pre", "head")
    }
    return run_cached(model, batch.clean, hooks=sorted(names))


@pytest.mark.parametrize("name", ["gpt2_model", "neox_model", "bundled"])
def test_reading_at_the_last_token_equals_full_logits(name, request):
    model = request.getfixturevalue(name)
    batch = _task([5, 9, 3, 7], seed=1).tokens(model)
    runs = _runs(model, _source(model, batch))
    assert reads_like_forward(model, batch.corrupted, batch.last)
    full_seen, read_seen = [], []
    full = run_patched(model, batch.corrupted, runs, row_metric=_metric(batch, full_seen))
    read = run_patched(
        model, batch.corrupted, runs, row_metric=_metric(batch, read_seen), read_at=batch.last
    )
    assert set(full_seen) == {3} and set(read_seen) == {2}  # the fast read was taken
    assert not full.isnan().any()
    torch.testing.assert_close(read, full, atol=ATOL, rtol=0)
    # split into many passes (rows chunked): the same numbers
    split = run_patched(
        model, batch.corrupted, runs, row_metric=_metric(batch, []), read_at=batch.last, max_rows=3
    )
    torch.testing.assert_close(split, read, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["gpt2_model", "neox_model"])
def test_padded_rows_read_at_their_own_last_token(name, request):
    """Each padded row's value equals that row run alone at its own length (no padding)."""
    model = request.getfixturevalue(name)
    task = _task([4, 8, 6], seed=2)
    batch = task.tokens(model)
    runs = _runs(model, _source(model, batch))
    values = run_patched(
        model, batch.corrupted, runs, row_metric=_metric(batch, []), read_at=batch.last
    )
    for i in range(len(task)):
        alone = task[i : i + 1].tokens(model)
        assert alone.clean.shape[1] == int(batch.lengths[i])  # no padding alone
        own = _runs(model, _source(model, alone))
        expected = run_patched(model, alone.corrupted, own, row_metric=_metric(alone, []))
        torch.testing.assert_close(values[:, i : i + 1], expected, atol=ATOL, rtol=0)


def test_a_model_with_other_logits_falls_back_to_full_logits(gpt2_model):
    """Logits changed after the unembedding (as soft-capping does): the one-row check fails,
    full logits are read, and the numbers are the model's."""
    batch = _task([6, 4], seed=3).tokens(gpt2_model)
    runs = _runs(gpt2_model, _source(gpt2_model, batch))
    handle = gpt2_model.register_forward_hook(lambda module, args, out: torch.tanh(out / 3) * 3)
    try:
        assert not reads_like_forward(gpt2_model, batch.corrupted, batch.last)
        seen = []
        read = run_patched(
            gpt2_model, batch.corrupted, runs, row_metric=_metric(batch, seen), read_at=batch.last
        )
        full = run_patched(gpt2_model, batch.corrupted, runs, row_metric=_metric(batch, []))
    finally:
        handle.remove()
    assert set(seen) == {3}
    torch.testing.assert_close(read, full, atol=0, rtol=0)
    # a fixed hook after the read point would see one position: full logits too
    late = [("ln_final.hook_scale", lambda act, hook: None)]
    seen = []
    run_patched(
        gpt2_model,
        batch.corrupted,
        runs,
        row_metric=_metric(batch, seen),
        read_at=batch.last,
        fixed=late,
    )
    assert set(seen) == {3}


def test_read_at_is_checked(gpt2_model):
    batch = _task([4, 6]).tokens(gpt2_model)
    runs = [[Intervention(Site("head", 0, head=0), "zero")]]
    for bad, message in [
        (torch.tensor([3]), "one position per task row"),
        (
            torch.tensor([3, 6]),
            r"must lie in \[0, 5\]",
        ),
    ]:
        with pytest.raises(ValueError, match=message) as info:
            run_patched(
                gpt2_model, batch.corrupted, runs, row_metric=_metric(batch, []), read_at=bad
            )
        assert "\n" not in str(info.value)


def test_passes_read_at_one_position_are_planned_for_it(gpt2_model):
    """Read at one position a pass holds no ``[pos d_vocab]`` logits: at least as many rows
    fit in it, by default and under a budget (and the numbers above do not depend on it)."""
    from interp.engine import estimate_forward_bytes, task_blocks

    n_pos = 16
    one = estimate_forward_bytes(gpt2_model, (1, n_pos), read_positions=1)
    assert one <= estimate_forward_bytes(gpt2_model, (1, n_pos))
    for budget in (None, 4 * 2**20):
        full = task_blocks(gpt2_model, n_pos, 4, 500, max_bytes=budget)
        read = task_blocks(gpt2_model, n_pos, 4, 500, max_bytes=budget, read_one=True)
        assert read[1] == full[1] == 4 and read[0] >= full[0], (budget, read, full)
