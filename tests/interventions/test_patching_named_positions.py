"""Per-position grids over a task by named position (IO, S1, S2, END) on the IOI generator.

The IOI templates differ in length, so position p is a different token in each row; with
``positions="named"`` each cell patches row i's own labelled position, and equals the
single-pair grid of that row alone at that index.
"""

from __future__ import annotations

import pytest
import torch

from interp.interventions import logit_diff, patch_activations
from interp.tasks import ioi
from tests.task_models import gpt2_like_model

ATOL = 1e-5  # float32 logits of differently shaped batches (kernels sum in another order)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    return gpt2_like_model(tmp_path_factory.mktemp("gpt2-like"))


@pytest.fixture(scope="module")
def task(gpt2):
    task = ioi(gpt2, 6, seed=1)
    lengths = task.tokens(gpt2).lengths
    assert int(lengths.min()) != int(lengths.max())  # rows of different lengths
    return task


def test_named_grids_equal_each_row_alone_at_its_own_position(gpt2, task):
    sites = ["resid_pre", "heads_pos", "heads", "pattern_pos"]
    rows = patch_activations(gpt2, task, sites=sites, positions="named", per_row=True)
    labels = ["IO", "S1", "S2", "END"]
    resid = rows[rows["site"] == "resid_pre"]
    assert sorted(set(resid["pos"])) == sorted(labels)
    batch = task.tokens(gpt2)
    for i in range(len(task)):
        n = int(batch.lengths[i])
        clean, corrupted = batch.clean[i : i + 1, :n], batch.corrupted[i : i + 1, :n]
        metric = logit_diff(batch.answers[i][0], batch.wrong[i][0])
        alone = patch_activations(gpt2, clean, corrupted, metric, sites=sites)
        mine = rows[rows["row"] == i]
        for label in labels:
            index = int(batch.positions[label][i])
            theirs = alone[alone["pos"] == index].set_index(["site", "layer", "head"])["metric"]
            ours = mine[mine["pos"] == label].set_index(["site", "layer", "head"])["metric"]
            assert len(ours) == len(theirs) > 0
            ours = ours.reindex(theirs.index)
            torch.testing.assert_close(
                torch.tensor(ours.to_numpy(dtype=float)),
                torch.tensor(theirs.to_numpy(dtype=float)),
                atol=ATOL,
                rtol=0,
            )
        whole = mine[(mine["site"] == "head") & mine["pos"].isna()]  # heads: all positions
        assert len(whole) == 8
        reference = alone[(alone["site"] == "head") & alone["pos"].isna()]
        reference = reference["metric"].to_numpy(dtype=float)
        torch.testing.assert_close(
            torch.tensor(whole["metric"].to_numpy(dtype=float)),
            torch.tensor(reference),
            atol=ATOL,
            rtol=0,
        )
    means = patch_activations(gpt2, task, sites=["resid_pre"], positions="named")
    per_label = rows[rows["site"] == "resid_pre"].groupby(["layer", "pos"])["metric"].mean()
    indexed = means.set_index(["layer", "pos"])["metric"].reindex(per_label.index)
    torch.testing.assert_close(
        torch.tensor(indexed.to_numpy(dtype=float)),
        torch.tensor(per_label.to_numpy(dtype=float)),
        atol=ATOL,
        rtol=0,
    )
    assert means["recovered_sem"].notna().all()


def test_unequal_lengths_without_named_positions_are_refused(gpt2, task):
    with pytest.raises(ValueError, match="add 'positions' to the rows .* positions=\"named\""):
        patch_activations(gpt2, task, sites=["resid_pre"])
    plain = type(task).from_records(
        [{k: v for k, v in r.items() if k != "positions"} for r in task.to_records()]
    )
    with pytest.raises(ValueError, match="carry no positions; add a 'positions' column"):
        patch_activations(gpt2, plain, sites=["resid_pre"], positions="named")
    with pytest.raises(ValueError, match="positions='named' needs method='exact'"):
        patch_activations(gpt2, task, sites=["resid_pre"], positions="named", method="both")
