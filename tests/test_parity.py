"""experiments/parity.py's own plumbing, offline and without the peers (the comparisons need
the peers' environments; docs/testing.md has the measured table): a peer whose Python cannot
import it is NOT RUN and fails the run, a Python that is not there is refused before any work,
and the summary keeps each metric's worst case and fails the metric on any failing case."""

from __future__ import annotations

import pytest

from experiments.parity import _summary, main
from experiments.parity_checks import Record


def test_a_peer_its_python_cannot_import_is_not_run_and_fails_the_run(tmp_path):
    fake = tmp_path / "python"  # a Python without sparsify, whatever this machine has
    fake.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'sparsify'\" >&2\n"
                    "exit 1\n")  # fmt: skip
    fake.chmod(0o755)
    out = tmp_path / "out"
    assert main(["--out", str(out), "--only", "sparsify", "--sparsify-python", str(fake)]) == 1
    text = (out / "parity.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| sparsify | load_sae |"))
    assert row.endswith("| NOT RUN |")
    assert f"{fake} cannot import sparsify: ModuleNotFoundError" in row


def test_a_python_that_is_not_there_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        main(["--out", str(out), "--saelens-python", str(tmp_path / "nope")])
    assert exit_.value.code == 2
    assert f"--saelens-python {tmp_path / 'nope'}: no such file" in capsys.readouterr().err
    assert not out.exists()


def _record(case: str, diff: float, allowed: float) -> Record:
    return Record("saelens", "load_sae", "outputs max |diff|", case, f"{diff:.2g}", "tol",
                  diff <= allowed, diff / allowed)  # fmt: skip


def test_the_summary_shows_the_worst_case_and_fails_on_any_failing_one():
    ok = [_record("a", 1e-6, 1e-5), _record("b", 4e-6, 1e-5), _record("c", 2e-6, 1e-5)]
    assert _summary(ok) == [("saelens", "load_sae", "outputs max |diff|", "3", "4e-06, at b",
                             "tol", "PASS")]  # fmt: skip
    bad = [*ok, _record("e", 2e-5, 1e-5), _record("d", 3e-5, 1e-5)]
    (row,) = _summary(bad)
    assert row[-1] == "FAIL" and row[4] == "3e-05, at d; 2 of 5 cases fail"
