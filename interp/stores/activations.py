"""Activations on disk: written in parts by parallel workers, read back shuffled in batches.

A store is a folder::

    store.json                 format, model (source, fingerprint), hooks, d per hook, dtype,
                               parts in order with their token counts, how it was filled
    part-00000/HOOK.npy        [tokens d] activations at HOOK (numpy, float32)
    part-00000/tokens.npy      [tokens] the token id each activation vector is of
    run.json, shard-I-of-N.json   the executor's record of finished shards (a re-run resumes)

:func:`fill_store` runs a token stream (rows of token ids) through the model in shards on any
executor (:mod:`interp.foundation.executors`). Each shard's job carries only its own rows;
it runs :data:`ROWS_PER_PASS` rows at a time, one forward pass for every hook, into its part
(:func:`interp.stores.parts.fill_part`), and the driver writes ``store.json`` last, so a
store that has one is complete. A BOS token at position 0 is left out
(:func:`interp.dictionaries.data.hook_activations` computes them).

:meth:`ActivationStore.batches` reads it back shuffled without loading it, holding at most
``max_bytes`` (:mod:`interp.stores.reading` says what is counted).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.foundation.executors.local import InlineExecutor
from interp.foundation.executors.runner import run_shards
from interp.foundation.files import write_text_atomic
from interp.models.fingerprint import model_fingerprint
from interp.models.workers import model_spec, worker_model
from interp.stores.parts import file_name, fill_part, npy_layout, read_rows, write_part
from interp.stores.reading import BLOCK, reading_plan, shuffled_batches
from interp.stores.sae_source import sae_source

__all__ = ["ActivationStore", "fill_store", "write_part", "FORMAT", "BLOCK", "ROWS_PER_PASS"]

FORMAT = "interp-activations/1"  # store.json's format: other stores are refused
ROWS_PER_PASS = 64  # token rows per forward pass while filling


def shard_rows(n_rows: int, index: int, count: int) -> slice:
    """The rows of shard ``index`` of ``count``: consecutive, the last ones shorter."""
    per = -(-n_rows // count)
    return slice(index * per, min(n_rows, (index + 1) * per))


@dataclass(frozen=True)
class _FillShard:
    """A token stream's activations, shard by shard: ``for_shard(i, n)`` is the job of shard
    ``i`` alone, holding only its rows (what an executor sends to its worker)."""

    spec: dict  # interp.models.workers.model_spec
    hooks: tuple[str, ...]
    rows: np.ndarray  # [rows pos] token ids: every row, or shard `shard`'s only
    path: str
    shard: tuple[int, int] | None = None  # (index, count) when rows are that shard's

    @property
    def device(self) -> str:  # where the workers' model runs (interp.foundation.executors)
        return self.spec["device"]

    def for_shard(self, index: int, count: int) -> _FillShard:
        return replace(self, rows=self.rows[shard_rows(len(self.rows), index, count)].copy(),
                       shard=(index, count))  # fmt: skip

    def __call__(self, index: int, count: int) -> dict:
        mine = self if self.shard == (index, count) else self.for_shard(index, count)
        model = worker_model(**self.spec)
        batches = torch.as_tensor(mine.rows).split(ROWS_PER_PASS)
        return fill_part(Path(self.path) / f"part-{index:05d}", model, self.hooks, batches)


def write_meta(
    path: Path, model, hooks: Sequence[str], parts: list[dict], filled: dict
) -> ActivationStore:
    """``store.json``, written last: the parts in order and what they hold; the store, opened."""
    meta = {
        "format": FORMAT,
        "model": {"source": model["source"], "fingerprint": model["fingerprint"]},
        "hooks": list(hooks),
        "d": parts[0]["d"],
        "dtype": "float32",
        "parts": [{"part": p["part"], "tokens": p["tokens"]} for p in parts],
        "tokens": sum(p["tokens"] for p in parts),
        "filled": filled,
    }
    write_text_atomic(Path(path) / "store.json", json.dumps(meta, indent=1) + "\n")
    return ActivationStore(path)


def fill_store(
    path: str | os.PathLike,
    model,
    hooks: Sequence[str],
    tokens: Int[Tensor, "rows pos"],
    *,
    shards: int = 1,
    executor=None,
    progress: bool = True,
) -> ActivationStore:
    """Run ``tokens`` (rows of token ids) through ``model`` and store the activations at ``hooks``
    in ``shards`` parts under ``path``, each shard on ``executor`` (an executor of
    :mod:`interp.foundation.executors.backends`; None: one after the other here). A re-run with
    the same model, hooks and tokens does only the parts that are missing."""
    tokens = torch.as_tensor(tokens)
    if tokens.dim() != 2 or not 1 <= shards <= len(tokens):
        raise ValueError(
            f"tokens must be [rows pos] with at least one row per shard, got shape "
            f"{tuple(tokens.shape)} for {shards} shards"
        )
    spec = model_spec(model)
    rows = tokens.to(torch.int64).numpy()
    job = _FillShard(spec, tuple(hooks), rows, str(path))  # each shard is sent its rows only
    digest = hashlib.sha256(np.ascontiguousarray(rows).tobytes()).hexdigest()[:16]
    key = {"store": FORMAT, "model": spec["fingerprint"], "hooks": list(hooks), "tokens": digest}
    parts = run_shards(
        job, shards, executor or InlineExecutor(), path, key=key, progress=progress,
        desc="activation shards",
    )  # fmt: skip
    return write_meta(Path(path), spec, hooks, parts, {"kind": "tokens", "tokens_sha": digest})


class ActivationStore:
    """A store on disk (module docstring), opened without reading its activations."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        meta_path = self.path / "store.json"
        if not meta_path.is_file():
            raise ValueError(
                f"{self.path} is not a complete activation store (no store.json); fill it with "
                "interp.stores.fill_store (a re-run resumes)"
            )
        self.meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if self.meta.get("format") != FORMAT:
            raise ValueError(f"{meta_path} is of format {self.meta.get('format')!r}, not {FORMAT}")
        self.hooks: list[str] = self.meta["hooks"]
        self.fingerprint: str = self.meta["model"]["fingerprint"]
        self.parts: list[dict] = self.meta["parts"]
        self.peak_bytes = 0  # the most a reading planned to hold (reading.py), not a measurement

    def __len__(self) -> int:
        """Activation vectors (tokens) in the store."""
        return int(self.meta["tokens"])

    def nbytes(self, hook: str) -> int:
        """Bytes of the activations at ``hook`` on disk."""
        return len(self) * int(self.meta["d"][hook]) * 4

    def check(self, model, hook: str) -> None:
        """A ValueError unless ``model`` is the store's model and ``hook`` is in it."""
        if hook not in self.hooks:
            raise ValueError(f"{self.path} holds {', '.join(self.hooks)}, not {hook}")
        found = model_fingerprint(model)
        if found != self.fingerprint:
            raise ValueError(
                f"{self.path} holds the activations of another model (fingerprint "
                f"{self.fingerprint}, this one {found}); fill a store with this model"
            )

    def part(self, index: int, hook: str) -> np.ndarray:
        """Part ``index``'s ``[tokens d]`` activations at ``hook``, memory-mapped (not read; for
        looking at a part: :meth:`batches` reads without maps)."""
        return np.load(self.path / self.parts[index]["part"] / file_name(hook), mmap_mode="r")

    def read(self, index: int, hook: str) -> Float[Tensor, "tokens d"]:
        """Part ``index``'s activations at ``hook``, read whole (a plain read, no map)."""
        offset, shape = npy_layout(self.path / self.parts[index]["part"] / file_name(hook))
        out = np.empty(shape, dtype=np.float32)
        with open(self.path / self.parts[index]["part"] / file_name(hook), "rb") as f:
            read_rows(f, offset, out[0].nbytes if len(out) else 0, 0, out)
        return torch.from_numpy(out)

    # what interp.train_sae trains on from this store: interp.stores.sae_source.sae_source
    sae_source = sae_source

    def tokens(self, index: int) -> np.ndarray:
        """Part ``index``'s token ids."""
        return np.load(self.path / self.parts[index]["part"] / "tokens.npy")

    def batches(
        self,
        hook: str | Sequence[str],
        batch_tokens: int,
        *,
        generator: torch.Generator,
        max_bytes: int | str | None = None,
    ) -> Iterator[Float[Tensor, "batch_tokens d"] | Float[Tensor, "batch_tokens hook d"]]:
        """Shuffled batches of ``batch_tokens`` activations at ``hook``, epoch after epoch
        (every token once per epoch), holding at most ``max_bytes`` (default: a buffer of 32
        batches). Several hooks (a list; all of one width): ``[batch_tokens hook d]``, the
        same tokens at each. The arguments are checked here, before anything is read."""
        hooks = [hook] if isinstance(hook, str) else list(hook)
        missing = [h for h in hooks if h not in self.hooks]
        if missing or not hooks:
            raise ValueError(f"{self.path} holds {', '.join(self.hooks)}, not {missing or hooks}")
        widths = {int(self.meta["d"][h]) for h in hooks}
        if len(widths) != 1:
            raise ValueError(f"hooks {hooks} are of widths {sorted(widths)}; read them apart")
        if not len(self):
            raise ValueError(f"{self.path} holds no activations")
        d = widths.pop()
        plan = reading_plan(len(self), len(hooks) * d * 4, batch_tokens, max_bytes)
        self.peak_bytes = max(self.peak_bytes, plan.planned_bytes)
        stream = shuffled_batches(self.path, self.parts, hooks, d, plan, batch_tokens, generator)
        if isinstance(hook, str):
            return (batch[:, 0] for batch in stream)
        return stream
