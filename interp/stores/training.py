"""Stores for :func:`interp.train_sae` to replay: :func:`fill_training_store` stores exactly
the activations a ``train_sae`` run draws (how it reads them: :mod:`interp.stores.sae_source`).

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
from interp.dictionaries.training import BUFFER_BATCHES
from interp.foundation.executors.local import InlineExecutor
from interp.foundation.executors.runner import run_shards
from interp.models.workers import model_spec, worker_model
from interp.stores.activations import ActivationStore, write_meta
from interp.stores.parts import fill_part
from interp.stores.sae_source import kept_tokens, replay_bytes, sae_budget

__all__ = [
    "BUFFER_BATCHES",
    "fill_training_store",
    "replay_bytes",
    "sae_budget",
    "texts_digest",
    "training_draws",
]


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
        n = len(kept_tokens(batches, bos))
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
        parts = [
            {**fill_part(Path(self.path) / f"part-{k:05d}", model, [self.hook], draws[k]), "k": k}
            for k in range(index, len(draws), count)  # each batch written as it comes
        ]
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
    ``executor``; ``train_sae(..., store=ActivationStore(path))`` with those settings then
    gives the same SAE."""
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
    return write_meta(Path(path), spec, [hook], parts, {"kind": "training", **settings})
