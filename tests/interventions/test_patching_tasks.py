"""patch_activations over a task: every row at once equals every row alone.

Six proofs: a task of one row is the single-pair grid; N copies of a row are that row; the
task's means are the means of single-pair runs; rows of different lengths (right-padded) give
each row's numbers run alone, on learned (GPT-2) and rotary (GPT-NeoX) positions; a split
under a small budget is one pass; per-row tables average back to the means.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from interp import load_model
from interp.engine import (
    Intervention,
    MemoryBudgetError,
    Site,
    estimate_cache_bytes,
    estimate_forward_bytes,
    estimate_loss_bytes,
    run_patched,
)
from interp.interventions import logit_diff, patch_activations
from interp.tasks import Task, induction

ATOL = 1e-5  # float32 logits of differently shaped batches (kernels sum in another order)
KEYS = ["site", "layer", "head", "pos", "method"]


@pytest.fixture(scope="module")
def bundled():
    return load_model("tiny-induction")


def _records(lengths, *, seed=0, vocab=300, changed=2):
    """Token-id rows of the given lengths; the corrupted prompt differs in ``changed`` early
    tokens. Ids are run as given (no BOS), so a row means the same alone and in a task."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        clean = torch.randint(1, vocab, (n,), generator=gen)
        corrupted = clean.clone()
        corrupted[:changed] = torch.randint(1, vocab, (changed,), generator=gen)
        answer, wrong = torch.randperm(vocab - 1, generator=gen)[:2] + 1
        rows.append(
            {
                "clean": clean.tolist(),
                "corrupted": corrupted.tolist(),
                "answer": int(answer),
                "wrong": int(wrong),
            }
        )
    return rows


def _alone(model, record, **kwargs):
    """The single-pair grid of one row (today's form)."""
    clean, corrupted = (torch.tensor([record[k]]) for k in ("clean", "corrupted"))
    metric = logit_diff(record["answer"], record["wrong"])
    return patch_activations(model, clean, corrupted, metric, **kwargs)


def _column(frame, name="metric"):
    return torch.tensor(frame[name].to_numpy(dtype=float))


def _recovered_atol(frame) -> float:
    """ATOL in units of recovered: metrics ATOL apart differ by ATOL / |clean - corrupted| (the
    random test models' clean and corrupted runs are often close)."""
    return 3 * ATOL / abs(frame.attrs["clean_metric"] - frame.attrs["corrupted_metric"])


def test_a_task_of_one_row_is_the_single_pair_grid(bundled):
    record = _records([9], vocab=2000)[0]
    kwargs = dict(sites=["resid_pre", "heads", "pattern"], method="both")
    ours = patch_activations(bundled, Task.from_records([record]), **kwargs)
    theirs = _alone(bundled, record, **kwargs)
    pd.testing.assert_frame_equal(ours[KEYS], theirs[KEYS])
    exact = torch.tensor((ours["method"] == "exact").tolist())
    for column, atol in (("metric", ATOL), ("recovered", _recovered_atol(ours))):
        # float rounding apart, not bit for bit: the task's patched runs start at their first
        # patched position over the base run's keys and values (interp.engine.suffix), the
        # pair's run every position (kernels sum in another order for another shape)
        torch.testing.assert_close(
            _column(ours, column)[exact], _column(theirs, column)[exact], atol=atol, rtol=0
        )
        # attribution adds its estimate to the base run's metric from an inference pass here,
        # from the gradient pass for one pair
        torch.testing.assert_close(
            _column(ours, column)[~exact], _column(theirs, column)[~exact], atol=1e-6, rtol=0
        )
    assert ours["recovered_sem"].isna().all()  # one row: no spread to estimate
    for key in ("clean_metric", "corrupted_metric"):
        assert ours.attrs[key] == theirs.attrs[key], key
    for key in ("metric_name", "direction", "recovered_undefined", "n_tokens"):
        assert ours.attrs[key] == theirs.attrs[key], key
    assert ours.attrs["n_rows"] == 1


def test_n_identical_rows_are_one_row(gpt2_model):
    record = _records([7])[0]
    kwargs = dict(sites=["resid_pre", "heads"], direction="noising")
    one = patch_activations(gpt2_model, Task.from_records([record]), **kwargs)
    four = patch_activations(gpt2_model, Task.from_records([record] * 4), **kwargs)
    torch.testing.assert_close(_column(four), _column(one), atol=ATOL, rtol=0)
    torch.testing.assert_close(
        _column(four, "recovered"), _column(one, "recovered"), atol=_recovered_atol(one), rtol=0
    )
    assert float(four["recovered_sem"].abs().max()) < 1e-5  # no spread between copies


def test_the_task_mean_is_the_mean_of_single_pair_runs(bundled):
    task = induction(bundled, 5, seed=1, seq_len=5)  # rows of one length; no wrong answer
    kwargs = dict(sites=["resid_pre", "heads"])
    frame = patch_activations(bundled, task, **kwargs)
    singles = []
    for row in task:
        clean, corrupted = (torch.tensor([list(p)]) for p in (row.clean, row.corrupted))
        singles.append(
            patch_activations(bundled, clean, corrupted, logit_diff(row.answer), **kwargs)
        )
    values = torch.stack([_column(s) for s in singles], dim=1)  # [site rows]
    c = sum(s.attrs["clean_metric"] for s in singles) / len(singles)
    k = sum(s.attrs["corrupted_metric"] for s in singles) / len(singles)
    assert frame.attrs["clean_metric"] == pytest.approx(c, abs=ATOL)
    assert frame.attrs["corrupted_metric"] == pytest.approx(k, abs=ATOL)
    torch.testing.assert_close(_column(frame), values.mean(dim=1), atol=ATOL, rtol=0)
    torch.testing.assert_close(
        _column(frame, "recovered"), (values.mean(dim=1) - k) / (c - k), atol=ATOL, rtol=0
    )
    sem = values.std(dim=1) / math.sqrt(len(singles)) / abs(c - k)
    torch.testing.assert_close(_column(frame, "recovered_sem"), sem, atol=ATOL, rtol=0)
    assert frame.attrs["metric_name"] == "answer_logit" and frame.attrs["n_rows"] == 5


@pytest.mark.parametrize("name", ["gpt2_model", "neox_model"])
def test_padded_rows_give_each_row_alone(name, request):
    """Rows of 4, 9 and 6 tokens, right-padded to 9: every per-head grid (patches at all
    positions, so pad positions are written too) equals each row run alone."""
    model = request.getfixturevalue(name)
    records = _records([4, 9, 6], seed=2)
    task = Task.from_records(records)
    kwargs = dict(sites=["heads", "q", "k", "v", "pattern"], direction="denoising")
    rows = patch_activations(model, task, per_row=True, **kwargs)
    for i, record in enumerate(records):
        alone = _alone(model, record, **kwargs)
        mine = rows[rows["row"] == i]
        torch.testing.assert_close(_column(mine), _column(alone), atol=ATOL, rtol=0)
        torch.testing.assert_close(
            _column(mine, "recovered"),
            _column(alone, "recovered"),
            atol=_recovered_atol(alone),
            rtol=0,
        )
    # attribution over the padded task: the mean of each row's own estimate
    estimate = patch_activations(model, task, method="attribution", **kwargs)
    singles = [_alone(model, r, method="attribution", **kwargs) for r in records]
    mean = torch.stack([_column(s) for s in singles], dim=1).mean(dim=1)
    torch.testing.assert_close(_column(estimate), mean, atol=ATOL, rtol=0)


def test_a_split_under_a_small_budget_is_one_pass(gpt2_model):
    task = Task.from_records(_records([6, 8, 8, 5, 7], seed=3))
    kwargs = dict(sites=["heads", "v"], direction="denoising")
    one = patch_activations(gpt2_model, task, **kwargs)
    n_rows, n_pos = len(task), 8
    names = sorted({f"blocks.{layer}.attn.hook_{h}" for layer in range(2) for h in "zv"})
    held = estimate_cache_bytes(gpt2_model, (n_rows, n_pos), hooks=names, keep_logits=True)
    per_run = max(
        estimate_forward_bytes(gpt2_model, (1, n_pos)), estimate_loss_bytes(gpt2_model, (1, n_pos))
    )
    passes = []
    gpt2_model.add_hook("blocks.0.hook_resid_pre", lambda act, hook: passes.append(act.shape[0]))
    try:
        budgeted = patch_activations(
            gpt2_model, task, max_bytes=held + int(3 * per_run / 0.9), **kwargs
        )
        counted = len(passes)
        rows_split = patch_activations(gpt2_model, task, max_rows=2, **kwargs)
    finally:
        gpt2_model.reset_hooks()
    assert counted - 2 > 4  # really split (2 passes are the source and base runs)
    assert max(passes[counted + 2 :]) == 2  # max_rows=2 < 5 rows: one run over 2 rows at a time
    for split in (budgeted, rows_split):
        pd.testing.assert_frame_equal(split[KEYS], one[KEYS])
        torch.testing.assert_close(_column(split), _column(one), atol=ATOL, rtol=0)
        for column in ("recovered", "recovered_sem"):
            torch.testing.assert_close(
                _column(split, column), _column(one, column), atol=_recovered_atol(one), rtol=0
            )


def test_per_row_tables_average_back_to_the_means(bundled):
    task = induction(bundled, 4, seed=0, seq_len=6)
    kwargs = dict(sites=["resid_pre", "heads"], direction="noising")
    means = patch_activations(bundled, task, metric="prob_diff", **kwargs)
    rows = patch_activations(bundled, task, metric="prob_diff", per_row=True, **kwargs)
    assert list(rows.columns) == [*KEYS[:4], "row", "method", "metric", "recovered"]
    assert sorted(set(rows["row"])) == [0, 1, 2, 3] and len(rows) == 4 * len(means)
    averaged = rows.groupby(KEYS, dropna=False, sort=False)["metric"].mean().reset_index()
    pd.testing.assert_frame_equal(averaged[KEYS], means[KEYS])
    torch.testing.assert_close(_column(averaged), _column(means), atol=1e-9, rtol=0)
    for key in ("clean", "corrupted"):
        per = rows.attrs[f"{key}_metric_rows"]
        assert sum(per) / len(per) == pytest.approx(means.attrs[f"{key}_metric"], abs=1e-12)
    index = torch.tensor(rows["row"].tolist())
    clean, corrupted = (
        torch.tensor(rows.attrs[f"{key}_metric_rows"], dtype=torch.float64)[index]
        for key in ("clean", "corrupted")
    )
    own = (_column(rows) - corrupted) / (clean - corrupted)  # each row's own recovered
    torch.testing.assert_close(_column(rows, "recovered"), own, atol=1e-9, rtol=0)


def test_refusals_are_one_line(gpt2_model):
    task = Task.from_records(_records([4, 6]))
    cases = [
        (dict(sites=["resid_pre"]), "different token in each row; add .positions. to the rows"),
        (dict(sites=["heads"], per_row=True, method="both"), "per_row=True needs method='exact'"),
        (dict(sites=["heads"], metric=logit_diff(1, 2)), "over a task, metric is one of"),
        (dict(sites=["heads"], metric="loss"), "over a task, metric is one of"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            patch_activations(gpt2_model, task, **kwargs)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="without corrupted"):
        patch_activations(gpt2_model, task, task)
    with pytest.raises(TypeError, match="or a Task"):
        patch_activations(gpt2_model, torch.tensor([[1, 2, 3]]))
    pair = (torch.tensor([[1, 2, 3]]), torch.tensor([[4, 2, 3]]), logit_diff(1, 2))
    with pytest.raises(ValueError, match="per_row=True is for a task"):
        patch_activations(gpt2_model, *pair, per_row=True)
    with pytest.raises(MemoryBudgetError, match="source run's cache of the 2 patched hooks over 2"):
        patch_activations(gpt2_model, task, sites=["heads"], max_bytes="1KB")
    with pytest.raises(MemoryBudgetError, match="over all 2 rows .* cannot be split yet"):
        patch_activations(gpt2_model, task, sites=["heads"], method="both", max_bytes="100KB")
    batch = task.tokens(gpt2_model)
    mean = [[Intervention(Site("head", 0, head=0), "mean")]]
    with pytest.raises(ValueError, match="would mix the rows of a pass"):
        run_patched(gpt2_model, batch.clean, mean, row_metric=lambda logits, rows: logits[:, -1, 0])


def test_one_prompt_and_its_row_run_the_same_passes_bit_for_bit(gpt2_model):
    tokens = torch.tensor([[1, 5, 9, 3, 7, 2]])
    runs = [[Intervention(Site("resid_pre", i // 3, pos=i % 3), "zero")] for i in range(6)] + [[]]
    metric = logit_diff(5, 7)
    one = run_patched(gpt2_model, tokens, runs, metric, max_rows=4)
    rows = run_patched(
        gpt2_model, tokens, runs, row_metric=lambda logits, rows: metric(logits), max_rows=4
    )
    assert rows.shape == (len(runs), 1) and one.shape == (len(runs),)
    assert torch.equal(one, rows[:, 0])  # the one-prompt door is the rows form, not a twin
    with pytest.raises(TypeError, match="pass metric .* or row_metric"):
        run_patched(gpt2_model, tokens, runs, metric, row_metric=lambda logits, rows: logits)
