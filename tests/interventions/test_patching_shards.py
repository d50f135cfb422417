"""Sharding a task: the merged partial sums of 3 shards are the whole run (within float64
rounding of the sums), and merging refuses shards that do not make one run."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from interp import patch_activations
from interp.interventions.shards import (
    KEYS,
    merge_partial_sums,
    shard_rows,
    task_partial_sums,
)
from interp.tasks import induction

EXACT_ATOL = 1e-6  # the same float32 per-row metrics, summed in float64 in another order
ATTRIBUTION_ATOL = 1e-5  # float32 gradients of each shard's mean, recombined by row count


@pytest.fixture(scope="module")
def task(bundled_model):
    return induction(bundled_model, 10, seed=0, seq_len=6)


def shards(model, task, count, **kwargs):
    # through JSON, as the files written by interp patch --shard are
    return [
        json.loads(json.dumps(task_partial_sums(model, task, shard=(i, count), **kwargs)))
        for i in range(count)
    ]


def assert_same(whole: pd.DataFrame, merged: pd.DataFrame, atol: float) -> None:
    assert list(merged.columns) == list(whole.columns)
    pd.testing.assert_frame_equal(merged[KEYS], whole[KEYS])
    for column in ("metric", "recovered", "recovered_sem"):
        a, b = whole[column].to_numpy(float), merged[column].to_numpy(float)
        assert np.array_equal(np.isnan(a), np.isnan(b)), column
        assert np.nanmax(np.abs(a - b)) <= atol, column
    for key in ("clean_metric", "corrupted_metric", "n_rows", "n_tokens", "metric_name"):
        assert merged.attrs[key] == pytest.approx(whole.attrs[key], abs=1e-12), key
    for key in ("clean_metric_rows", "corrupted_metric_rows", "answer_rank_rows", "sanity"):
        assert merged.attrs[key] == whole.attrs[key], key


def test_three_shards_merge_into_the_whole_run(bundled_model, task):
    kwargs = dict(sites=["heads", "resid_pre"], direction="denoising")
    whole = patch_activations(bundled_model, task, **kwargs)
    parts = shards(bundled_model, task, 3, **kwargs)
    assert [p["rows"] for p in parts] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert_same(whole, merge_partial_sums(parts[::-1]), EXACT_ATOL)  # any order


def test_attribution_and_noising_shards(bundled_model, task):
    kwargs = dict(sites=["heads"], direction="noising", method="both", metric="prob_diff")
    whole = patch_activations(bundled_model, task, **kwargs)
    merged = merge_partial_sums(shards(bundled_model, task, 3, **kwargs))
    exact = whole["method"] == "exact"
    assert_same(whole[exact], merged[exact.to_numpy()], EXACT_ATOL)
    attribution = merged[~exact.to_numpy()]
    assert np.abs(attribution["metric"].to_numpy() - whole[~exact]["metric"].to_numpy()).max() < (
        ATTRIBUTION_ATOL
    )


def test_one_shard_is_the_whole_run(bundled_model, task):
    whole = patch_activations(bundled_model, task, sites=["heads"])
    assert_same(whole, merge_partial_sums(shards(bundled_model, task, 1, sites=["heads"])), 1e-9)


def test_shard_rows():
    assert shard_rows(7, 2, 3) == [2, 5]
    with pytest.raises(ValueError, match="has no rows: the task has 2"):
        shard_rows(2, 2, 3)
    with pytest.raises(ValueError, match="index must lie in 0 to 2"):
        shard_rows(7, 3, 3)


def test_merge_refuses_what_is_not_one_run(bundled_model, task):
    parts = shards(bundled_model, task, 2, sites=["heads"])
    with pytest.raises(ValueError, match=r"shard\(s\) 1 missing"):
        merge_partial_sums(parts[:1])
    with pytest.raises(ValueError, match=r"shard\(s\) 0 given twice"):
        merge_partial_sums([parts[0], parts[0], parts[1]])
    other = shards(
        bundled_model, induction(bundled_model, 10, seed=1, seq_len=6), 2, sites=["heads"]
    )
    with pytest.raises(ValueError, match="differs from partial 1 in task"):
        merge_partial_sums([parts[0], other[1]])
    with pytest.raises(ValueError, match="not a partial result of interp patch"):
        merge_partial_sums([{"format": "x"}])
