"""Direct logit attribution over a task: each row's own answer minus wrong, at its own last token.

Row ``i`` of a task is attributed as :func:`interp.logit_attribution` attributes its clean prompt
alone (:func:`interp.logit_attribution_batch`, which folds the model once and checks every row's
identity): the rows of component ``c`` are ``a_ic``, read at row ``i``'s last real token for
its own answer (minus its own wrong token), and they add up to that row's logit (difference).
The task's table holds the mean over rows, ``contribution = mean_i a_ic``, and its standard
error ``contribution_sem = std_i(a_ic) / sqrt(n)`` (NaN for one row); the ``total`` row is then
the mean logit difference. ``per_row=True`` keeps each row's table under a ``row`` column.

Prompts run unpadded (rows of one length share passes), so padding cannot change a number.
Answers given as a list of tokens (greater-than's sets) are not one logit: they are refused.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from interp.attribution.batch import logit_attribution_batch
from interp.tasks import Task, TaskTokens

__all__ = ["task_attribution"]

_KEYS = ["component", "layer", "head", "neuron"]  # what a table row is, "neuron" if present


def _single(sets, what: str) -> list[int]:
    for i, ids in enumerate(sets):
        if len(ids) != 1:
            raise ValueError(
                f"row {i + 1}: the {what} is a list of {len(ids)} tokens; logit attribution "
                "decomposes one logit (difference), so each row needs a single answer and "
                "wrong token"
            )
    return [int(ids[0]) for ids in sets]


def task_attribution(
    model,
    task: Task | TaskTokens,
    *,
    per_row: bool = False,
    neurons: bool = False,
    max_bytes: int | str | None = None,
) -> pd.DataFrame:
    """Mean direct logit attribution over ``task``'s rows (module docstring).

    Returns :func:`interp.logit_attribution`'s columns, ``contribution`` the mean over rows,
    and ``contribution_sem``; with ``per_row`` a ``row`` column first and one table per row.
    ``attrs``: ``n_rows``, ``reference_rows`` (each row's own logit difference, what its rows
    add up to), ``rows`` (each row's ``logit_attribution`` attrs).
    """
    batch = task.tokens(model) if isinstance(task, Task) else task
    answers = _single(batch.answers, "answer")
    wrong = None if batch.wrong is None else _single(batch.wrong, "wrong token")
    prompts = [batch.clean[i : i + 1, : int(n)] for i, n in enumerate(batch.lengths.tolist())]
    frame = logit_attribution_batch(
        model, prompts, answers, wrong=wrong, neurons=neurons, max_bytes=max_bytes
    )
    rows_attrs = frame.attrs["prompts"]
    frame = frame.rename(columns={"prompt": "row"})
    attrs = dict(
        n_rows=len(prompts),
        reference_rows=[a["reference"] for a in rows_attrs],
        rows=rows_attrs,
    )
    if per_row:
        frame.attrs = attrs
        return frame
    n = len(prompts)
    keys = [k for k in _KEYS if k in frame.columns]
    first = frame[frame["row"] == 0][keys].reset_index(drop=True)
    values = torch.tensor(frame["contribution"].to_numpy(dtype=float)).reshape(n, -1)
    first["contribution"] = values.mean(dim=0).numpy()
    first["contribution_sem"] = (values.std(dim=0) / math.sqrt(n)).numpy() if n > 1 else math.nan
    first.attrs = attrs
    return first
