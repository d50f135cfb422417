"""How ``-n 2 --dist loadfile`` hands out the tests: costliest first, documents one by one.

xdist's own ``loadfile`` hands out test files in collection order, so a file that takes a
minute and a half can start last and leave the other worker idle to the end. This scheduler
(``pytest_xdist_make_scheduler`` in ``tests/conftest.py``) keeps ``loadfile``'s units, a test
file each, with its module fixtures built once, but always hands out the costliest unit left:
the longest-processing-time-first rule, which keeps two workers within one unit of each
other. The documents' examples, which share only session fixtures, are a unit each, so that
they spread over both workers; the files that start a local Ray cluster are one unit, so that
one worker starts it.

The costs are the slow tests' seconds measured on the quiet 2-core machine
(``--durations``, set-up and call together); any other test counts :data:`DEFAULT_S`. A
stale figure only changes the order in which the tests run, never what runs:
``tests/test_scheduling.py`` checks that every test named here still exists.
"""

from __future__ import annotations

from xdist.scheduler import LoadFileScheduling

DEFAULT_S = 0.3  # a test not in COSTS_S (most take 0.05-1 s)

# files whose tests share no module fixture: each test is a unit of its own
ONE_BY_ONE = ("tests/test_docs_examples.py",)
# files that share an expensive session fixture: one unit, so one worker builds it (a local Ray
# cluster takes 7-8 s of CPU to start and about 4% of a core while it waits)
TOGETHER = {
    "tests/cli/test_cli_executors.py": "ray_cluster",
    "tests/executors/test_executors.py": "ray_cluster",
    "tests/executors/test_executors_tasks.py": "ray_cluster",
}

_DOC = "tests/test_docs_examples.py::test_examples_run_as_written"

# seconds, measured (set-up and call) on the quiet 2-core machine in a whole run
COSTS_S: dict[str, float] = {
    "tests/test_model_zoo.py::test_every_analysis_as_documented[gpt2]": 86,
    "tests/engine/test_memory.py::test_measured_peaks_match_the_estimates_and_the_budget": 59,
    "tests/engine/test_memory_budgets.py::test_measured_grid_peak_stays_within_its_budget": 25,
    "tests/cli/test_cli_executors.py::test_discover_on_ray_with_8_shards_writes_the_whole_runs"
    "_files_despite_a_killed_worker": 30,
    "tests/cli/test_cli_executors.py::test_attribute_on_local_processes_and_patch_on_submitit"
    "_equal_their_whole_runs": 26,
    f"{_DOC}[docs/saes.md]": 17,
    "tests/stores/test_stores.py::test_train_sae_from_its_own_draws_is_the_same_sae": 22,
    "tests/stores/test_stores.py::test_reading_an_epoch_holds_max_bytes_measured": 15,
    "tests/test_notebooks.py::test_tour_runs_in_a_clean_kernel": 13,
    "tests/test_notebooks.py::test_gpt2_small_notebook_rehearsal": 14,
    "tests/test_bench_discovery.py::test_quick_benchmark_runs_and_its_scores_agree": 14,
    f"{_DOC}[docs/scale.md]": 11,
    f"{_DOC}[docs/commands.md]": 11,
    f"{_DOC}[docs/tasks.md]": 11,
    f"{_DOC}[docs/discovery.md]": 11,
    "tests/models/test_bundled_model.py::test_training_script_smoke": 11,
    "tests/discovery/test_discovery_acdc.py::test_budgets_change_nothing": 11,
    "tests/circuits/test_circuits.py::test_scores_on_gpt2_small_shaped_model": 10,
    f"{_DOC}[docs/memory.md]": 9,
    "tests/executors/test_executors_tasks.py::test_discover_circuit_on_ray_equals_the_shards_and"
    "_the_whole_run": 9,
    f"{_DOC}[docs/graphs.md]": 9,
    "tests/test_notebooks.py::test_tour_page_renders_in_a_browser": 8,
    "tests/discovery/test_discovery_scores.py::test_budgets_change_no_number[exact]": 8,
    "tests/saes/test_sae_bundled.py::test_the_training_script_smoke": 7,
    "tests/saes/test_sae_bundled.py::test_the_training_figures_equal_a_recomputation": 7,
}


def cost_s(nodeids) -> float:
    """The seconds a unit of these tests is expected to take."""
    return sum(COSTS_S.get(nodeid, DEFAULT_S) for nodeid in nodeids)


class CostScheduling(LoadFileScheduling):
    """``loadfile``, costliest unit first; :data:`ONE_BY_ONE` files a unit per test, the files
    of :data:`TOGETHER` one unit."""

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return nodeid if path in ONE_BY_ONE else TOGETHER.get(path, path)

    def _assign_work_unit(self, node) -> None:
        costliest = max(self.workqueue, key=lambda scope: cost_s(self.workqueue[scope]))
        self.workqueue.move_to_end(costliest, last=False)  # the unit the parent hands out next
        super()._assign_work_unit(node)
