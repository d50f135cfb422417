"""logit_attribution over a task: each row's own answer minus wrong at its own last token.

A prompt alone is a batch of that one prompt, and a task of one row the one-prompt table,
exactly (the same operations: interp.attribution.rows is the one path); per row, the components
add up to that row's logit difference as the padded batch computes it; the task's means are the
means of one-prompt attributions (<= 1e-5), over rows of different lengths.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from interp import fold_layernorm, load_model, logit_attribution, logit_attribution_batch
from interp.tasks import Task, greater_than
from tests.interventions.test_patching_tasks import _records

ATOL = 1e-5  # float32 activations summed in float64, batches of different shapes


@pytest.fixture(scope="module")
def bundled():
    return load_model("tiny-induction")


def _alone(model, record):
    return logit_attribution(
        model, torch.tensor([record["clean"]]), record["answer"], wrong=record["wrong"]
    )


def test_a_task_of_one_row_is_the_one_prompt_table(bundled):
    record = _records([9], vocab=2000)[0]
    ours = logit_attribution(bundled, Task.from_records([record]))
    theirs = _alone(bundled, record)
    keys = ["component", "layer", "head"]
    assert ours[keys].equals(theirs[keys])
    assert ours["contribution"].tolist() == theirs["contribution"].tolist()
    assert ours["contribution_sem"].isna().all() and ours.attrs["n_rows"] == 1


@pytest.mark.parametrize("name", ["gpt2_model", "neox_model"])
def test_a_prompt_alone_is_a_batch_of_one_to_the_bit(name, request):
    model = request.getfixturevalue(name)
    prompt = torch.tensor([_records([7], seed=3)[0]["clean"]])
    folded = fold_layernorm(model)
    for which, kwargs in [
        (model, {}),
        (model, {"wrong": 9}),
        (model, {"wrong": 9, "pos": -3, "neurons": True}),
        (folded, {"wrong": 9}),
    ]:
        alone = logit_attribution(which, prompt, 8, **kwargs)
        batch = logit_attribution_batch(which, [prompt], 8, **kwargs)
        assert (batch["prompt"] == 0).all()
        pd.testing.assert_frame_equal(batch.drop(columns="prompt"), alone, check_exact=True)
        assert batch.attrs["prompts"] == [alone.attrs]


@pytest.mark.parametrize("name", ["gpt2_model", "neox_model"])
def test_each_row_adds_up_to_its_own_logit_difference_and_means_are_single_means(name, request):
    model = request.getfixturevalue(name)
    records = _records([4, 9, 6], seed=2)
    task = Task.from_records(records)
    rows = logit_attribution(model, task, per_row=True)
    batch = task.tokens(model)
    with torch.inference_mode():
        diffs = batch.logit_diff(model(batch.clean))  # padded batch, read at each last token
    parts = rows[rows["component"] != "total"].groupby("row")["contribution"].sum()
    torch.testing.assert_close(torch.tensor(parts.to_numpy()), diffs.double(), atol=1e-4, rtol=0)
    singles = [_alone(model, r) for r in records]
    values = torch.stack([torch.tensor(s["contribution"].to_numpy()) for s in singles], dim=1)
    means = logit_attribution(model, task)
    torch.testing.assert_close(
        torch.tensor(means["contribution"].to_numpy()), values.mean(dim=1), atol=ATOL, rtol=0
    )
    sem = values.std(dim=1) / math.sqrt(len(records))
    torch.testing.assert_close(
        torch.tensor(means["contribution_sem"].to_numpy()), sem, atol=ATOL, rtol=0
    )
    assert float(sem.max()) > 0.01  # the rows really differ
    assert means.attrs["reference_rows"] == pytest.approx(diffs.tolist(), abs=1e-4)


def test_list_answers_and_stray_arguments_are_refused(bundled):
    with pytest.raises(ValueError, match=r"row 1: the answer is a list of \d+ tokens"):
        logit_attribution(bundled, greater_than(bundled, 2, seed=0))
    task = Task.from_records(_records([5], vocab=2000))
    with pytest.raises(ValueError, match="a task carries each row's answer"):
        logit_attribution(bundled, task, " data")
    with pytest.raises(ValueError, match="per_row=True is for a task"):
        logit_attribution(bundled, "a b", " data", per_row=True)
