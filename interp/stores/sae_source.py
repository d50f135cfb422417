"""What a store gives :func:`interp.train_sae` (:meth:`ActivationStore.sae_source`): buffers of
activations, in the order training consumes them, and the held-out rows split as the budget
allows.

- a store filled by :func:`interp.stores.training.fill_training_store`: the trainer's own
  draws, replayed (token draws cost no forward pass), with the activations read from the
  store's part for that draw and checked to be of the same tokens; shuffled by the same
  generator, so training gives bit for bit the weights the memory source gives
  (tests/stores/test_stores.py);
- any other store (:func:`interp.stores.fill_store`): one shuffled batch at a time from
  :meth:`ActivationStore.batches`, holding at most ``max_bytes``: data many times memory.

``max_bytes`` is checked before training starts, for both kinds of store: a replayed draw is
read whole (it is the buffer the memory source would hold), so a budget that does not hold
what replaying holds (:func:`replay_bytes`) is refused, naming the least that would do.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from interp.dictionaries.data import kept
from interp.dictionaries.training import BUFFER_BATCHES
from interp.stores.budget import (
    TrainingBudget,
    evaluation_plan,
    split_budget,
    split_rows,
    step_bytes,
    token_bytes,
)
from interp.stores.reading import least_reading_bytes

__all__ = ["kept_tokens", "replay_bytes", "sae_budget", "sae_source"]


def kept_tokens(batches: Sequence[Tensor], bos: int | None) -> Tensor:
    """The token ids whose activations are kept (all but a BOS at position 0), flattened."""
    return torch.cat([tokens[kept(tokens, bos)] for tokens in batches])


def replay_bytes(store, hook: str) -> int:
    """What replaying ``store`` holds at once: the draw read, its shuffled copy and the draw
    before it that training still holds (float32), and the shuffle's order (int64)."""
    tokens = max(int(p["tokens"]) for p in store.parts)
    return tokens * (3 * int(store.meta["d"][hook]) * 4 + 8)


def sae_budget(
    model, hook: str, store, max_bytes, *, batch_tokens: int, d_sae: int, held_out, tokens: int,
    chunk: int,
) -> tuple[object, TrainingBudget]:  # fmt: skip
    """``store`` (opened) checked against the model and ``hook``, and ``max_bytes`` shared
    between ``train_sae``'s own state (and ``tokens`` bytes of token ids), steps, evaluation
    (on the ``held_out`` rows, ``chunk`` tokens at a time) and the reading
    (:mod:`interp.stores.budget`), before anything is read."""
    store.check(model, hook)
    d_in = int(store.meta["d"][hook])
    if store.meta["filled"]["kind"] == "training":
        least = replay_bytes(store, hook)
        how = f"{store.path} was filled for a replay: draws replayed whole (one at a time)"
    else:
        least = least_reading_bytes(len(store), 4 * d_in, batch_tokens)
        how = "a buffer of two batches"
    params = 2 * d_sae * d_in + d_sae + d_in
    evaluation = evaluation_plan(
        model, held_out, [hook], 4 * d_in, params, chunk, d_sae + d_in, max_bytes, tokens
    )
    budget = split_budget(
        max_bytes, params=params, steps=step_bytes(batch_tokens, d_in + d_sae, d_sae),
        evaluation=evaluation, tokens=tokens, least_reading=least, what="an SAE", reading_what=how,
    )  # fmt: skip
    return store, budget


def sae_source(store, model, hook: str, rows, gen: torch.Generator, *, batch_tokens: int,
               d_sae: int, max_bytes, held_out: list[Tensor], chunk: int):  # fmt: skip
    """``(buffers, held_out)``: the buffers ``train_sae`` reads from ``store`` (module
    docstring; checked against the model and ``hook`` first), and ``held_out`` split into the
    passes ``max_bytes`` allows (one pass without it)."""
    if max_bytes is None:
        store.check(model, hook)
    else:  # the whole call within max_bytes (interp.stores.budget)
        _, budget = sae_budget(model, hook, store, max_bytes, batch_tokens=batch_tokens,
                               d_sae=d_sae, held_out=held_out, chunk=chunk,
                               tokens=token_bytes(rows))  # fmt: skip
        max_bytes, held_out = budget.reading, split_rows(held_out, budget.eval_rows)
    if store.meta["filled"]["kind"] != "training":
        return store.batches(hook, batch_tokens, generator=gen, max_bytes=max_bytes), held_out
    return _replayed(store, model, hook, rows, gen, BUFFER_BATCHES * batch_tokens), held_out


def _replayed(store, model, hook, rows, gen, size: int) -> Iterator[Tensor]:
    """The trainer's draws, their activations read from the store's parts, shuffled."""
    bos = getattr(model.tokenizer, "bos_token_id", None)
    for drawn in range(len(store.parts) + 1):
        batches = rows.draw(size)
        if drawn == len(store.parts):
            raise ValueError(
                f"{store.path} holds {len(store.parts)} draws and training needs more: fill it "
                "with the same steps, batch_tokens and d_sae"
            )
        if not torch.equal(kept_tokens(batches, bos), torch.from_numpy(store.tokens(drawn))):
            raise ValueError(
                f"{store.path}'s draw {drawn} is of other tokens than this run's: it was filled "
                "with another seed, texts, steps, batch_tokens or d_sae"
            )
        acts = store.read(drawn, hook)
        yield acts[torch.randperm(len(acts), generator=gen)]
