"""Repeated-random-token batches and the (query, key) targets that the head scores read.

Every row is ``[BOS] + a + a + filler`` (no BOS for a model run without one) where ``a`` is
``seq_len`` distinct tokens drawn from
the model's ordinary vocabulary and the filler is fresh tokens (none of them in ``a``) that pad
shorter repeats to the batch's common length. Rows of several repeat lengths share one batch,
so one forward pass scores every head at every length. Drawing ``a`` without replacement makes
each token's earlier copy unique, so the induction target of every query is unambiguous.

Targets, for a query at position ``q`` inside the second copy (``L`` = the row's ``seq_len``):
    induction  ``k = q - L + 1``  the token after the earlier copy of the current token
    duplicate  ``k = q - L``      the earlier copy itself
    previous   ``k = q - 1``      (every query but the first)
    control    ``k = q - L + 1``  for queries in the filler, where no earlier copy exists: a head
               that attends a fixed distance back scores here as well, an induction head does not.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Int
from torch import Tensor

__all__ = [
    "RepeatedTokens",
    "ordinary_token_ids",
    "repeated_tokens",
    "SCORE_TARGETS",
    "choose_seq_lens",
    "distinct_tokens_needed",
    "MIN_SEQ_LEN",
]

SCORE_TARGETS = ("induction", "duplicate", "previous", "control")  # keys of the target masks
MIN_SEQ_LEN = 4  # shorter repeats: too few queries per row to tell induction from chance
_WORD = re.compile(r"^ ?[A-Za-z]{2,}$")  # " the", "cat": tokens a reader recognises


def ordinary_token_ids(tokenizer, d_vocab: int) -> Int[Tensor, " n"]:
    """Ids of word-like tokens that decode and re-encode to themselves, without specials.

    Falls back to every non-special id below ``d_vocab`` when the vocabulary has fewer than 64
    word-like tokens (tiny test tokenizers).
    """
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    vocab = tokenizer.get_vocab()
    words = []
    for token_id in sorted(vocab.values()):
        if token_id in special or token_id >= d_vocab:
            continue
        text = tokenizer.decode([token_id])
        if _WORD.match(text) and tokenizer.encode(text, add_special_tokens=False) == [token_id]:
            words.append(token_id)
    if len(words) < 64:
        words = [i for i in range(d_vocab) if i not in special and i < len(vocab)]
    return torch.tensor(words, dtype=torch.long)


@dataclass(frozen=True)
class RepeatedTokens:
    """A batch of ``[BOS] + a + a + filler`` rows and where every score looks."""

    tokens: Int[Tensor, "batch pos"]
    seq_lens: Int[Tensor, " batch"]  # the repeat length L of each row
    prefix: int = 1  # tokens before the first copy: 1 (BOS) or 0 (a model without BOS)

    def __repr__(self) -> str:
        lens = self.seq_lens.tolist()
        counts = {n: lens.count(n) for n in dict.fromkeys(lens)}
        per = ", ".join(f"{n} x{c}" for n, c in counts.items())
        return (
            f"RepeatedTokens(tokens {list(self.tokens.shape)}, seq_lens {per}, "
            f"prefix {self.prefix})"
        )

    def targets(self, kind: str) -> tuple[Tensor, Tensor, Tensor]:
        """``(batch_index, q_pos, k_pos)`` of every query that has a ``kind`` target."""
        if kind not in SCORE_TARGETS:
            raise ValueError(f"kind must be one of {SCORE_TARGETS}, got {kind!r}")
        n_pos = self.tokens.shape[1]
        q = torch.arange(n_pos)[None, :]  # [1 pos]
        lens = self.seq_lens[:, None]  # [batch 1]
        start = self.prefix + lens  # first position of the second copy
        if kind == "previous":
            has = q >= 1
            offset = torch.ones_like(lens)
        else:
            in_second = (q >= start) & (q < start + lens)
            has = (q >= start + lens) if kind == "control" else in_second
            offset = lens if kind == "duplicate" else lens - 1
        has = has.expand(len(lens), n_pos)
        b, q_pos = has.nonzero(as_tuple=True)
        return b, q_pos, q_pos - offset[b, 0]

    def loss_positions(self, half: str) -> tuple[Tensor, Tensor]:
        """``(batch_index, pos)`` whose next-token prediction lies inside the first/repeated copy.

        Predictions of a copy's own first token are left out: nothing in the context predicts it.
        """
        n_pos = self.tokens.shape[1]
        p = torch.arange(n_pos)[None, :]
        lens = self.seq_lens[:, None]
        first = self.prefix  # position of the first copy's first token
        if half == "first":
            has = (p >= first) & (p < first + lens - 1)
        elif half == "repeated":
            has = (p >= first + lens) & (p < first + 2 * lens - 1)
        else:
            raise ValueError(f"half must be 'first' or 'repeated', got {half!r}")
        return has.expand(len(lens), n_pos).nonzero(as_tuple=True)


def distinct_tokens_needed(seq_lens: Sequence[int]) -> int:
    """Distinct ordinary tokens one row needs: ``a`` plus the filler that pads it (all fresh)."""
    return 2 * max(seq_lens) - min(seq_lens)


def choose_seq_lens(
    defaults: Sequence[int], *, n_ctx: int, n_vocab: int, prefix: int = 1
) -> tuple[list[int], str | None]:
    """Repeat lengths that fit the context and the vocabulary: ``(lengths, why or None)``.

    The ``defaults`` are kept when they fit. Otherwise the ones that fit are kept (dropping the
    longest first) while at least two remain, since two lengths tell induction from "attend N
    back"; failing that, lengths ``L/4, L/2, L`` with the longest ``L`` that fits. ``why`` says
    what did not fit. Raises ``ValueError`` when no length of at least ``MIN_SEQ_LEN`` fits.
    """
    ctx_max = (n_ctx - prefix) // 2  # prefix + a + a within the context

    def fits(lens: Sequence[int]) -> bool:
        return bool(lens) and max(lens) <= ctx_max and distinct_tokens_needed(lens) <= n_vocab

    defaults = sorted({int(n) for n in defaults})
    if fits(defaults):
        return defaults, None
    limits = []
    if max(defaults) > ctx_max:
        limits.append(f"the context of {n_ctx} tokens holds repeats of at most {ctx_max}")
    if distinct_tokens_needed(defaults) > n_vocab:
        limits.append(
            f"{defaults} need {distinct_tokens_needed(defaults)} distinct ordinary "
            f"tokens per row but the vocabulary offers {n_vocab}"
        )
    why = f"the default repeat lengths {defaults} do not fit: {'; '.join(limits)}"
    kept = [n for n in defaults if n <= ctx_max and n >= MIN_SEQ_LEN]
    while len(kept) >= 2 and not fits(kept):
        kept = kept[:-1]
    if len(kept) >= 2 and fits(kept):
        return kept, why
    for longest in range(min(ctx_max, n_vocab), MIN_SEQ_LEN - 1, -1):
        lens = sorted({max(MIN_SEQ_LEN, longest // 4), max(MIN_SEQ_LEN, longest // 2), longest})
        if fits(lens):
            return lens, why
    raise ValueError(
        f"no repeat length of at least {MIN_SEQ_LEN} fits this model: the context "
        f"of {n_ctx} tokens holds repeats of at most {ctx_max} and the vocabulary "
        f"offers {n_vocab} distinct ordinary tokens"
    )


def repeated_tokens(
    vocab: Int[Tensor, " n"],
    *,
    seq_lens: Sequence[int],
    batch_size: int,
    bos_id: int | None,
    seed: int,
) -> RepeatedTokens:
    """``batch_size`` rows for each repeat length, seeded, padded with fresh filler tokens.

    ``bos_id=None`` builds rows without a BOS token (``prefix=0``), for models that have none.
    """
    if not seq_lens or any(n < 2 for n in seq_lens):
        raise ValueError(f"seq_lens must be repeat lengths of at least 2, got {list(seq_lens)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    longest = max(seq_lens)
    need = distinct_tokens_needed(seq_lens)
    if need > len(vocab):
        raise ValueError(
            f"repeat length {longest} needs {need} distinct ordinary tokens but the "
            f"vocabulary offers {len(vocab)}; pass shorter seq_lens"
        )
    generator = torch.Generator().manual_seed(seed)
    rows, lens = [], []
    for seq_len in seq_lens:
        for _ in range(batch_size):
            picks = vocab[torch.randperm(len(vocab), generator=generator)]
            a, filler = picks[:seq_len], picks[seq_len : seq_len + 2 * (longest - seq_len)]
            head = torch.tensor([] if bos_id is None else [bos_id], dtype=torch.long)
            rows.append(torch.cat([head, a, a, filler]))
            lens.append(seq_len)
    return RepeatedTokens(
        tokens=torch.stack(rows), seq_lens=torch.tensor(lens), prefix=0 if bos_id is None else 1
    )
