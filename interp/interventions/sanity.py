"""Is the experiment itself sound? Plain-language warnings before a patching result is trusted.

Patching measures how much of the clean run's behaviour a patch restores, in units of
``clean - corrupted``. That only means something when the model does the task on the clean
prompts and not on the corrupted ones. :func:`sanity_warnings` says so, in sentences, when:

- the clean metric is not above the corrupted one on some rows (the rows are named, 1-based):
  there is nothing to recover on those rows;
- the gap ``C - K`` between the dataset means is too small to normalise by: smaller than
  ``MIN_GAP_REL`` of the larger of the two, or (over two or more rows) within ``GAP_SE`` standard
  errors of 0. ``recovered`` divides by it, so it is noise or blows up;
- the answer is ranked poorly on the clean prompt (below ``MAX_RANK``; the rank is shown): the
  model does not predict it, so the metric follows a token the model does not care about.

For a metric where lower is better (``answer_loss``), pass ``higher_is_better=False``.
:func:`interp.interventions.patch_activations` attaches the warnings as
``frame.attrs["sanity"]``; the report shows them in a box, ``interp patch`` on the terminal.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

__all__ = ["sanity_warnings", "answer_ranks", "MAX_RANK", "MIN_GAP_REL", "GAP_SE"]

MAX_RANK = 10  # an answer the model ranks below its 10 likeliest tokens is not its prediction
MIN_GAP_REL = 0.05  # a gap under 5% of the metric's size is within the metric's wobble
GAP_SE = 2.0  # a mean gap within 2 standard errors of 0 is not distinguishable from 0
MAX_LISTED = 10  # rows named in one warning; the rest are counted


def _rows(numbers: Sequence[int], describe=lambda i: str(i)) -> str:
    shown = ", ".join(describe(i) for i in numbers[:MAX_LISTED])
    more = len(numbers) - MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def sanity_warnings(
    clean: Sequence[float],
    corrupted: Sequence[float],
    *,
    ranks: Sequence[int | None] | None = None,
    metric_name: str = "metric",
    higher_is_better: bool = True,
    max_rank: int = MAX_RANK,
) -> list[str]:
    """Warnings (plain sentences, empty when all is well) about per-row clean and corrupted
    metrics, and optionally each row's answer rank on the clean prompt (1 = the top token;
    None where it is not known). Rows are named 1-based."""
    clean = [float(v) for v in clean]
    corrupted = [float(v) for v in corrupted]
    if len(clean) != len(corrupted) or not clean:
        raise ValueError(
            f"pass one clean and one corrupted metric per row, got {len(clean)} and "
            f"{len(corrupted)}"
        )
    n = len(clean)
    sign = 1.0 if higher_is_better else -1.0
    above = "above" if higher_is_better else "below"
    warnings = []
    bad = [
        i + 1 for i, (c, k) in enumerate(zip(clean, corrupted, strict=True)) if sign * (c - k) <= 0
    ]
    if bad:
        if n == 1:
            where = f"clean {clean[0]:.4g}, corrupted {corrupted[0]:.4g}"
        else:
            where = f"{len(bad)} of {n} rows: row {_rows(bad)}"
        warnings.append(
            f"The clean {metric_name} is not {above} the corrupted one ({where}): the model does "
            "not do the task there, so there is nothing for a patch to recover. Check the "
            "answer and the corrupted prompt, or drop those rows."
        )
    c_mean, k_mean = sum(clean) / n, sum(corrupted) / n
    gaps = [sign * (c - k) for c, k in zip(clean, corrupted, strict=True)]
    gap = sum(gaps) / n
    se = (
        math.sqrt(sum((g - gap) ** 2 for g in gaps) / (n - 1) / n) if n > 1 else 0.0
    )  # of the mean gap
    small = gap <= MIN_GAP_REL * max(abs(c_mean), abs(k_mean), 1e-12)
    noisy = n > 1 and gap <= GAP_SE * se
    if small or noisy:
        why = (
            f"within {GAP_SE:g} standard errors ({se:.3g}) of 0 over {n} rows"
            if noisy and not small
            else f"under {MIN_GAP_REL:.0%} of the metric's size"
        )
        warnings.append(
            f"The clean-corrupted gap is too small to normalise by: clean {c_mean:.4g}, "
            f"corrupted {k_mean:.4g}, gap {c_mean - k_mean:.3g} ({why}). recovered = "
            "(metric - corrupted) / (clean - corrupted) divides by it, so its values are "
            "noise. Choose a corrupted prompt that changes the answer."
        )
    if ranks is not None:
        if len(ranks) != n:
            raise ValueError(f"pass one rank per row ({n}), got {len(ranks)}")
        poor = [(i + 1, int(r)) for i, r in enumerate(ranks) if r is not None and r > max_rank]
        if poor:
            if n == 1:
                where = f"rank {poor[0][1]}"
            else:
                listed = _rows(poor, lambda p: f"{p[0]} (rank {p[1]})")
                where = f"{len(poor)} of {n} rows: row {listed}"
            warnings.append(
                f"The answer is ranked poorly on the clean prompt ({where}; below the top "
                f"{max_rank}): the model does not predict it, so the metric follows a token "
                "it does not care about. Pick the answer the model actually gives."
            )
    return warnings


def answer_ranks(
    logits: Float[Tensor, "batch d_vocab"], answers: Sequence[Sequence[int]]
) -> list[int]:
    """Each row's answer rank among all tokens (1 = the top logit); with several answers, the
    best-ranked of them."""
    best = torch.stack([logits[i, list(ids)].max() for i, ids in enumerate(answers)])  # [batch]
    return ((logits > best[:, None]).sum(dim=-1) + 1).tolist()
