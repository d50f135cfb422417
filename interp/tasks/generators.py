"""Task generators: induction, IOI and greater-than, deterministic by seed, for one tokenizer.

Each generator uses only words that are one token for ``model`` (names with their leading
space, two-digit years, round-tripping token ids) and refuses, saying how many it found and how
many it needs, when the tokenizer has too few. Every generated task is checked with
:meth:`Task.tokens` before it is returned.

- :func:`induction`: ``[BOS] a a[:-1]`` with ``a`` distinct random tokens; the answer is
  ``a[-1]``, what copying the token after the earlier copy predicts. Corrupted:
  ``[BOS] b a[:-1]`` with ``b`` disjoint from ``a``, so nothing earlier predicts it.
- :func:`ioi`: "When Mary and John went to the store, John gave a drink to" -> " Mary",
  wrong " John" (ABBA and BABA orders alternate). Corrupted (ABC): three fresh names in the
  same template, so the subject is not repeated.
- :func:`greater_than`: "The war lasted from the year 17YY to the year 17" -> every two-digit
  token above YY, wrong every one at or below. Corrupted: the year 1701.
"""

from __future__ import annotations

import re

import torch

from interp.tasks.rows import TaskError
from interp.tasks.task import Task
from interp.tasks.tokens import encode
from interp.tasks.words import (
    IOI_TEMPLATES,
    NAMES,
    NOUNS,
    OBJECTS,
    PLACES,
    bos_prefix,
    need,
    ordinary_ids,
    single_tokens,
)

__all__ = ["induction", "ioi", "greater_than", "IOI_NAMES_NEEDED", "CORRUPT_YEAR"]

IOI_NAMES_NEEDED = 5  # IO and S for the clean prompt, three fresh names for the ABC corruption
CORRUPT_YEAR = 1  # greater-than's corrupted year 17(01): no year below it to compare with
CENTURY = 17  # the years' first two digits


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive number of rows, got {n!r}")


def _draw(generator: torch.Generator, size: int, k: int) -> list[int]:
    """``k`` distinct indices below ``size``."""
    return torch.randperm(size, generator=generator)[:k].tolist()


def induction(model, n: int, *, seed: int = 0, seq_len: int = 10) -> Task:
    """``n`` rows of repeated random tokens (token ids, the model's BOS first if it uses one).

    Positions: ``A`` the earlier copy of the last token, ``B`` the token after it (what an
    induction head attends to and copies), ``END`` the last token. No wrong answers: the
    metric is the answer's logit (or probability).
    """
    _check_n(n)
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise ValueError(f"seq_len must be an integer of at least 2, got {seq_len!r}")
    prefix = bos_prefix(model)
    total = len(prefix) + 2 * seq_len - 1
    if total > int(model.cfg.n_ctx):
        raise ValueError(
            f"seq_len {seq_len} makes prompts of {total} tokens but the model's "
            f"context is {model.cfg.n_ctx}; pass a smaller seq_len"
        )
    pool = ordinary_ids(model)
    need(
        "induction",
        f"distinct tokens that decode and re-encode to themselves (2 x seq_len "
        f"{seq_len}: a first half and a disjoint corrupted one)",
        len(pool),
        2 * seq_len,
        "Pass a smaller seq_len.",
    )
    generator = torch.Generator().manual_seed(seed)
    start = len(prefix)
    positions = {"A": start + seq_len - 2, "B": start + seq_len - 1, "END": total - 1}
    records = []
    for _ in range(n):
        picked = [pool[i] for i in _draw(generator, len(pool), 2 * seq_len)]
        a, b = picked[:seq_len], picked[seq_len:]
        records.append(
            {
                "clean": prefix + a + a[:-1],
                "corrupted": prefix + b + a[:-1],
                "answer": a[-1],
                "positions": positions,
                "seq_len": seq_len,
            }
        )
    return _checked(Task.from_records(records), model)


def _usable_names(model, names) -> list[str]:
    candidates = [" " + name.strip() for name in (NAMES if names is None else names)]
    # a name that is also a word of the template ("the") would be found there too
    words = set(re.findall(r"[A-Za-z]+", " ".join(IOI_TEMPLATES + PLACES + OBJECTS)))
    usable = [c for c in dict.fromkeys(candidates) if c[1:] not in words]
    found = single_tokens(model, usable)
    need(
        "ioi",
        f"names that are one token with a leading space (of {len(set(candidates))} candidates)",
        len(found),
        IOI_NAMES_NEEDED,
        "Pass names= with names this tokenizer keeps whole, e.g. ' Mary'.",
    )
    return list(found)


def _name_positions(model, prompt: str, io: str, s: str) -> dict[str, int]:
    """Where IO (once) and S (twice) are among the prompt's own tokens."""
    ids = encode(model, prompt)
    io_id, s_id = encode(model, io)[0], encode(model, s)[0]
    io_at = [i for i, t in enumerate(ids) if t == io_id]
    s_at = [i for i, t in enumerate(ids) if t == s_id]
    if len(io_at) != 1 or len(s_at) != 2:
        raise TaskError(
            f"ioi: {prompt!r} does not have {io!r} once and {s!r} twice among its tokens "
            "(a name that is also a template word, or one merged with its neighbours); pass "
            "other names="
        )
    return {"IO": io_at[0], "S1": s_at[0], "S2": s_at[1], "END": len(ids) - 1}


def ioi(model, n: int, *, seed: int = 0, names: list[str] | None = None) -> Task:
    """``n`` indirect-object-identification rows: answer the IO name, wrong the S name.

    Rows alternate ABBA ("When Mary and John ..., John gave a drink to" -> " Mary") and BABA
    ("When John and Mary ..., John gave ..." -> " Mary"); templates, places, objects and names
    are drawn with ``seed``. The corrupted prompt (ABC) puts three fresh names in the same
    template. Positions ``IO``, ``S1``, ``S2``, ``END``; metadata ``template`` (index into
    :data:`interp.tasks.words.IOI_TEMPLATES`) and ``pattern``. ``names`` replaces the
    built-in list of first names.
    """
    _check_n(n)
    pool = _usable_names(model, names)
    generator = torch.Generator().manual_seed(seed)
    records = []
    for row in range(n):
        template = int(torch.randint(len(IOI_TEMPLATES), (1,), generator=generator))
        place = PLACES[int(torch.randint(len(PLACES), (1,), generator=generator))]
        thing = OBJECTS[int(torch.randint(len(OBJECTS), (1,), generator=generator))]
        io, s, c1, c2, c3 = (pool[i] for i in _draw(generator, len(pool), IOI_NAMES_NEEDED))
        pattern = ("ABBA", "BABA")[row % 2]
        first, second = (io, s) if pattern == "ABBA" else (s, io)
        words = {"place": place, "object": thing}
        clean = IOI_TEMPLATES[template].format(A=first[1:], B=second[1:], S=s[1:], **words)
        corrupted = IOI_TEMPLATES[template].format(A=c1[1:], B=c2[1:], S=c3[1:], **words)
        records.append(
            {
                "clean": clean,
                "corrupted": corrupted,
                "answer": io,
                "wrong": s,
                "positions": _name_positions(model, clean, io, s),
                "template": template,
                "pattern": pattern,
            }
        )
    return _checked(Task.from_records(records), model)


def _usable_years(model) -> tuple[dict[int, int], list[int]]:
    """``({two-digit value: token id}, years YY usable in a prompt)``."""
    digits = single_tokens(model, [f"{yy:02d}" for yy in range(100)])
    tokens = {int(text): token for text, token in digits.items()}
    century = encode(model, f" {CENTURY}")
    usable = [yy for yy in tokens if encode(model, f" {CENTURY}{yy:02d}") == century + [tokens[yy]]]
    return tokens, usable


def greater_than(model, n: int, *, seed: int = 0) -> Task:
    """``n`` greater-than rows: "The war lasted from the year 17YY to the year 17".

    The answer is the list of every two-digit token above YY, wrong every one at or below, so
    the metrics compare summed probabilities. YY is drawn from the years 02-98 that tokenise
    as " 17" then "YY" and have some two-digit token above them; the corrupted prompt uses 01.
    Positions ``YY`` (the clean year's two digits) and ``END``; metadata ``year``, ``noun``.
    """
    _check_n(n)
    tokens, usable = _usable_years(model)
    top = max(tokens, default=-1)
    years = sorted(yy for yy in usable if 2 <= yy <= 98 and yy < top)
    hint = (
        f"The corrupted year 17{CORRUPT_YEAR:02d} must tokenise the same way"
        f"{'' if CORRUPT_YEAR in usable else ' (it does not here)'}."
    )
    need(
        "greater_than",
        f"years YY in 02-98 that tokenise as ' {CENTURY}' + 'YY' (of 97 candidates)",
        len(years) if CORRUPT_YEAR in usable else 0,
        1,
        hint,
    )
    generator = torch.Generator().manual_seed(seed)
    records = []
    for _ in range(n):
        yy = years[int(torch.randint(len(years), (1,), generator=generator))]
        noun = NOUNS[int(torch.randint(len(NOUNS), (1,), generator=generator))]
        start = f"The {noun} lasted from the year {CENTURY}"
        end = f" to the year {CENTURY}"
        clean, corrupted = f"{start}{yy:02d}{end}", f"{start}{CORRUPT_YEAR:02d}{end}"
        head, own = encode(model, start), encode(model, clean)
        at = len(head)
        if own[:at] != head or own[at] != tokens[yy]:
            raise TaskError(
                f"greater_than: this tokenizer splits {clean!r} differently from "
                f"' {CENTURY}' + '{yy:02d}'; the year's position is unclear"
            )
        records.append(
            {
                "clean": clean,
                "corrupted": corrupted,
                "answer": [f"{v:02d}" for v in sorted(tokens) if v > yy],
                "wrong": [f"{v:02d}" for v in sorted(tokens) if v <= yy],
                "positions": {"YY": at, "END": len(own) - 1},
                "year": yy,
                "noun": noun,
            }
        )
    return _checked(Task.from_records(records), model)


def _checked(task: Task, model) -> Task:
    task.tokens(model)  # a generated task the model cannot use is a bug here: fail now
    return task
