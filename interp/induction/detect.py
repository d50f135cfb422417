"""Find a model's induction heads: scores, ablation evidence and a documented verdict.

A head is called an induction head (``is_induction``) when all of these hold:

* ``induction_score_min >= INDUCTION_MIN`` (0.4): at *every* repeat length it puts at least 40%
  of its attention on the token after the earlier copy. A head that attends a fixed distance
  back matches at one length only.
* ``offset_control_score <= CONTROL_MAX_RATIO * induction_score`` (0.25): on fresh tokens,
  where no earlier copy exists, it does not attend the same relative position; an
  "attend N back" head does. (NaN when the batch has no filler, i.e. a single repeat length.)
* ``ablation_loss_increase >= ABLATION_MIN_SHARE * in_context_gain`` (1%): mean-ablating it
  costs at least 1% of what the repeat saves (first-half minus repeated-half loss): enough
  to show it is used, while a head backed up by redundant induction heads still counts. Heads
  whose ablation was not measured (NaN) are judged on the first two conditions alone.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from tqdm.auto import tqdm

from interp.foundation.formatting import head_names, number, summary_html, table_html
from interp.induction.batches import (
    RepeatedTokens,
    choose_seq_lens,
    ordinary_token_ids,
    repeated_tokens,
)
from interp.induction.scores import HeadScan, ablated_repeated_loss, scan_heads

__all__ = [
    "InductionResult",
    "detect_induction_heads",
    "run_induction_scan",
    "COLUMNS",
    "INDUCTION_MIN",
    "CONTROL_MAX_RATIO",
    "ABLATION_MIN_SHARE",
    "DEFAULT_SEQ_LENS",
]

logger = logging.getLogger(__name__)

INDUCTION_MIN = 0.4  # verdict: least induction score at every repeat length
CONTROL_MAX_RATIO = 0.25  # verdict: most offset-control score, as a share of induction score
ABLATION_MIN_SHARE = 0.01  # verdict: least ablation cost, as a share of what the repeat saves
DEFAULT_SEQ_LENS = (10, 20, 40)  # repeat lengths used where they fit the model
COLUMNS = [  # the table's columns, in order (then EXTRA_COLUMNS)
    "layer",
    "head",
    "induction_score",
    "prev_token_score",
    "duplicate_token_score",
    "copying_score",
    "ablation_loss_increase",
    "is_induction",
]
# kv_head: the key/value head a query head shares under grouped-query attention (else = head)
EXTRA_COLUMNS = ["induction_score_min", "offset_control_score", "kv_head"]


@dataclass(frozen=True)
class InductionResult:
    """Everything the report shows: the table, the batch, and the losses it came from."""

    table: pd.DataFrame  # COLUMNS + EXTRA_COLUMNS, ranked by induction_score
    batch: RepeatedTokens
    scan: HeadScan
    loss_first_half: float
    loss_repeated_half: float
    settings: dict

    def induction_heads(self) -> list[str]:
        """``L1H0``-style names of the heads the verdict calls induction heads, best first."""
        return head_names(self.table[self.table["is_induction"]])

    def _summary(self) -> dict[str, str]:
        heads = self.induction_heads()
        n_heads = len(self.table)
        verdict = (
            f"{len(heads)} of {n_heads} heads are induction heads: {', '.join(heads)}"
            if heads
            else f"no induction head among {n_heads} heads"
        )
        gain = self.loss_first_half - self.loss_repeated_half
        lens = self.settings.get("seq_lens")
        reason = self.settings.get("seq_lens_reason")
        why_lens = "the defaults" if lens == sorted(DEFAULT_SEQ_LENS) else "as given"
        thresholds = self.settings.get("thresholds", {})
        bos_id = self.settings.get("bos_token_id")
        bos = "rows without BOS" if bos_id is None else f"BOS id {bos_id}"
        return {
            "verdict": verdict,
            "loss": (
                f"first half {number(self.loss_first_half)}, repeated half "
                f"{number(self.loss_repeated_half)} (in-context gain {number(gain)})"
            ),
            "seq_lens": f"{lens} ({reason or why_lens})",
            "batch": (
                f"{self.settings.get('batch_size')} rows per length, seed "
                f"{self.settings.get('seed')}, {bos}; "
                f"tokens {list(self.batch.tokens.shape)}"
            ),
            "thresholds": ", ".join(f"{k} {v}" for k, v in thresholds.items()),
        }

    def __repr__(self) -> str:
        summary = self._summary()
        return (
            f"InductionResult({summary['verdict']}; loss {summary['loss']}; seq_lens "
            f"{summary['seq_lens']}; .table has {len(self.table)} rows)"
        )

    def _repr_html_(self) -> str:
        return summary_html(
            "Induction scan",
            self._summary(),
            table=table_html(self.table, columns=COLUMNS + EXTRA_COLUMNS),
            table_title="heads ranked by induction score (.table)",
        )


def _bos_id(model) -> int | None:
    """The token the model's prompts start with, or None for a model run without one.

    TransformerLens prepends the tokenizer's BOS (standing in EOS when there is none) unless
    ``cfg.default_prepend_bos`` is False; the batches start the way the model's prompts do.
    """
    if not getattr(model.cfg, "default_prepend_bos", True):
        return None
    bos = getattr(model.tokenizer, "bos_token_id", None)
    return None if bos is None else int(bos)


def _batch(model, seq_lens, batch_size: int, seed: int):
    """The seeded repeated-token batch, its repeat lengths, why they were chosen, and the BOS."""
    if model.tokenizer is None:
        raise ValueError(
            "the model has no tokenizer: the induction scan needs one to choose "
            "ordinary tokens; load the model with its tokenizer"
        )
    n_ctx = int(model.cfg.n_ctx)
    bos_id = _bos_id(model)
    prefix = 0 if bos_id is None else 1
    vocab = ordinary_token_ids(model.tokenizer, int(model.cfg.d_vocab))
    reason = None
    if seq_lens is None:
        seq_lens, reason = choose_seq_lens(
            DEFAULT_SEQ_LENS, n_ctx=n_ctx, n_vocab=len(vocab), prefix=prefix
        )
        if reason:
            logger.info("%s; using repeat lengths %s", reason, seq_lens)
    seq_lens = [int(n) for n in seq_lens]
    if seq_lens and prefix + 2 * max(seq_lens) > n_ctx:
        raise ValueError(
            f"repeat length {max(seq_lens)} makes rows of "
            f"{prefix + 2 * max(seq_lens)} tokens but the model's context is "
            f"{n_ctx}; pass shorter seq_lens (or none, to have them chosen)"
        )
    batch = repeated_tokens(
        vocab, seq_lens=seq_lens, batch_size=batch_size, bos_id=bos_id, seed=seed
    )
    return batch, seq_lens, reason, bos_id


def _head_table(model, scan: HeadScan, copying: bool) -> pd.DataFrame:
    """One row per head: the scan's scores and, asked for, the OV copying score."""
    n_layers, n_heads = scan.scores["induction"].shape
    layer, head = torch.meshgrid(torch.arange(n_layers), torch.arange(n_heads), indexing="ij")
    by_len = torch.stack(list(scan.induction_by_len.values()))  # [len layer head]
    table = pd.DataFrame(
        {
            "layer": layer.flatten().numpy(),
            "head": head.flatten().numpy(),
            "induction_score": scan.scores["induction"].flatten().numpy(),
            "prev_token_score": scan.scores["previous"].flatten().numpy(),
            "duplicate_token_score": scan.scores["duplicate"].flatten().numpy(),
            "induction_score_min": by_len.min(dim=0).values.flatten().numpy(),
            "offset_control_score": scan.scores["control"].flatten().numpy(),
            "kv_head": (head // (n_heads // int(model.W_K.shape[1]))).flatten().numpy(),
        }
    )
    table["copying_score"] = float("nan")
    if copying:
        from interp.circuits import copying_scores

        copy = copying_scores(model).set_index(["layer", "head"])["copying_score"]
        table["copying_score"] = copy.reindex(
            pd.MultiIndex.from_frame(table[["layer", "head"]])
        ).values
    return table


def _choose_ablations(table: pd.DataFrame, ablate: bool | int) -> list[tuple[int, int]]:
    if ablate is False or ablate == 0:
        return []
    ranked = table.sort_values("induction_score", ascending=False)
    if ablate is not True:
        ranked = ranked.head(int(ablate))
    return list(zip(ranked["layer"].tolist(), ranked["head"].tolist(), strict=True))


def _verdict(table: pd.DataFrame, gain: float) -> pd.DataFrame:
    """``is_induction`` by the module docstring's rule, the heads ranked by induction score."""
    control_ok = ~(table["offset_control_score"] > CONTROL_MAX_RATIO * table["induction_score"])
    ablation_ok = ~(table["ablation_loss_increase"] < ABLATION_MIN_SHARE * gain)
    table["is_induction"] = (
        (table["induction_score_min"] >= INDUCTION_MIN) & control_ok & ablation_ok & (gain > 0)
    )
    return (
        table[COLUMNS + EXTRA_COLUMNS]
        .sort_values(["induction_score", "layer", "head"], ascending=[False, True, True])
        .reset_index(drop=True)
    )


def run_induction_scan(
    model,
    *,
    seq_lens: Sequence[int] | None = None,
    batch_size: int = 4,
    seed: int = 0,
    ablate: bool | int = True,
    copying: bool = True,
    progress: bool = False,
    max_bytes: int | str | None = None,
) -> InductionResult:
    """Score every head of ``model`` on seeded repeated random tokens.

    Args:
        seq_lens: repeat lengths; each row is ``[BOS] + a + a + filler`` with ``len(a)`` one of
            these (several lengths tell induction from "attend N back"). None: the
            ``DEFAULT_SEQ_LENS`` where they fit the context and the vocabulary, otherwise
            lengths that do (``settings["seq_lens_reason"]`` says why); given lengths that do
            not fit are refused.
        batch_size: rows per repeat length.
        seed: seeds the token draw; the same seed gives the same table.
        ablate: mean-ablate every head (True), none (False) or the top-N by induction score.
        copying: add each head's OV copying score (``interp.circuits.copying_scores``).
        progress: show a progress bar over the ablations.
        max_bytes: a memory budget (bytes, or text such as ``"500MB"``) for each forward pass:
            the batch is split into chunks of rows that fit (see docs/memory.md); the table is
            the same as without a budget.
    """
    batch, seq_lens, reason, bos_id = _batch(model, seq_lens, batch_size, seed)
    chunked = max_bytes is not None and ablate not in (False, 0)
    scan = scan_heads(model, batch, max_bytes=max_bytes, z_mean=chunked)
    first = float(scan.loss[batch.loss_positions("first")].mean())
    repeated = float(scan.loss[batch.loss_positions("repeated")].mean())
    table = _head_table(model, scan, copying)
    table["ablation_loss_increase"] = float("nan")
    heads = _choose_ablations(table, ablate)
    for lay, hd in tqdm(heads, desc="ablating heads", disable=not progress or not heads):
        mean = scan.z_mean[lay][hd] if chunked else None
        loss = ablated_repeated_loss(model, batch, lay, hd, z_mean=mean, max_bytes=max_bytes)
        table.loc[(table["layer"] == lay) & (table["head"] == hd), "ablation_loss_increase"] = (
            loss - repeated
        )
    table = _verdict(table, first - repeated)
    thresholds = {
        "induction_min": INDUCTION_MIN,
        "control_max_ratio": CONTROL_MAX_RATIO,
        "ablation_min_share": ABLATION_MIN_SHARE,
    }
    settings = dict(seq_lens=list(seq_lens), seq_lens_reason=reason, bos_token_id=bos_id)
    settings.update(batch_size=batch_size, seed=seed, thresholds=thresholds)
    logger.info("repeated-half loss %.3f vs first half %.3f", repeated, first)
    return InductionResult(
        table=table,
        batch=batch,
        scan=scan,
        loss_first_half=first,
        loss_repeated_half=repeated,
        settings=settings,
    )


def detect_induction_heads(model, **options) -> pd.DataFrame:
    """The ranked table of :func:`run_induction_scan` (same keyword arguments, same meaning).

    Columns: ``layer, head, induction_score, prev_token_score, duplicate_token_score,
    copying_score, ablation_loss_increase, is_induction`` and the verdict's inputs
    ``induction_score_min, offset_control_score``, and ``kv_head`` (the key/value head each
    query head shares under grouped-query attention). Thresholds: see the module docstring.
    """
    return run_induction_scan(model, **options).table


# the same keyword arguments as run_induction_scan, shown by help() and the API reference
detect_induction_heads.__signature__ = inspect.signature(run_induction_scan).replace(
    return_annotation="pd.DataFrame"
)
