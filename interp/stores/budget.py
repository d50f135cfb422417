"""What a training from a store holds besides its reading, so that ``max_bytes`` bounds the
whole :func:`interp.train_sae` / :func:`interp.train_transcoder` call, not the reading alone.

A training call has two phases, and its parameters live through both::

    state        parameters x 4 x 4       each float32 parameter, its gradient and Adam's two
                                          moments; and the texts' token ids (TokenRows)
    steps        the reading (reading.py) and one step's tensors at batch_tokens
    evaluation   the folded weights, and pass by pass (:mod:`interp.stores.evaluation`; as
                 few rows a pass as the budget needs) the model's forward pass on held-out
                 rows (interp.engine.estimate_run_bytes), its activations and the figures'
                 chunks: the held-out tokens are never all held at once
    margin       :data:`MARGIN`: what the C allocator and the interpreter keep besides (measured)

The reading is given what is left: ``max_bytes - state - margin - one step's tensors``; the
evaluation, which runs after the reading is freed, must fit ``max_bytes - state - margin``.
Large freed tensors go back to the operating system at once (``return_freed_memory``), and
what the heap holds is trimmed once the reading is freed, or glibc would keep the freed reading
resident under the evaluation. A budget that cannot hold the state, a step, the least reading
(a buffer of two batches) or the evaluation is refused before anything is read, naming the
least that would do.
benchmarks/bench_store_memory.py measures the whole call's peak resident size against these
estimates (tests/stores/test_stores_streaming.py asserts it stays under ``max_bytes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from interp.engine import estimate_run_bytes, return_freed_memory
from interp.foundation.sizes import parse_size

__all__ = [
    "ADAM_COPIES",
    "MARGIN",
    "TrainingBudget",
    "evaluation_plan",
    "split_budget",
    "split_rows",
    "step_bytes",
    "token_bytes",
]

FLOAT = 4  # bytes of a float32
ADAM_COPIES = 4  # a parameter, its gradient and Adam's two moments
FOLD_COPIES = 2  # at the evaluation: the folded weights and their temporaries
STEP_COPIES = 8  # one step's tensors (forward, saved for backward, gradients) per number
# one evaluation pass's activations: the cache, the copy kept, float64 and centred float64
PASS_COPIES = 6
CHUNK_COPIES = 6  # the figures' tensors per number of a chunk (features, reconstruction, ...)
# bytes the allocator, the interpreter and the model's passes hold beyond the counts above:
# the largest gap measured by benchmarks/bench_store_memory.py was an SAE's evaluation on the
# bundled model, 1.9 MB above its estimate (the same stretch measured 4.4-5.5 MB from run to
# run at one budget), hence 3 MiB
MARGIN = 3 * 2**20


@dataclass(frozen=True)
class TrainingBudget:
    """How ``max_bytes`` is shared: bytes of each part of a training call."""

    max_bytes: int
    state: int  # parameters, gradients, Adam's moments
    steps: int  # one step's tensors
    evaluation: int  # the held-out figures' peak
    margin: int
    reading: int  # what is left for the reading
    eval_rows: int  # rows of held-out tokens per forward pass of the evaluation

    @property
    def planned(self) -> int:
        """The most the call should hold: the state and the larger of its two phases."""
        return self.state + self.margin + max(self.steps + self.reading, self.evaluation)


def step_bytes(batch_tokens: int, numbers_per_token: int, extra: int = 0) -> int:
    """One step's tensors: :data:`STEP_COPIES` float32 copies of ``numbers_per_token`` numbers
    for each of ``batch_tokens`` tokens, and ``extra`` numbers that do not scale with it."""
    return STEP_COPIES * (batch_tokens * numbers_per_token + extra) * FLOAT


def evaluation_plan(
    model, batches: Sequence[Tensor], hooks: list[str], row_bytes: int, params: int,
    chunk: int, chunk_numbers: int, max_bytes: int | str, tokens: int,
) -> tuple[int, int]:  # fmt: skip
    """``(rows per pass, bytes)`` of the held-out evaluation, computed pass by pass
    (:mod:`interp.dictionaries.evaluation`): ``batches`` run through the model with ``hooks``
    cached, that many rows a pass (the most whose peak fits what ``max_bytes`` leaves: all but
    the state, with ``tokens`` bytes of token ids, and the margin; at least one), each
    pass's ``row_bytes`` per token kept while its figures are taken ``chunk`` tokens at a time
    with ``chunk_numbers`` numbers per token, and ``params`` parameters folded."""
    fixed = FOLD_COPIES * params * FLOAT
    limit = parse_size(max_bytes) - ADAM_COPIES * params * FLOAT - tokens - MARGIN

    def peak(rows: int) -> int:
        return max(
            estimate_run_bytes(model, (n, b.shape[1]), hooks=hooks, keep_logits=False)
            + PASS_COPIES * n * b.shape[1] * row_bytes
            + CHUNK_COPIES * min(chunk, n * b.shape[1]) * chunk_numbers * FLOAT
            for b in batches
            for n in [min(rows, len(b))]
        )

    rows = max(len(b) for b in batches)
    while rows > 1 and fixed + peak(rows) > limit:
        rows //= 2
    return rows, fixed + peak(rows)


def token_bytes(rows) -> int:
    """Bytes of the token ids a :class:`interp.dictionaries.data.TokenRows` holds (its texts,
    tokenized: held through the call; making them peaked at what they hold, measured)."""
    return sum(t.numel() * t.element_size() for t in vars(rows).values() if isinstance(t, Tensor))


def split_rows(batches: Sequence[Tensor], rows: int) -> list[Tensor]:
    """``batches`` of token rows cut into batches of at most ``rows`` rows, in order."""
    return [b[i : i + rows] for b in batches for i in range(0, len(b), rows)]


def split_budget(
    max_bytes: int | str, *, params: int, steps: int, evaluation: tuple[int, int],
    least_reading: int, what: str, reading_what: str = "a buffer of two batches", tokens: int = 0,
) -> TrainingBudget:  # fmt: skip
    """Share ``max_bytes`` (module docstring) for a training of ``params`` parameters (and
    ``tokens`` bytes of token ids) whose step
    holds ``steps`` bytes (:func:`step_bytes`); a ValueError naming the least budget when it
    cannot hold the training, the least reading (``reading_what``) and the evaluation
    (:func:`evaluation_plan`: its rows per pass and bytes)."""
    limit = parse_size(max_bytes)
    eval_rows, evaluation = evaluation
    state = ADAM_COPIES * params * FLOAT + tokens
    reading = limit - state - MARGIN - steps
    least = state + MARGIN + max(steps + least_reading, evaluation)
    if reading < least_reading or state + MARGIN + evaluation > limit:
        raise ValueError(
            f"max_bytes {limit:,} is too small to train {what} from a store: the training "
            f"itself holds {state:,} bytes (parameters, gradients and Adam's moments, and "
            f"{tokens:,} of its texts' token ids) and a "
            f"margin of {MARGIN:,}, then one step's tensors ({steps:,}) and the least reading "
            f"({least_reading:,}: {reading_what}), then the held-out evaluation "
            f"({evaluation:,}); at least {least:,} bytes would do: raise max_bytes, or lower "
            "batch_tokens or the dictionary's size"
        )
    # glibc's heap would keep the freed reading and passes resident (engine.allocator)
    return_freed_memory()
    return TrainingBudget(limit, state, steps, evaluation, MARGIN, reading, eval_rows)
