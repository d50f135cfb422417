"""The door of every causal analysis: a prompt pair (or one prompt) is a task of one row.

:func:`analysis_rows` turns either form of an analysis's arguments into :class:`Rows`, and
the analysis then takes one path for both:

- a task (:class:`interp.Task` or its ``task.tokens(model)``): its right-padded rows, each read
  with its own answer and wrong at its own last real token (``metric``: ``logit_diff`` or
  ``prob_diff``, :meth:`interp.tasks.TaskTokens.metric`);
- a prompt pair ``clean, corrupted, metric``: one row, read by ``metric``, any callable from
  logits ``[batch pos d_vocab]`` to one value per batch row (the built-ins may name tokens by
  text, resolved here before any run; a batch-averaging metric is read row by row,
  :meth:`Rows.settled`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.engine import MetricFn, PromptError, RowMetricFn, pair_tokens, per_row, to_tokens
from interp.interventions.metrics import metric_name, resolve_metric, row_by_row
from interp.interventions.sanity import answer_ranks
from interp.tasks import Task, TaskMetric, TaskTokens, last_logits

__all__ = ["Rows", "analysis_rows", "is_task", "task_row_metric", "tokens_pair", "TASK_METRICS"]

TASK_METRICS = ("logit_diff", "prob_diff")  # TaskTokens.metric kinds


def is_task(value) -> bool:
    """Whether ``value`` is a task (a :class:`interp.Task` or its :class:`TaskTokens`)."""
    return isinstance(value, (Task, TaskTokens))


def task_row_metric(metric: TaskMetric) -> RowMetricFn:
    """The task metric as the engine's row metric: batch row ``b`` is task row ``rows[b]``."""
    return lambda logits, rows: metric.select(rows)(logits)


@dataclass(frozen=True, eq=False)
class Rows:
    """What a causal analysis runs: clean (and corrupted) token rows and how they are read."""

    clean: Int[Tensor, "rows pos"]
    corrupted: Int[Tensor, "rows pos"] | None  # None: one prompt (ablation)
    metric: MetricFn  # logits of all rows [rows pos d_vocab] -> one value per row
    batch: TaskTokens | None  # the task's tokens (lengths, positions, answers); None: a pair

    @property
    def task(self) -> bool:
        return self.batch is not None

    @property
    def name(self) -> str:
        return metric_name(self.metric)

    @property
    def read_at(self) -> Int[Tensor, " rows"] | None:
        """Each task row's last real token, where it is read; None for a pair, whose metric
        reads what it likes of full logits."""
        return None if self.batch is None else self.batch.last

    @property
    def row_metric(self) -> RowMetricFn:
        """The metric as :func:`interp.engine.run_patched`'s ``row_metric``."""
        if self.batch is not None:
            return task_row_metric(self.metric)
        metric = self.metric
        return lambda logits, rows: per_row(metric, logits)

    def values(self, logits: Float[Tensor, "rows pos d_vocab"]) -> Float[Tensor, " rows"]:
        """One value per row of a run of all rows, float64 on the CPU."""
        return per_row(self.metric, logits).double().cpu()

    def pooled(self, logits: Float[Tensor, "rows pos d_vocab"]) -> Float[Tensor, " rows"]:
        """Path patching's reading: one value per task row, or for a pair (whose prompt rows
        may be a batch) the metric's mean over its prompt rows, as one row; float64."""
        if self.batch is not None:
            return self.metric(logits).double().cpu()
        return _mean(self.metric(logits), int(logits.shape[0])).reshape(1)

    def settled(self, model, logits: Float[Tensor, "rows pos d_vocab"]) -> Rows:
        """A pair's batch-averaging metric read one row at a time (:func:`row_by_row`, decided
        on a first run's ``logits``); a task's metric as it is."""
        if self.batch is not None:
            return self
        return replace(self, metric=row_by_row(model, self.metric, logits))

    def ranks(self, clean_logits: Float[Tensor, "rows pos d_vocab"] | None) -> list | None:
        """Each row's answer rank on its clean prompt (1 = top): a task's answers, or a
        built-in pair metric's answer at its position; None where no answer is named."""
        if clean_logits is None:
            return None
        if self.batch is not None:
            return answer_ranks(
                last_logits(clean_logits, self.batch.lengths).float(), self.batch.answers
            )
        answer, pos = getattr(self.metric, "answer", None), getattr(self.metric, "pos", -1)
        if not isinstance(answer, int):
            return None
        return answer_ranks(clean_logits[:, pos].float(), [[answer]])


def analysis_rows(
    model,
    clean,
    corrupted,
    metric,
    *,
    call: str,
    per_row: bool = False,
    pair: bool = True,
    prompt_rows: bool = False,
) -> Rows:
    """Check either form of the arguments (module docstring) before any run; ``call`` names
    the analysis in refusals. ``pair=False``: one prompt and a metric, no corrupted prompt;
    ``prompt_rows``: a pair may be two batches of prompts (path patching reads their mean)."""
    if is_task(clean):
        if corrupted is not None:
            raise ValueError(
                f"a task carries each row's corrupted prompt: call {call}(model, task, "
                f"metric=...) without corrupted, got {type(corrupted).__name__} {corrupted!r:.60}"
            )
        kind = "logit_diff" if metric is None else metric
        if not isinstance(kind, str) or kind not in TASK_METRICS:
            shown = kind if isinstance(kind, str) else metric_name(kind)
            raise ValueError(
                f"over a task, metric is one of {', '.join(TASK_METRICS)} (each row's own "
                f"answer and wrong at its last real token), got {shown!r}"
            )
        batch = clean.tokens(model) if isinstance(clean, Task) else clean
        corrupted = batch.corrupted if pair else None
        return Rows(batch.clean, corrupted, batch.metric(kind), batch)
    if per_row:
        raise ValueError(
            "per_row=True is for a task (one table row per task row); a prompt pair has one "
            "row: pass a Task, or leave per_row out"
        )
    if not pair:
        if metric is None or isinstance(metric, str):
            raise TypeError(
                f"{call} needs a prompt and a metric callable (e.g. logit_diff(' Mary', "
                "' John')), or a Task as its second argument"
            )
        tokens = to_tokens(model, clean)
        if tokens.shape[0] != 1:
            raise ValueError(
                f"pass one prompt, not a batch of {tokens.shape[0]}; for many prompts make a Task"
            )
        return Rows(tokens, None, resolve_metric(model, metric), None)
    if corrupted is None or metric is None:
        raise TypeError(
            f"{call} needs clean, corrupted and metric (one prompt pair), or a Task as its "
            "second argument"
        )
    metric = resolve_metric(model, metric)  # token text to ids, refused before any run
    clean_tokens, corrupted_tokens = (tokens_pair if prompt_rows else pair_tokens)(
        model, clean, corrupted
    )
    return Rows(clean_tokens, corrupted_tokens, metric, None)


def tokens_pair(model, clean, corrupted) -> tuple[Tensor, Tensor]:
    """Both prompts as token batches of one shape, refused in one line otherwise."""
    clean_t, corrupt_t = to_tokens(model, clean), to_tokens(model, corrupted)
    if clean_t.shape != corrupt_t.shape:

        def show(t):
            rows = model.to_str_tokens(t[0]) if model.tokenizer is not None else t[0].tolist()
            return f"{list(t.shape)} {rows}"

        raise PromptError(
            f"clean and corrupted prompts must have the same [batch, pos] shape; "
            f"clean is {show(clean_t)}, corrupted is {show(corrupt_t)}: make them "
            "tokenise to the same length"
        )
    return clean_t, corrupt_t


def _mean(values, rows: int) -> Tensor:
    values = torch.as_tensor(values, dtype=torch.float64)
    if values.ndim == 0:
        return values
    if values.ndim == 1 and len(values) == rows:
        return values.mean()
    raise ValueError(
        f"the metric must return a scalar or a tensor [batch] ({rows} values), "
        f"got shape {tuple(values.shape)}"
    )
