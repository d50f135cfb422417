"""Path patching over a task: every row at once equals every row alone.

A task of one row is the single-pair result exactly; the task's means are the means of
single-pair runs (<= 1e-5) with ``recovered_sem`` their standard error; rows of different
lengths (right-padded) give each row's numbers run alone, on learned (GPT-2) and rotary
(GPT-NeoX) positions.
"""

from __future__ import annotations

import math

import pytest
import torch

from interp import load_model
from interp.interventions import logit_diff, path_patch, path_patch_senders
from interp.tasks import Task, induction
from tests.interventions.test_patching_tasks import _records

ATOL = 1e-5  # float32 logits of differently shaped batches (kernels sum in another order)
RECEIVERS = [("head", 1, 0, "k"), ("head", 1, 2, "q"), "logits"]


@pytest.fixture(scope="module")
def bundled():
    return load_model("tiny-induction")


def _pair(record):
    clean, corrupted = (torch.tensor([record[k]]) for k in ("clean", "corrupted"))
    return clean, corrupted, logit_diff(record["answer"], record["wrong"])


def _alone(model, record, **kwargs):
    clean, corrupted, metric = _pair(record)
    return path_patch_senders(model, clean, corrupted, metric=metric, **kwargs)


def _column(result, name="metric"):
    return torch.tensor(result.table[name].to_numpy(dtype=float))


def test_a_task_of_one_row_is_the_single_pair_result(bundled):
    record = _records([9], vocab=2000)[0]
    kwargs = dict(receivers=RECEIVERS, mlps="recompute", senders_per_pass=3)
    ours = path_patch_senders(bundled, Task.from_records([record]), **kwargs)
    theirs = _alone(bundled, record, **kwargs)
    for column in ("metric", "recovered"):  # the same passes: the same numbers, bit for bit
        assert torch.equal(_column(ours, column), _column(theirs, column)), column
    assert ours.table["recovered_sem"].isna().all()  # one row: no spread to estimate
    assert ours.clean_metric == theirs.clean_metric
    assert ours.corrupted_metric == theirs.corrupted_metric
    assert ours.table["sender"].tolist() == theirs.table["sender"].tolist()
    one = path_patch(bundled, Task.from_records([record]), sender=(0, 1), receivers=RECEIVERS)
    clean, corrupted, metric = _pair(record)
    single = path_patch(
        bundled, clean, corrupted, sender=(0, 1), receivers=RECEIVERS, metric=metric
    )
    assert one.table["metric"].tolist() == single.table["metric"].tolist()


def test_the_task_mean_is_the_mean_of_single_pair_runs(bundled):
    task = induction(bundled, 5, seed=1, seq_len=5)  # no wrong answer: the answer's logit
    kwargs = dict(receivers=[("head", 1, 0, "k"), "logits"], direction="noising")
    result = path_patch_senders(bundled, task, **kwargs)
    singles = []
    for row in task:
        clean, corrupted = (torch.tensor([list(p)]) for p in (row.clean, row.corrupted))
        singles.append(
            path_patch_senders(bundled, clean, corrupted, metric=logit_diff(row.answer), **kwargs)
        )
    values = torch.stack([_column(s) for s in singles], dim=1)  # [sender rows]
    c = sum(s.clean_metric for s in singles) / len(singles)
    k = sum(s.corrupted_metric for s in singles) / len(singles)
    assert result.clean_metric == pytest.approx(c, abs=ATOL)
    assert result.corrupted_metric == pytest.approx(k, abs=ATOL)
    assert result.n_rows == 5 and len(result.clean_metric_rows) == 5
    torch.testing.assert_close(_column(result), values.mean(dim=1), atol=ATOL, rtol=0)
    recovered = (values.mean(dim=1) - k) / (c - k)
    torch.testing.assert_close(_column(result, "recovered"), recovered, atol=ATOL, rtol=0)
    sem = values.std(dim=1) / math.sqrt(len(singles)) / abs(c - k)
    torch.testing.assert_close(_column(result, "recovered_sem"), sem, atol=ATOL, rtol=0)
    assert float(sem.max()) > 0.01  # the rows really differ
    rows = path_patch_senders(bundled, task, per_row=True, **kwargs)
    torch.testing.assert_close(_column(rows), values.reshape(-1), atol=ATOL, rtol=0)
    assert rows.table["row"].tolist() == list(range(5)) * len(result.table)
    with pytest.raises(ValueError, match="grid\\(\\) needs one value per sender"):
        rows.grid()


@pytest.mark.parametrize("name", ["gpt2_model", "neox_model"])
@pytest.mark.parametrize("mlps", ["recompute", "freeze"])
def test_padded_rows_give_each_row_alone(name, mlps, request):
    """Rows of 4, 9 and 6 tokens, right-padded to 9: each row's path patch equals it alone."""
    model = request.getfixturevalue(name)
    records = _records([4, 9, 6], seed=2)
    receivers = [("head", 1, 1, "v"), ("head", 1, 3, "k"), "logits"]
    if mlps == "freeze":
        receivers.append(("mlp", 1))
    senders = [(0, h) for h in range(4)] + [("mlp", 0)]
    kwargs = dict(receivers=receivers, mlps=mlps, senders=senders, senders_per_pass=2)
    rows = path_patch_senders(model, Task.from_records(records), per_row=True, **kwargs)
    for i, record in enumerate(records):
        alone = _alone(model, record, **kwargs)
        mine = rows.table[rows.table["row"] == i]
        torch.testing.assert_close(
            torch.tensor(mine["metric"].to_numpy(dtype=float)), _column(alone), atol=ATOL, rtol=0
        )
        assert rows.clean_metric_rows[i] == pytest.approx(alone.clean_metric, abs=ATOL)


def test_task_arguments_are_checked_in_the_users_terms(bundled):
    task = induction(bundled, 2, seed=0, seq_len=4)
    with pytest.raises(ValueError, match="over a task, metric is one of logit_diff, prob_diff"):
        path_patch(bundled, task, sender=(0, 1), receivers="logits", metric=logit_diff(1, 2))
    with pytest.raises(ValueError, match="a task carries each row's corrupted prompt"):
        path_patch(bundled, task, "x", sender=(0, 1), receivers="logits")
    with pytest.raises(ValueError, match="per_row=True is for a task"):
        path_patch(
            bundled,
            "a b",
            "a c",
            sender=(0, 1),
            receivers="logits",
            metric=logit_diff(1, 2),
            per_row=True,
        )
    with pytest.raises(TypeError, match="needs clean, corrupted and metric"):
        path_patch(bundled, "a b", "a c", sender=(0, 1), receivers="logits")
