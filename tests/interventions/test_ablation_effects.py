"""ablation_effects over a task: every row at once equals every row alone.

A task of one row is the one-prompt result exactly; zero ablation's means are the means of
one-prompt runs (<= 1e-5) with ``effect_sem`` their standard error; mean ablation uses the mean
over every real token of every row, checked against that mean computed from the rows run alone;
rows of different lengths (right-padded) give each row's numbers run alone.
"""

from __future__ import annotations

import math

import pytest
import torch

from interp import load_model, run_cached
from interp.interventions import logit_diff
from interp.interventions.ablate import ablation_effects
from interp.tasks import Task, induction
from tests.interventions.test_patching_tasks import _records

ATOL = 1e-5  # float32 logits of differently shaped batches (kernels sum in another order)


@pytest.fixture(scope="module")
def bundled():
    return load_model("tiny-induction")


def _column(frame, name="metric"):
    return torch.tensor(frame[name].to_numpy(dtype=float))


def _alone(model, record, **kwargs):
    metric = logit_diff(record["answer"], record["wrong"])
    return ablation_effects(model, torch.tensor([record["clean"]]), metric, **kwargs)


@pytest.mark.parametrize("ablation", ["zero", "mean"])
def test_a_task_of_one_row_is_the_one_prompt_result(bundled, ablation):
    record = _records([9], vocab=2000)[0]
    kwargs = dict(sites=["heads", "attn", "mlp"], ablation=ablation)
    ours = ablation_effects(bundled, Task.from_records([record]), **kwargs)
    theirs = _alone(bundled, record, **kwargs)
    for column in ("metric", "effect"):
        assert torch.equal(_column(ours, column), _column(theirs, column)), column
    assert ours["effect_sem"].isna().all() and ours.attrs["n_rows"] == 1
    assert ours.attrs["clean_metric"] == theirs.attrs["clean_metric"]
    assert ours.attrs["metric_name"] == theirs.attrs["metric_name"] == "logit_diff"


def test_zero_ablation_means_are_the_means_of_one_prompt_runs(bundled):
    task = induction(bundled, 5, seed=1, seq_len=5)
    frame = ablation_effects(bundled, task, ablation="zero", sites=["heads", "mlp"])
    singles = [
        ablation_effects(
            bundled,
            torch.tensor([list(row.clean)]),
            logit_diff(row.answer),
            ablation="zero",
            sites=["heads", "mlp"],
        )
        for row in task
    ]
    effects = torch.stack([_column(s, "effect") for s in singles], dim=1)
    torch.testing.assert_close(_column(frame, "effect"), effects.mean(dim=1), atol=ATOL, rtol=0)
    sem = effects.std(dim=1) / math.sqrt(len(singles))
    torch.testing.assert_close(_column(frame, "effect_sem"), sem, atol=ATOL, rtol=0)
    values = torch.stack([_column(s) for s in singles], dim=1)
    torch.testing.assert_close(_column(frame), values.mean(dim=1), atol=ATOL, rtol=0)
    induction_head = frame[(frame["layer"] == 1) & (frame["head"] == 0)]
    assert float(induction_head["effect"].iloc[0]) < -3  # the induction head matters


@pytest.mark.parametrize("name", ["gpt2_model", "neox_model"])
def test_padded_rows_and_the_dataset_mean(name, request):
    """Rows of 4, 9 and 6 tokens: zero ablation per row equals each row alone, and mean
    ablation sets a head to its mean over the 19 real tokens, computed from the rows alone."""
    model = request.getfixturevalue(name)
    records = _records([4, 9, 6], seed=2)
    task = Task.from_records(records)
    rows = ablation_effects(model, task, ablation="zero", per_row=True, sites=["heads", "mlp"])
    assert list(rows.columns) == [
        "site",
        "layer",
        "head",
        "pos",
        "row",
        "method",
        "metric",
        "effect",
    ]
    for i, record in enumerate(records):
        alone = _alone(model, record, ablation="zero", sites=["heads", "mlp"])
        mine = rows[rows["row"] == i]
        torch.testing.assert_close(_column(mine), _column(alone), atol=ATOL, rtol=0)
    hook = "blocks.1.attn.hook_z"
    acts = [run_cached(model, torch.tensor([r["clean"]]), hooks=[hook])[hook][0] for r in records]
    mean = torch.cat(acts).mean(dim=0)[2]  # head 2's z over the real tokens of all rows

    def set_mean(act, hook):
        act = act.clone()
        act[:, :, 2] = mean
        return act

    expected = []
    for record in records:
        logits = run_cached(
            model, torch.tensor([record["clean"]]), interventions=[(hook, set_mean)]
        )
        expected.append(float(logit_diff(record["answer"], record["wrong"])(logits.logits)[0]))
    frame = ablation_effects(model, task, ablation="mean", layers=[1])
    value = frame[frame["head"] == 2]["metric"].iloc[0]
    assert value == pytest.approx(sum(expected) / len(expected), abs=ATOL)


def test_arguments_are_checked_in_the_users_terms(bundled):
    task = induction(bundled, 2, seed=0, seq_len=4)
    with pytest.raises(ValueError, match="over a task, metric is one of"):
        ablation_effects(bundled, task, logit_diff(1, 2))
    with pytest.raises(ValueError, match="ablation must be one of zero, mean"):
        ablation_effects(bundled, task, ablation="resample")
    with pytest.raises(ValueError, match="unknown sites"):
        ablation_effects(bundled, task, sites=["resid_pre"])
    with pytest.raises(TypeError, match="needs a prompt and a metric callable"):
        ablation_effects(bundled, "a b")
    with pytest.raises(ValueError, match="per_row=True is for a task"):
        ablation_effects(bundled, "a b", logit_diff(1, 2), per_row=True)
