"""Tasks: datasets of clean/corrupted prompt pairs, each row with its own answer.

A :class:`Task` is the unit of a causal experiment. Read one from JSONL or CSV
(docs/tasks.md), build one from records or a DataFrame, or generate one
(:func:`induction`, :func:`ioi`, :func:`greater_than`). ``task.tokens(model)`` checks every
row against the model's tokenizer (no forward pass) and gives right-padded clean and
corrupted batches with each row's length, answer ids and named positions;
:func:`task_logit_diff` and :func:`task_prob_diff` are the per-row metrics.
"""

from interp.tasks.generators import greater_than, induction, ioi
from interp.tasks.metrics import TaskMetric, last_logits, task_logit_diff, task_prob_diff
from interp.tasks.rows import TaskError, TaskRow
from interp.tasks.task import Task
from interp.tasks.tokens import TaskTokens

__all__ = [
    "Task",
    "TaskError",
    "TaskMetric",
    "TaskRow",
    "TaskTokens",
    "greater_than",
    "induction",
    "ioi",
    "last_logits",
    "task_logit_diff",
    "task_prob_diff",
]
