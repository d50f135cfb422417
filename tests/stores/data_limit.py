"""Memory measured by the kernel: a child process reads an epoch of a store's batches under a data
limit (``RLIMIT_DATA``: the heap and every private writable mapping, which is where numpy and
torch put what they allocate; not the store's files, which are mapped read-only and shared).

The child first reads a few batches under ``max_bytes`` (every code path once: lazy imports,
the allocator's first pools; its buffer, mapped on its own, is given back), then sets the
limit to its data size plus ``allowed`` bytes and reads a whole epoch under ``max_bytes``.
glibc is told to map every allocation of 64 KiB or more on its own
(``MALLOC_MMAP_THRESHOLD_``: given back when freed, so a freed buffer is not reused for free)
in one arena. Reading past the limit fails the allocation (numpy's
MemoryError, torch's RuntimeError): the child reports it. Linux only (``/proc``, the limit).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["read_epoch_limited"]

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import gc, json, resource, sys
import torch
torch.set_num_threads(1)
from interp.stores import ActivationStore

path, hook, batch, max_bytes, allowed = sys.argv[1:6]
batch, max_bytes, allowed = int(batch), int(max_bytes), int(allowed)
store = ActivationStore(path)


def read(budget, n):
    gen = torch.Generator().manual_seed(0)
    it = store.batches(hook, batch, generator=gen, max_bytes=budget)
    seen = 0
    for _ in range(n):
        b = next(it)
        seen += len(b)
        del b
    it.close()
    return seen


def data_bytes():
    for line in open("/proc/self/status"):
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024


d = store.meta["d"][hook]
read(max_bytes, 4)  # warm-up: every code path once (its buffer is mapped, given back)
gc.collect()
base = data_bytes()
resource.setrlimit(resource.RLIMIT_DATA, (base + allowed, resource.RLIM_INFINITY))
try:
    seen = read(max_bytes, len(store) // batch)
except (MemoryError, RuntimeError) as err:
    print(json.dumps({"ok": False, "error": str(err)[:300]}))
else:
    print(json.dumps({"ok": True, "tokens": seen, "grown": data_bytes() - base}))
"""


def read_epoch_limited(store_path, hook: str, batch: int, max_bytes: int, allowed: int) -> dict:
    """Run the child (module docstring): ``{"ok": True, "tokens": n, "grown": bytes}`` when an
    epoch was read within ``allowed`` bytes more than the warm child held, else
    ``{"ok": False, "error": ...}``."""
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p),
        OMP_NUM_THREADS="1",
        MALLOC_ARENA_MAX="1",
        MALLOC_MMAP_THRESHOLD_="65536",
    )
    args = [str(store_path), hook, str(batch), str(max_bytes), str(allowed)]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"the child failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
