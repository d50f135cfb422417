"""A store read back shuffled, in batches, within ``max_bytes``.

The parts are cut in blocks of at most :data:`BLOCK` tokens; each epoch the blocks are taken
in a shuffled order (an index into one permutation, nothing popped off a list), as many as fit
are read into one buffer (plain reads at each block's offset: no file is memory-mapped, so
the process's resident memory does not grow with the store), the buffer is shuffled, and
batches are handed out of it. Every token is read once per epoch.

What a reading holds at once, all counted against ``max_bytes``::

    buffer       capacity x hooks x d x 4    the rows read, not yet handed out
    its order    capacity x 8                the buffer's permutation (int64)
    the carry    batch_tokens x hooks x d x 4   the rows left over from a fill, kept for the next
    two batches  2 x batch_tokens x hooks x d x 4   the one the caller still holds while the
                                                    next is made
    the blocks   blocks x 32                 each block's part, start and stop, and the order
    a margin     4 x batch_tokens x hooks x d x 4   batches freed that the C allocator keeps
                 + 256 KiB                  the small objects of each read and batch (Python's,
                                            torch's) and the pages they leave touched

The buffer, its order and the carry are allocated once and reused, so that the only memory
taken and given back batch after batch is the batches' own. glibc's heap still keeps some of
those freed batches resident (the resident size rose 130 kB, four 32 kB batches, above the
rest in benchmarks/bench_store_memory.py; 25% above before the buffers were reused), hence
the margin :data:`ALLOCATOR_BATCHES`; and with small batches the interpreter's own small
objects and the allocator's rounding showed up to 140 kB above everything else (a 4 MiB
budget, four hooks, batches of 64 tokens), hence :data:`SMALL_OBJECTS`.

:func:`reading_plan` sizes the buffer so that they fit, or refuses (before any read) a budget
that does not hold a buffer of one batch. tests/stores/test_stores_streaming.py and
benchmarks/bench_store_memory.py measure what a training process really holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from interp.foundation.sizes import parse_size
from interp.stores.parts import file_name, npy_layout, read_rows

__all__ = [
    "ALLOCATOR_BATCHES",
    "BLOCK",
    "DEFAULT_BATCHES",
    "ReadingPlan",
    "least_reading_bytes",
    "reading_plan",
    "shuffled_batches",
]

BLOCK = 1024  # tokens read together: the unit of the shuffle across the whole store
DEFAULT_BATCHES = 32  # without max_bytes: a buffer of this many batches
BLOCK_BYTES = 32  # per block: part, start, stop (int64 each) and its place in the order
ALLOCATOR_BATCHES = 4  # batches freed that glibc's heap was measured to keep resident
HELD_BATCHES = 3 + ALLOCATOR_BATCHES  # the caller's, the next, the carry, the margin
SMALL_OBJECTS = 256 * 1024  # bytes: Python's and torch's small objects while reading (measured)


@dataclass(frozen=True)
class ReadingPlan:
    """How a reading is sized: its buffer, its blocks and what it holds at most."""

    capacity: int  # rows of the buffer
    block: int  # tokens per block
    blocks: int  # blocks in the store
    row_bytes: int  # one token's activations at every hook read
    planned_bytes: int  # everything the module docstring counts


def _plan(tokens: int, row_bytes: int, batch_tokens: int, capacity: int) -> ReadingPlan:
    block = max(1, min(BLOCK, capacity // 4, capacity - batch_tokens + 1))
    blocks = -(-tokens // block)  # at most; parts end blocks early
    fixed = HELD_BATCHES * batch_tokens * row_bytes + blocks * BLOCK_BYTES + SMALL_OBJECTS
    held = capacity * (row_bytes + 8) + fixed
    return ReadingPlan(capacity, block, blocks, row_bytes, held)


def least_reading_bytes(tokens: int, row_bytes: int, batch_tokens: int) -> int:
    """The least budget a reading takes: a buffer of two batches (module docstring)."""
    return _plan(tokens, row_bytes, batch_tokens, 2 * batch_tokens).planned_bytes


def reading_plan(
    tokens: int, row_bytes: int, batch_tokens: int, max_bytes: int | str | None
) -> ReadingPlan:
    """The buffer that fits ``max_bytes`` (module docstring); a ValueError naming the least
    budget that would do when not even a buffer of one batch fits."""
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens must be at least 1, got {batch_tokens}")
    batch = batch_tokens * row_bytes

    def plan(capacity: int) -> ReadingPlan:
        return _plan(tokens, row_bytes, batch_tokens, capacity)

    if max_bytes is None:
        return plan(DEFAULT_BATCHES * batch_tokens)
    limit = parse_size(max_bytes)
    capacity = (limit - HELD_BATCHES * batch - SMALL_OBJECTS) // (row_bytes + 8)
    while capacity >= batch_tokens and (over := plan(capacity).planned_bytes - limit) > 0:
        capacity -= -(-over // (row_bytes + 8))  # smaller blocks: more of them to keep
    if capacity < batch_tokens:
        raise ValueError(
            f"max_bytes {limit:,} is too small: it must hold two batches (the one handed out and "
            f"the one being read), the carry of a fill, a margin for the allocator and a buffer "
            f"of at least one more batch with its order; with a "
            f"buffer of two batches {plan(2 * batch_tokens).planned_bytes:,} bytes would do "
            f"(batch_tokens {batch_tokens} of {row_bytes:,} bytes per token); raise max_bytes "
            "or lower batch_tokens"
        )
    return plan(capacity)


def shuffled_batches(
    folder, parts: list[dict], hooks: list[str], d: int, plan: ReadingPlan, batch_tokens: int,
    generator: torch.Generator,
) -> Iterator[Tensor]:  # fmt: skip
    """``[batch_tokens hook d]`` batches, epoch after epoch (module docstring)."""
    layouts = {}
    for k, part in enumerate(parts):
        for j, hook in enumerate(hooks):
            path = folder / part["part"] / file_name(hook)
            offset, shape = npy_layout(path)
            if shape != (part["tokens"], d):
                raise ValueError(f"{path} holds {shape}, the store says {(part['tokens'], d)}")
            layouts[k, j] = (path, offset)
    where = np.concatenate([  # [blocks 3]: part, start, stop (no Python object per block)
        np.stack([np.full_like(s, k), s, np.minimum(s + plan.block, p["tokens"])], 1)
        for k, p in enumerate(parts) for s in [np.arange(0, p["tokens"], plan.block)]
    ])  # fmt: skip
    buffer = np.empty((len(hooks), plan.capacity, d), dtype=np.float32)
    rows = torch.from_numpy(buffer)
    order_of_rows = torch.empty(plan.capacity, dtype=torch.int64)
    carry = torch.empty(len(hooks), batch_tokens, d)
    hook_row = d * 4
    held = 0  # rows of the buffer in use (the carry of the last fill first)
    while True:
        order = torch.randperm(len(where), generator=generator)
        next_block = 0
        while next_block < len(order):
            while next_block < len(order):
                k, start, stop = (int(v) for v in where[int(order[next_block])])
                if held + stop - start > plan.capacity:
                    break
                for j in range(len(hooks)):
                    path, offset = layouts[k, j]
                    with open(path, "rb") as f:
                        read_rows(f, offset, hook_row, start, buffer[j, held : held + stop - start])
                held += stop - start
                next_block += 1
            perm = torch.randperm(held, generator=generator, out=order_of_rows[:held])
            n = held // batch_tokens * batch_tokens
            for i in range(0, n, batch_tokens):
                yield rows.index_select(1, perm[i : i + batch_tokens]).transpose(0, 1)
            rest = perm[n:]
            for j in range(len(hooks)):
                torch.index_select(rows[j], 0, rest, out=carry[j, : len(rest)])
                rows[j, : len(rest)] = carry[j, : len(rest)]
            held = len(rest)
