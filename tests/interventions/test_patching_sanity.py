"""Sanity of the experiment: each warning fires on a task or pair built to trip it, names the
rows (1-based) or shows the rank, and stays silent where the bundled model does the task."""

from __future__ import annotations

import pytest

from interp import Task, patch_activations
from interp.interventions import answer_loss, logit_diff, probability
from interp.interventions.sanity import MAX_RANK, answer_ranks, sanity_warnings
from interp.tasks import induction

GOOD_CLEAN = "the data open path of the data open"  # docs/interventions.md: the model says " path"
GOOD_CORRUPTED = "the data value path of the data open"


def token(model, text: str) -> int:
    return int(model.to_tokens(text, prepend_bos=False)[0, 0])


# -- the function alone ------------------------------------------------------------------


def test_silent_on_good_numbers():
    assert sanity_warnings([5.0, 6.0, 7.0], [0.0, 0.5, 1.0], ranks=[1, 2, 1]) == []


def test_rows_not_above_are_named_one_based():
    (warning,) = [
        w for w in sanity_warnings([5.0, 1.0, 6.0, 0.2], [0.0, 2.0, 0.5, 0.2]) if "not above" in w
    ]
    assert "2 of 4 rows: row 2, 4" in warning


def test_the_gap_is_compared_with_the_metrics_size():
    assert sanity_warnings([10.0], [9.9]) != []  # 1% of 10: too small
    assert sanity_warnings([10.0], [5.0]) == []
    (warning,) = sanity_warnings([10.0], [9.9])
    assert "gap is too small" in warning and "clean 10, corrupted 9.9" in warning


def test_a_gap_within_its_standard_error_is_flagged():
    clean, corrupted = [3.0, -2.0, 4.0, -1.5], [0.0, 0.0, 0.0, 0.0]
    warnings = sanity_warnings(clean, corrupted)
    assert any("standard errors" in w for w in warnings)


def test_poor_ranks_are_shown():
    (warning,) = sanity_warnings([5.0, 6.0, 7.0], [0.0, 0.0, 0.0], ranks=[1, 57, MAX_RANK + 1])
    assert "2 of 3 rows: row 2 (rank 57), 3 (rank 11)" in warning


def test_lower_is_better_for_a_loss():
    assert sanity_warnings([0.5], [4.0], higher_is_better=False) == []
    assert any("not below" in w for w in sanity_warnings([4.0], [0.5], higher_is_better=False))


def test_answer_ranks_by_hand():
    import torch

    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 1.0, 1.0, 0.0]])
    assert answer_ranks(logits, [[2], [1, 3]]) == [3, 2]


# -- attached by patch_activations -------------------------------------------------------


@pytest.fixture(scope="module")
def good_task(bundled_model):
    return induction(bundled_model, 8, seed=0, seq_len=8)


def test_silent_on_the_bundled_induction_task(bundled_model, good_task):
    frame = patch_activations(bundled_model, good_task, sites=["heads"])
    assert frame.attrs["sanity"] == []


def test_swapped_rows_of_a_task_are_named(bundled_model, good_task):
    records = good_task.to_records()
    for i in (1, 4):  # rows 2 and 5: the corrupted prompt is the one with the repeat
        records[i]["clean"], records[i]["corrupted"] = records[i]["corrupted"], records[i]["clean"]
    frame = patch_activations(bundled_model, Task.from_records(records), sites=["heads"])
    (warning,) = [w for w in frame.attrs["sanity"] if "not above" in w]
    assert "2 of 8 rows: row 2, 5" in warning


def test_a_wrong_answer_on_a_task_shows_its_rank(bundled_model, good_task):
    records = good_task.to_records()
    records[2]["answer"] = records[2]["corrupted"][1]  # a token the clean prompt never predicts
    frame = patch_activations(bundled_model, Task.from_records(records), sites=["heads"])
    assert any("row 3 (rank" in w for w in frame.attrs["sanity"])


def test_a_pair_the_model_does_is_silent(bundled_model):
    m = bundled_model
    for metric in (
        logit_diff(token(m, " path"), token(m, " value")),
        probability(token(m, " path")),
        answer_loss(token(m, " path")),
    ):
        frame = patch_activations(m, GOOD_CLEAN, GOOD_CORRUPTED, metric, sites=["heads"])
        assert frame.attrs["sanity"] == [], metric


def test_a_pair_the_model_does_not_do_warns(bundled_model):
    m = bundled_model
    swapped = patch_activations(
        m, GOOD_CORRUPTED, GOOD_CLEAN, logit_diff(token(m, " path"), token(m, " value"))
    )
    assert any("not above" in w and "clean" in w for w in swapped.attrs["sanity"])
    unlikely = patch_activations(m, GOOD_CLEAN, GOOD_CORRUPTED, probability(token(m, " the")))
    assert any("ranked poorly" in w and "(rank " in w for w in unlikely.attrs["sanity"])
