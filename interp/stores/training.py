"""Where :func:`interp.saes.train_sae` gets its activations: computed as it goes, or a store.

Three sources, one method (``next()``: the next buffer of activations, in the order training
consumes them):

- memory (no store): draw :data:`BUFFER_BATCHES` batches of token rows, run the model, shuffle
  (what ``train_sae`` always did);
- a store filled by :func:`fill_training_store`: the same draws, replayed (token draws cost no
  forward pass), with the activations read from the store's part for that draw and checked to
  be of the same tokens; shuffled by the same generator, so training gives bit for bit the
  weights the memory source gives (tests/stores/test_stores.py);
- any other store (:func:`interp.stores.fill_store`): one shuffled batch at a time from
  :meth:`ActivationStore.batches`, holding at most ``max_bytes``: data many times memory.

``max_bytes`` is checked before training starts, for both kinds of store: a replayed draw is
read whole (it is the buffer the memory source would hold), so a budget that does not hold
what replaying holds (:func:`replay_bytes`) is refused, naming the least that would do.
A training store's run is keyed by its settings and a SHA-256 of its texts (:func:`texts_digest`):
a re-run with other texts is refused, never resumed into the same folder.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from interp.dictionaries.data import TokenRows, activations_at
from interp.foundation.executors.local import InlineExecutor
from interp.foundation.executors.runner import run_shards
from interp.foundation.sizes import parse_size
from interp.models.workers import model_spec, worker_model
from interp.stores.activations import ActivationStore, write_meta
from interp.stores.budget import (
    TrainingBudget,
    evaluation_plan,
    evaluation_room,
    split_budget,
    step_bytes,
)
from interp.stores.parts import PartWriter, kept, pass_activations
from interp.stores.reading import least_reading_bytes

__all__ = [
    "BUFFER_BATCHES",
    "activation_source",
    "fill_training_store",
    "replay_bytes",
    "sae_budget",
    "texts_digest",
    "training_draws",
]

BUFFER_BATCHES = 32  # activations are drawn this many batches at a time, then shuffled


def _kept(batches: Sequence[Tensor], bos: int | None) -> Tensor:
    """The token ids activations_at keeps (all but a BOS at position 0), flattened."""
    return torch.cat([tokens[kept(tokens, bos)] for tokens in batches])


def texts_digest(texts: Sequence[str] | None) -> str | None:
    """A SHA-256 of ``texts`` (each one's length, then its UTF-8 bytes: no two lists of texts
    give the same bytes), or None for the bundled training mix."""
    if texts is None:
        return None
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def replay_bytes(store: ActivationStore, hook: str) -> int:
    """What replaying ``store`` holds at once: the draw read, its shuffled copy and the draw
    before it that training still holds (float32), and the shuffle's order (int64)."""
    tokens = max(int(p["tokens"]) for p in store.parts)
    return tokens * (3 * int(store.meta["d"][hook]) * 4 + 8)


def training_draws(model, texts, *, seed, steps, batch_tokens, d_sae, d_in) -> list[list[Tensor]]:
    """The token rows of every buffer ``train_sae`` with these settings draws, in order: its
    generator's calls replayed (draws, shuffles, the decoder's initialisation) without the
    model's forward passes."""
    gen = torch.Generator().manual_seed(seed)
    rows = TokenRows(model, texts, gen)
    bos = getattr(model.tokenizer, "bos_token_id", None)
    draws = []

    def draw() -> int:
        batches = rows.draw(BUFFER_BATCHES * batch_tokens)
        n = len(_kept(batches, bos))
        torch.randperm(n, generator=gen)
        draws.append(batches)
        return n

    n = draw()
    torch.rand(d_sae, d_in, generator=gen)  # W_dec's initialisation
    used = 0
    for _ in range(steps):
        if used + batch_tokens > n:
            n, used = draw(), 0
        used += batch_tokens
    return draws


class _Source:
    def __init__(self, model, hook, rows, gen, batch_tokens, store, max_bytes):
        self.model, self.hook, self.rows, self.gen = model, hook, rows, gen
        self.size = BUFFER_BATCHES * batch_tokens
        self.store, self.drawn = store, 0
        self.replay = store is not None and store.meta["filled"]["kind"] == "training"
        if self.replay and max_bytes is not None:
            need, limit = replay_bytes(store, hook), parse_size(max_bytes)
            if need > limit:
                raise ValueError(
                    f"max_bytes {limit:,} is too small for {store.path}: it was filled with "
                    f"fill_training_store, whose draws are replayed whole ({need:,} bytes at "
                    "once); raise max_bytes to that, or train from a store filled with "
                    "fill_store, read in batches within any budget"
                )
        if store is not None and not self.replay:
            self.batches = store.batches(hook, batch_tokens, generator=gen, max_bytes=max_bytes)

    def next(self) -> Tensor:
        if self.store is None:
            acts = activations_at(self.model, self.hook, self.rows.draw(self.size))
        elif not self.replay:
            return next(self.batches)
        else:
            batches = self.rows.draw(self.size)
            if self.drawn >= len(self.store.parts):
                raise ValueError(
                    f"{self.store.path} holds {len(self.store.parts)} draws and training needs "
                    "more: fill it with the same steps, batch_tokens and d_sae"
                )
            wanted = _kept(batches, getattr(self.model.tokenizer, "bos_token_id", None))
            found = torch.from_numpy(self.store.tokens(self.drawn))
            if not torch.equal(wanted, found):
                raise ValueError(
                    f"{self.store.path}'s draw {self.drawn} is of other tokens than this run's: "
                    "it was filled with another seed, texts, steps, batch_tokens or d_sae"
                )
            acts = self.store.read(self.drawn, self.hook)
            self.drawn += 1
        return acts[torch.randperm(len(acts), generator=self.gen)]


def activation_source(model, hook, rows, gen, batch_tokens, store=None, max_bytes=None) -> _Source:
    """The source ``train_sae`` reads (module docstring); ``store`` is checked against the
    model (its fingerprint) and the hook."""
    if store is not None:
        store = store if isinstance(store, ActivationStore) else ActivationStore(store)
        store.check(model, hook)
    elif max_bytes is not None:
        raise ValueError("max_bytes bounds what is read from a store; pass store= as well")
    return _Source(model, hook, rows, gen, batch_tokens, store, max_bytes)


def sae_budget(
    model,
    hook: str,
    store,
    max_bytes,
    *,
    batch_tokens: int,
    d_sae: int,
    held_out,
    tokens: int,
    chunk: int,
) -> tuple[ActivationStore, TrainingBudget]:
    """``store`` opened and checked against the model and ``hook``, and ``max_bytes`` shared
    between ``train_sae``'s own state (and ``tokens`` bytes of token ids), steps, evaluation
    (on the ``held_out`` rows, ``chunk`` tokens at a time) and the reading
    (:mod:`interp.stores.budget`), before anything is read."""
    store = store if isinstance(store, ActivationStore) else ActivationStore(store)
    store.check(model, hook)
    d_in = int(store.meta["d"][hook])
    if store.meta["filled"]["kind"] == "training":
        least = replay_bytes(store, hook)
        how = f"{store.path} was filled for a replay: draws replayed whole (one at a time)"
    else:
        least = least_reading_bytes(len(store), 4 * d_in, batch_tokens)
        how = "a buffer of two batches"
    params = 2 * d_sae * d_in + d_sae + d_in
    room = evaluation_room(max_bytes, params, tokens)
    evaluation = evaluation_plan(
        model, held_out, [hook], 4 * d_in, params, chunk, d_sae + d_in, room
    )
    budget = split_budget(
        max_bytes, params=params, steps=step_bytes(batch_tokens, d_in + d_sae, d_sae),
        evaluation=evaluation, tokens=tokens, least_reading=least, what="an SAE", reading_what=how,
    )  # fmt: skip
    return store, budget


@dataclass(frozen=True)
class _TrainingShard:
    """Shard ``i`` of ``n``: the activations of draws ``i, i + n, ...`` into their parts."""

    spec: dict
    hook: str
    texts: tuple[str, ...] | None
    settings: dict  # seed, steps, batch_tokens, d_sae
    path: str

    @property
    def device(self) -> str:  # where the workers' model runs (interp.foundation.executors)
        return self.spec["device"]

    def __call__(self, index: int, count: int) -> dict:
        model = worker_model(**self.spec)
        d_in = activations_at(model, self.hook, [torch.tensor([[1, 2]])]).shape[1]
        draws = training_draws(model, self.texts, d_in=d_in, **self.settings)
        bos = getattr(model.tokenizer, "bos_token_id", None)
        parts = []
        for k in range(index, len(draws), count):  # each batch written as it comes
            writer = PartWriter(Path(self.path) / f"part-{k:05d}", len(_kept(draws[k], bos)))
            try:
                for tokens in draws[k]:
                    acts = pass_activations(model, [self.hook], tokens)
                    writer.write(acts, tokens[kept(tokens, bos)])
                parts.append({**writer.close(), "k": k})
            except BaseException:
                writer.abort()
                raise
        return {"parts": parts, "d": {self.hook: int(d_in)}, "draws": len(draws)}


def fill_training_store(
    path: str | os.PathLike,
    model,
    hook: str,
    texts: Sequence[str] | None = None,
    *,
    d_sae: int,
    steps: int = 2000,
    batch_tokens: int = 1024,
    seed: int = 0,
    shards: int = 1,
    executor=None,
    progress: bool = True,
) -> ActivationStore:
    """A store of exactly the activations ``train_sae(model, hook, texts, d_sae=..., steps=...,
    batch_tokens=..., seed=...)`` draws, one part per draw, computed in ``shards`` on
    ``executor``; ``train_sae(..., store=path)`` with those settings then gives the same SAE."""
    spec = model_spec(model)
    settings = {"seed": seed, "steps": steps, "batch_tokens": batch_tokens, "d_sae": d_sae}
    job = _TrainingShard(spec, hook, None if texts is None else tuple(texts), settings, str(path))
    key = {"store": "training", "model": spec["fingerprint"], "hook": hook, **settings}
    if texts is not None:
        key["texts"] = texts_digest(texts)  # two lists of equal count and length differ here
    results = run_shards(
        job, shards, executor or InlineExecutor(), path, key=key, progress=progress,
        desc="activation shards",
    )  # fmt: skip
    parts = sorted((p for r in results for p in r["parts"]), key=lambda p: p["k"])
    parts = [{**p, "d": results[0]["d"]} for p in parts]
    write_meta(Path(path), spec, [hook], parts, {"kind": "training", **settings})
    return ActivationStore(path)
