"""What moved or was renamed in 0.6.0 kept its old path for one release (0.6.x) with a
DeprecationWarning; in 0.7.0 the old paths are gone (CHANGELOG.md) and only the new homes
answer."""

from __future__ import annotations

import importlib

import pytest

GONE_MODULES = {  # 0.6.0's deprecated module -> (a name it gave, that name's home)
    "interp.tasks.sharded": ("run_task_shards", "interp.tasks.shard_jobs"),
    "interp.interventions.attribution": (
        "attribution_deltas",
        "interp.interventions.attribution_patching",
    ),
    "interp.saes.data": ("TokenRows", "interp.dictionaries.data"),
    "interp.saes.safetensors_file": ("read_tensors", "interp.dictionaries.files"),
}
GONE_NAMES = {  # (module, 0.6.0's deprecated name) -> (home, name)
    ("interp.attribution.core", "resolve_token"): ("interp.engine.tokens", "resolve_token"),
    ("interp.discovery", "Graph"): ("interp.discovery", "EdgeGraph"),
    ("interp.discovery.graph", "Graph"): ("interp.discovery.graph", "EdgeGraph"),
    ("interp.graphs.interventions", "FINAL"): ("interp.graphs.frozen", "FINAL_HOOK"),
}


@pytest.mark.parametrize("old", sorted(GONE_MODULES))
def test_an_old_module_is_gone_and_its_names_live_in_their_home(old):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)
    name, home = GONE_MODULES[old]
    assert getattr(importlib.import_module(home), name)


@pytest.mark.parametrize("old", sorted(GONE_NAMES), ids=lambda o: ".".join(o))
def test_an_old_name_is_gone_and_its_new_name_answers(old):
    module, name = old
    home, new = GONE_NAMES[old]
    with pytest.raises(AttributeError, match=name):
        getattr(importlib.import_module(module), name)
    assert getattr(importlib.import_module(home), new) is not None
