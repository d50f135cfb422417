"""What moved or was renamed in 0.6.0 still works from its old path for one release, and says
so with a DeprecationWarning naming the new home (CHANGELOG.md, 0.6.0)."""

from __future__ import annotations

import importlib
import sys

import pytest

from interp.tasks import induction

OLD_MODULES = {  # old path -> (a name it still gives, that name's new home)
    "interp.tasks.sharded": ("run_task_shards", "interp.tasks.shard_jobs"),
    "interp.interventions.attribution": (
        "attribution_deltas",
        "interp.interventions.attribution_patching",
    ),
}
OLD_NAMES = {  # (module, old name) -> (new home, new name)
    ("interp.attribution.core", "resolve_token"): ("interp.engine.tokens", "resolve_token"),
    ("interp.discovery", "Graph"): ("interp.discovery", "EdgeGraph"),
    ("interp.discovery.graph", "Graph"): ("interp.discovery.graph", "EdgeGraph"),
    ("interp.graphs.interventions", "FINAL"): ("interp.graphs.frozen", "FINAL_HOOK"),
}
MOVED_FROM_SHARDED = {  # interp.tasks.sharded's names -> where they live now
    "TaskShard": "interp.tasks.shard_jobs",
    "run_task_shards": "interp.tasks.shard_jobs",
    "sharded_patch": "interp.interventions.shards",
    "sharded_edge_scores": "interp.discovery.shards",
    "model_source": "interp.models.workers",
}


def _fresh_import(name: str):
    sys.modules.pop(name, None)  # the warning is given when the module is first imported
    return importlib.import_module(name)


@pytest.mark.parametrize("old", sorted(OLD_MODULES))
def test_an_old_module_still_works_and_warns(old):
    name, home = OLD_MODULES[old]
    with pytest.warns(DeprecationWarning, match=home.replace(".", r"\.")):
        module = _fresh_import(old)
    assert getattr(module, name) is getattr(importlib.import_module(home), name)
    assert module.__deprecated__  # the API reference leaves it out


@pytest.mark.parametrize("old", sorted(OLD_NAMES), ids=lambda o: ".".join(o))
def test_an_old_name_still_works_and_warns(old):
    module, name = old
    home, new = OLD_NAMES[old]
    with pytest.warns(DeprecationWarning, match=new):
        value = getattr(importlib.import_module(module), name)
    assert value is getattr(importlib.import_module(home), new)


def test_a_missing_name_is_still_an_attribute_error():
    import interp.attribution.core as core

    with pytest.raises(AttributeError, match="no_such_name"):
        core.no_such_name  # noqa: B018


def test_every_name_of_the_old_sharded_module_is_the_one_in_its_new_home():
    with pytest.warns(DeprecationWarning):
        sharded = _fresh_import("interp.tasks.sharded")
    for name, home in MOVED_FROM_SHARDED.items():
        assert getattr(sharded, name) is getattr(importlib.import_module(home), name), name


def test_the_old_task_shard_signature_runs_the_same_shard(bundled_model):
    """``task_shard(kind, model, task, **settings)`` (0.5) gives the job that carries the kind's
    shard function; run in this process it gives the partial the function gives."""
    from interp.interventions.shards import task_partial_sums

    with pytest.warns(DeprecationWarning):
        sharded = _fresh_import("interp.tasks.sharded")
    task = induction(bundled_model, 2, seed=1, seq_len=4)
    job = sharded.task_shard("patch", bundled_model, task, sites=["resid_pre"])
    assert job.kind == "patch" and job.function is task_partial_sums
    assert set(sharded.SHARD_FUNCTIONS) == {"patch", "attribute", "discover"}
    part = job(0, 1)  # the worker's side: the model loaded from its checkpoint, checked
    here = task_partial_sums(bundled_model, task, shard=(0, 1), sites=["resid_pre"])
    assert part == here
