"""The task-command check of tests/support.py: ``interp attribute --task --per-row`` on a task
file of token ids, each row's components adding up to transformers' logit difference of that
row (the pre-cap one for a soft-capped model, as for the pair command), and the table the mean
of the rows.

Imported by tests/support.py (after the helpers it uses here are defined); import that
module, not this one.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pandas as pd
import torch

from tests.support import Case, NotApplicable, _cli, _logit_diff_matches
from tests.support_discovery import _task


def check_cli_attribute_task(case: Case) -> None:
    if case.directory is None:
        raise NotApplicable(
            "commands load a checkpoint directory afresh; this model's setup exists only in memory"
        )
    task = _task(case)
    with tempfile.TemporaryDirectory() as folder:
        path, out = Path(folder) / "task.jsonl", Path(folder) / "out"
        path.write_text("".join(json.dumps(r) + "\n" for r in task.to_records()))
        _cli(
            case,
            ["attribute", "--model", str(case.directory), "--task", str(path), "--per-row"]
            + ["--out", str(out)],
        )
        rows = pd.read_csv(out / "attribution_rows.csv")
        means = pd.read_csv(out / "attribution.csv")
    for i, row in enumerate(task.rows):
        mine = rows[(rows["row"] == i) & (rows["component"] != "total")]
        tokens = torch.tensor([row.clean])
        what = f"row {i + 1}'s components in attribution_rows.csv"
        _logit_diff_matches(
            case, tokens, float(mine["contribution"].sum()), row.answer, row.wrong, what
        )
    by_row = torch.tensor(rows["contribution"].to_numpy()).reshape(len(task), -1)
    gap = float((by_row.mean(dim=0) - torch.tensor(means["contribution"].to_numpy())).abs().max())
    if not gap <= 1e-9:
        raise AssertionError(f"attribution.csv is not the mean of the rows (max |diff| {gap:.3g})")
