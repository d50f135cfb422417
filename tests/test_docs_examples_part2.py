"""The documents of ``PART_2``: their examples run as written (test_docs_examples.py has the
rules, the fork server and the other documents). A file of its own so that, under the README's
``--dist loadfile``, the documents' examples run on both workers instead of one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_docs_examples import doc_params, fork_server, run_examples  # noqa: F401


@pytest.mark.parametrize("path", doc_params(part=2))
def test_examples_run_as_written(path: Path, tmp_path: Path, fork_server: Path):  # noqa: F811
    run_examples(path, tmp_path, fork_server)
