"""Activations on disk: written in parts by parallel workers, read back shuffled in batches.

A store is a folder::

    store.json                 format, model (source, fingerprint), hooks, d per hook, dtype,
                               parts in order with their token counts, how it was filled
    part-00000/HOOK.npy        [tokens d] activations at HOOK (memory-mapped numpy, float32)
    part-00000/tokens.npy      [tokens] the token id each activation vector is of
    run.json, shard-I-of-N.json   the executor's record of finished shards (a re-run resumes)

:func:`fill_store` runs a token stream (rows of token ids) through the model in shards on any
executor (:mod:`interp.foundation.executors`); each shard writes its part, whole or not at all, and
the
driver writes ``store.json`` last, so a store that has one is complete. A BOS token at position
0 is left out (as :func:`interp.saes.data.activations_at`, which computes them).

:meth:`ActivationStore.batches` reads it back shuffled without loading it: the parts are cut in
blocks of :data:`BLOCK` tokens, the blocks are shuffled, as many as fit ``max_bytes`` are read
into a buffer, and the buffer is shuffled again; so every token is read once per epoch and the
memory held (the buffer, its shuffle order, the batch handed out and the carry) is at most
``max_bytes``: :attr:`ActivationStore.peak_bytes` is what it planned, tests/stores/test_stores.py
measures the process's memory while an epoch is read.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.foundation.executors.local import InlineExecutor
from interp.foundation.executors.runner import run_shards
from interp.foundation.files import write_text_atomic
from interp.foundation.sizes import parse_size
from interp.models.fingerprint import model_fingerprint
from interp.models.workers import model_spec, worker_model
from interp.saes.data import activations_at

__all__ = ["ActivationStore", "fill_store", "write_part", "FORMAT", "BLOCK"]

FORMAT = "interp-activations/1"  # store.json's format: other stores are refused
BLOCK = 1024  # tokens read together: the unit of the shuffle across the whole store
ROWS_PER_PASS = 64  # token rows per forward pass while filling


def _name(hook: str) -> str:
    return f"{hook}.npy"


def write_part(folder: Path, acts: dict[str, Tensor], tokens: Tensor) -> dict:
    """Write one part (each hook's ``[n d]`` activations and the ``[n]`` token ids) into
    ``folder``, whole or not at all: into a temporary folder beside it, then one rename."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    for hook, value in acts.items():
        np.save(tmp / _name(hook), value.detach().to("cpu", torch.float32).numpy())
    np.save(tmp / "tokens.npy", tokens.to("cpu", torch.int64).numpy())
    if folder.exists():  # a shard that died after its rename and before its record
        for old in folder.iterdir():
            old.unlink()
        folder.rmdir()
    os.replace(tmp, folder)
    return {"part": folder.name, "tokens": int(len(tokens))}


@dataclass(frozen=True)
class _FillShard:
    """Shard ``i`` of ``n`` of a token stream: rows ``i*per .. (i+1)*per`` into part ``i``."""

    spec: dict  # interp.models.workers.model_spec
    hooks: tuple[str, ...]
    rows: np.ndarray  # [rows pos] token ids
    path: str

    def __call__(self, index: int, count: int) -> dict:
        model = worker_model(**self.spec)
        per = -(-len(self.rows) // count)
        mine = torch.as_tensor(self.rows[index * per : (index + 1) * per])
        acts = {h: [] for h in self.hooks}
        kept = []
        bos = getattr(model.tokenizer, "bos_token_id", None)
        for batch in mine.split(ROWS_PER_PASS):
            for hook in self.hooks:
                acts[hook].append(activations_at(model, hook, [batch]))
            keep = torch.ones(batch.shape, dtype=torch.bool)
            if bos is not None:
                keep[:, 0] = batch[:, 0] != bos
            kept.append(batch[keep])
        joined = {h: torch.cat(v) for h, v in acts.items()}
        folder = Path(self.path) / f"part-{index:05d}"
        return {
            **write_part(folder, joined, torch.cat(kept)),
            "d": {h: int(v.shape[1]) for h, v in joined.items()},
        }


def write_meta(path: Path, model, hooks: Sequence[str], parts: list[dict], filled: dict) -> None:
    """``store.json``, written last: the parts in order and what they hold."""
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
    :mod:`interp.foundation.executors.backends`; None: one after the other here). A re-run with the
    same
    model, hooks and tokens does only the parts that are missing."""
    tokens = torch.as_tensor(tokens)
    if tokens.dim() != 2 or not 1 <= shards <= len(tokens):
        raise ValueError(
            f"tokens must be [rows pos] with at least one row per shard, got shape "
            f"{tuple(tokens.shape)} for {shards} shards"
        )
    spec = model_spec(model)
    rows = tokens.to(torch.int64).numpy()
    job = _FillShard(spec, tuple(hooks), rows, str(path))
    digest = _digest(rows)
    key = {"store": FORMAT, "model": spec["fingerprint"], "hooks": list(hooks), "tokens": digest}
    parts = run_shards(
        job, shards, executor or InlineExecutor(), path, key=key, progress=progress,
        desc="activation shards",
    )  # fmt: skip
    write_meta(Path(path), spec, hooks, parts, {"kind": "tokens", "tokens_sha": digest})
    return ActivationStore(path)


def _digest(rows: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(rows).tobytes()).hexdigest()[:16]


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
        self.peak_bytes = 0  # the most batches() planned to hold (buffers, order, batches)

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
        """Part ``index``'s ``[tokens d]`` activations at ``hook``, memory-mapped (not read)."""
        return np.load(self.path / self.parts[index]["part"] / _name(hook), mmap_mode="r")

    def tokens(self, index: int) -> np.ndarray:
        """Part ``index``'s token ids."""
        return np.load(self.path / self.parts[index]["part"] / "tokens.npy")

    def batches(
        self,
        hook: str,
        batch_tokens: int,
        *,
        generator: torch.Generator,
        max_bytes: int | str | None = None,
    ) -> Iterator[Float[Tensor, "batch_tokens d"]]:
        """Shuffled batches of ``batch_tokens`` activations at ``hook``, epoch after epoch
        (every token once per epoch), holding at most ``max_bytes`` (default: 32 batches)."""
        d = int(self.meta["d"][hook])
        limit = parse_size(max_bytes) if max_bytes is not None else 33 * batch_tokens * d * 4
        # held at once: the buffer and its shuffle order (an int64 per row), the batch handed
        # out and the carry copied back (< a batch)
        batch_bytes = batch_tokens * d * 4
        capacity = (limit - 2 * batch_bytes) // (d * 4 + 8)
        if capacity < batch_tokens:
            need = 2 * batch_bytes + batch_tokens * (d * 4 + 8)
            raise ValueError(
                f"max_bytes {limit} holds {limit // (d * 4)} vectors of {d} float32; it must "
                f"hold two batches, a carry and their shuffle order ({need} bytes)"
            )
        if not len(self):
            raise ValueError(f"{self.path} holds no activations")
        block = max(1, min(BLOCK, capacity // 4))
        maps = {k: self.part(k, hook) for k in range(len(self.parts))}  # opened once
        blocks = [
            (k, start, min(start + block, part["tokens"]))
            for k, part in enumerate(self.parts)
            for start in range(0, part["tokens"], block)
        ]
        buffer = torch.empty(capacity, d)  # the one buffer: read into, batches indexed out
        planned = capacity * (d * 4 + 8) + 2 * batch_bytes  # <= limit; measured in the tests
        self.peak_bytes = max(self.peak_bytes, planned)
        held = 0  # rows of the buffer in use (the carry of the last fill first)
        while True:
            order = torch.randperm(len(blocks), generator=generator).tolist()
            while order:
                while order and held + blocks[order[0]][2] - blocks[order[0]][1] <= capacity:
                    k, start, stop = blocks[order.pop(0)]
                    buffer[held : held + stop - start].numpy()[:] = maps[k][start:stop]
                    held += stop - start
                perm = torch.randperm(held, generator=generator)
                n = held // batch_tokens * batch_tokens
                for i in range(0, n, batch_tokens):
                    yield buffer[perm[i : i + batch_tokens]]
                held = held - n
                buffer[:held] = buffer[perm[n:]]
                del perm  # freed before the next order is drawn: one order held at a time
