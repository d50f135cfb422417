"""The order ``-n 2 --dist loadfile`` runs the tests in (tests/scheduling.py)."""

from __future__ import annotations

import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

from tests.scheduling import COSTS_S, DEFAULT_S, ONE_BY_ONE, TOGETHER, CostScheduling, cost_s

ROOT = Path(__file__).resolve().parents[1]


def test_every_costed_test_still_exists(request):
    """A renamed test would silently fall back to the default cost: each name must collect.
    In a whole run the session's own collection says so; a partial run collects the files."""
    files = sorted({nodeid.split("::")[0] for nodeid in COSTS_S} | set(ONE_BY_ONE) | set(TOGETHER))
    collected = {item.nodeid for item in request.session.items}
    if not all(any(n.startswith(f + "::") for n in collected) for f in files):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
            + files,
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        collected = set(done.stdout.split())
    assert sorted(set(COSTS_S) - collected) == []
    assert all(any(n.startswith(f + "::") for n in collected) for f in [*ONE_BY_ONE, *TOGETHER])


class _Node:
    def __init__(self):
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indexes):
        self.sent.append(indexes)


def _scheduler(nodeids: list[str]) -> tuple[CostScheduling, _Node]:
    sched = CostScheduling.__new__(CostScheduling)  # no config: only the queue is exercised
    node = _Node()
    sched.workqueue = OrderedDict()
    for nodeid in nodeids:
        sched.workqueue.setdefault(sched._split_scope(nodeid), {})[nodeid] = False
    sched.assigned_work = {}
    sched.registered_collections = {node: nodeids}
    return sched, node


def test_costliest_unit_goes_first_and_documents_go_one_by_one():
    doc = "tests/test_docs_examples.py::test_examples_run_as_written"
    zoo = "tests/test_model_zoo.py::test_every_analysis_as_documented[gpt2]"
    nodeids = [
        "tests/a.py::one",
        "tests/a.py::two",
        f"{doc}[docs/graphs.md]",
        f"{doc}[docs/tasks.md]",
        zoo,
        "tests/test_model_zoo.py::test_toy_properties",
        "tests/executors/test_executors.py::one",
        "tests/cli/test_cli_executors.py::two",
    ]
    sched, node = _scheduler(nodeids)
    assert list(sched.workqueue) == [
        "tests/a.py",
        f"{doc}[docs/graphs.md]",
        f"{doc}[docs/tasks.md]",
        "tests/test_model_zoo.py",
        "ray_cluster",
    ]
    order = []
    while sched.workqueue:
        sched._assign_work_unit(node)
        order.append([nodeids[i] for i in node.sent[-1]])
    assert order == [
        [zoo, "tests/test_model_zoo.py::test_toy_properties"],
        [f"{doc}[docs/tasks.md]"],
        [f"{doc}[docs/graphs.md]"],
        ["tests/a.py::one", "tests/a.py::two"],  # a tie (0.6 s): collection order
        ["tests/executors/test_executors.py::one", "tests/cli/test_cli_executors.py::two"],
    ]
    assert cost_s(order[0]) == COSTS_S[zoo] + DEFAULT_S
