"""Task-level analyses with ``executor=``: the shards run in workers that load the model from its
checkpoint, and the merge is the one ``interp merge`` uses. Bit for bit what the same shards
give merged in this process (the same operations in the same order); within float rounding of
the whole run (the sums of a shard's rows are taken in another order than one mean over all)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from interp import Task, discover_circuit, patch_activations
from interp.discovery.shards import discovery_partial_sums, merge_discovery_sums
from interp.foundation.executors import Sharding
from interp.interventions.shards import merge_partial_sums, task_partial_sums
from interp.models.workers import model_source
from interp.tasks import induction
from tests.forked import forked_workers

# float32 metrics summed over <= 9 rows in float64, divided by C - K ~ 1: rounding of the order
ATOL = 1e-6


@pytest.fixture(scope="module")
def task(bundled_model) -> Task:
    return induction(bundled_model, 6, seed=3, seq_len=5)


@pytest.mark.slow
def test_discover_circuit_on_ray_equals_the_shards_and_the_whole_run(
    ray_cluster, bundled_model, task, tmp_path
):
    sharding = Sharding("ray", shards=3, work_dir=str(tmp_path / "work"), progress=False)
    circuit = discover_circuit(
        bundled_model, task, "eap-ig", top_n=8, ig_steps=3, executor=sharding
    )
    parts = [discovery_partial_sums(bundled_model, task, "eap-ig", shard=(i, 3), ig_steps=3)
             for i in range(3)]  # fmt: skip
    here = merge_discovery_sums(parts)
    assert circuit.scores["score"].tolist() == here["score"].tolist()  # bit for bit
    whole = discover_circuit(bundled_model, task, "eap-ig", top_n=8, ig_steps=3)
    assert np.allclose(circuit.scores["score"], whole.scores["score"], atol=ATOL, rtol=0)
    assert circuit.edges == whole.edges and circuit.params == whole.params
    assert sorted(p.name for p in (tmp_path / "work").glob("shard-*")) == [
        f"shard-{i}-of-3.json" for i in range(3)
    ]


@pytest.mark.slow
def test_patch_activations_on_local_processes_equals_the_whole_run(
    bundled_model, task, fork_server, monkeypatch
):
    forked_workers(monkeypatch, fork_server)  # two worker processes, forked from a warm server
    frame = patch_activations(
        bundled_model, task, sites=["resid_pre"], executor=Sharding("local", 2, progress=False)
    )
    parts = [task_partial_sums(bundled_model, task, shard=(i, 2)) for i in range(2)]
    here = merge_partial_sums(parts)
    pd.testing.assert_frame_equal(frame, here, check_exact=True)
    whole = patch_activations(bundled_model, task, sites=["resid_pre"])
    # the metrics are float32 logit differences up to ~13, not ~1: a whole run batches its rows
    # otherwise than the shards, so each can round a few float32 ulps of that scale apart
    metric_atol = 16 * float(np.finfo(np.float32).eps) * float(whole["metric"].abs().max())
    assert np.allclose(frame["metric"], whole["metric"], atol=metric_atol, rtol=0)
    assert np.allclose(frame["recovered"], whole["recovered"], atol=ATOL, rtol=0)


def test_what_executors_refuse(bundled_model, task):
    assert model_source(bundled_model).endswith("tiny-induction")
    with pytest.raises(ValueError, match="takes max_bytes"):
        discover_circuit(bundled_model, task, "eap", top_n=3, max_rows=4, executor="local")
    with pytest.raises(ValueError, match="acdc' has no shards"):
        discover_circuit(bundled_model, task, "acdc", threshold=0.1, executor="local")
    with pytest.raises(ValueError, match="needs a Task"):
        discover_circuit(bundled_model, task.tokens(bundled_model), "eap", top_n=3,
                         executor="local")  # fmt: skip
    with pytest.raises(ValueError, match="leave out per_row"):
        patch_activations(bundled_model, task, per_row=True, executor="local")
    with pytest.raises(ValueError, match="executor must be one of local, ray, slurm"):
        Sharding("kubernetes")
