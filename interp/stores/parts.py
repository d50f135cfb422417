"""A store's parts, written as the activations come and read back without memory maps.

A part is a folder of ``HOOK.npy`` (``[tokens d]`` float32) and ``tokens.npy`` (``[tokens]``
int64). :class:`PartWriter` fills one from a stream of passes: each file's header is written
first (the part's token count is known before any pass: every position but a BOS at position
0), then each pass's rows are appended and dropped, so the writer holds one pass at a time
whatever the part's size. It writes into a temporary folder beside the part and renames it
whole at the end: a part is there complete or not at all. :func:`fill_part` fills one from
the model's forward passes over rows of token ids.

:func:`read_rows` reads rows of a part's file straight into a caller's buffer (a plain read
at the rows' offset: pages of the file are not mapped into the process, so reading a store
much larger than memory leaves no trace in its resident size).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from interp.dictionaries.data import hook_activations, kept

__all__ = ["PartWriter", "fill_part", "npy_layout", "read_rows", "write_part"]

FLOAT = np.dtype("<f4")  # every activation is stored as little-endian float32
TOKEN = np.dtype("<i8")


def file_name(hook: str) -> str:
    return f"{hook}.npy"


class PartWriter:
    """One part, written pass by pass (module docstring): ``n`` tokens in all."""

    def __init__(self, folder: str | os.PathLike, n: int):
        self.folder, self.n = Path(folder), int(n)
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.folder.name}-", dir=self.folder.parent))
        self.files: dict[str, object] = {}
        self.written: dict[str, int] = {}

    def _append(self, name: str, rows: np.ndarray) -> None:
        if name not in self.files:
            f = open(self.tmp / name, "wb")  # noqa: SIM115 (closed in close())
            header = {"descr": rows.dtype.str, "fortran_order": False}
            np.lib.format.write_array_header_1_0(f, {**header, "shape": (self.n, *rows.shape[1:])})
            self.files[name], self.written[name] = f, 0
        if self.written[name] + len(rows) > self.n:
            raise ValueError(f"{name}: more than the part's {self.n} tokens were written")
        self.files[name].write(np.ascontiguousarray(rows).tobytes())
        self.written[name] += len(rows)

    def write(self, acts: dict[str, Tensor], tokens: Int[Tensor, " n"]) -> None:
        """Append one pass: each hook's ``[n d]`` activations and their ``[n]`` token ids."""
        for hook, value in acts.items():
            self._append(file_name(hook), value.detach().to("cpu", torch.float32).numpy())
        self._append("tokens.npy", tokens.to("cpu", torch.int64).numpy().astype(TOKEN))
        for f in self.files.values():
            f.flush()  # on disk pass by pass, nothing of a pass kept in a buffer

    def close(self) -> dict:
        """Check every file holds ``n`` tokens, then put the part in place in one rename."""
        for f in self.files.values():
            f.close()
        short = {name: w for name, w in self.written.items() if w != self.n}
        if short or not self.files:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise ValueError(f"{self.folder}: expected {self.n} tokens per file, got {short}")
        if self.folder.exists():  # a shard that died after its rename and before its record
            shutil.rmtree(self.folder)
        os.replace(self.tmp, self.folder)
        return {"part": self.folder.name, "tokens": self.n}

    def abort(self) -> None:
        for f in self.files.values():
            f.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def fill_part(folder: Path, model, hooks: Sequence[str], batches: Sequence[Tensor]) -> dict:
    """Write one part of the activations at ``hooks`` of every kept token of ``batches`` (rows
    of token ids), one forward pass per batch, each written as it comes; the part's record
    with each hook's width ``d``."""
    bos = getattr(model.tokenizer, "bos_token_id", None)
    writer = PartWriter(folder, sum(int(kept(tokens, bos).sum()) for tokens in batches))
    try:
        for tokens in batches:
            acts = hook_activations(model, hooks, tokens)
            writer.write(acts, tokens[kept(tokens, bos)])
        return {**writer.close(), "d": {h: int(v.shape[1]) for h, v in acts.items()}}
    except BaseException:
        writer.abort()
        raise


def write_part(folder: Path, acts: dict[str, Tensor], tokens: Tensor) -> dict:
    """Write one part whole (each hook's ``[n d]`` activations and the ``[n]`` token ids)."""
    writer = PartWriter(folder, len(tokens))
    writer.write(acts, tokens)
    return writer.close()


def npy_layout(path: str | os.PathLike) -> tuple[int, tuple[int, ...]]:
    """``(offset of the data, shape)`` of a C-ordered float32 ``.npy`` file."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        readers = {(1, 0): np.lib.format.read_array_header_1_0,
                   (2, 0): np.lib.format.read_array_header_2_0}  # fmt: skip
        if version not in readers:
            raise ValueError(f"{path}: .npy version {version} is not one this store writes")
        shape, fortran, dtype = readers[version](f)
        if fortran or np.dtype(dtype) != FLOAT:
            raise ValueError(f"{path} is not a C-ordered float32 array (dtype {dtype})")
        return f.tell(), tuple(shape)


def read_rows(f, offset: int, row_bytes: int, start: int, into: np.ndarray) -> None:
    """Read rows ``start .. start + len(into)`` of the file ``f`` (data at ``offset``, rows of
    ``row_bytes``) into the C-contiguous array ``into``."""
    f.seek(offset + start * row_bytes)
    view = memoryview(into).cast("B")
    if f.readinto(view) != len(view):
        raise ValueError(f"{f.name} ends before row {start + len(into)}: the store is damaged")
