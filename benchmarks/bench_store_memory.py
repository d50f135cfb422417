"""Peak memory of reading a store 100x larger than ``max_bytes`` and of training an SAE and a
transcoder from it, measured in a fresh process (its resident size), never computed from the
plan that sized the buffer.

    python benchmarks/bench_store_memory.py                  # max_bytes 10 MiB, stores 100x
    python benchmarks/bench_store_memory.py --max-bytes 16MiB --ratio 100 --steps 400

The driver fills two stores with the bundled model (``fill_store``: one hook for the SAE,
every layer's ``mlp.hook_in`` and ``mlp.hook_out`` for the transcoder; one part filled by
the model, linked 20 times over), each at least ``--ratio`` times ``--max-bytes`` on disk.
For each it starts a fresh Python process that loads the model, opens the store, trains once
for three steps (a warm-up: lazy imports, code pages), and then measures three stretches,
each from a reset of the kernel's peak resident size (``gc``, glibc's ``malloc_trim`` so that
nothing freed before is reused unseen, ``/proc/self/clear_refs``; Linux) to its peak
(``VmHWM``):

- ``reading``: the store read in batches with the share of ``max_bytes`` the training gives
  its reading (``reader``, :mod:`interp.stores.budget`), as many as the training takes, the
  caller holding one while the next is made; it must stay under that share (exit 1 otherwise);
- ``steps``: the training's steps from the store (from its source's creation to the last
  step): the reading plus the dictionary, Adam's state and each step's tensors;
- ``evaluation``: from the folding of the weights to the end (the held-out figures);
- ``whole``: the whole ``train_sae`` / ``train_transcoder`` call, with its held-out figures
  (computed by the model; shrunk to ``--eval-tokens``, the constants ``EVAL_TOKENS``): what
  ``max_bytes`` bounds; it must stay under it (exit 1 otherwise).

Beside them, the training's own estimates (``TrainingBudget``): its state (parameters,
gradients, Adam's moments), one step's tensors, its evaluation, and the reader's share.
Prints one JSON line per store and a table.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAE_HOOK = "blocks.1.hook_resid_pre"  # the bundled SAE's
TEXT = "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int\n    y: int\n" * 40


def status() -> dict[str, int]:
    """This process's ``VmRSS`` and ``VmHWM`` in bytes."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def store_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*.npy"))


def train(kind: str, model, store, max_bytes: int, steps: int) -> float:
    """One training from ``store``; returns its last loss (so the work is not optimised away)."""
    from interp import train_sae, train_transcoder

    common = {"store": store, "max_bytes": max_bytes, "steps": steps, "progress": False}
    if kind == "sae":
        _, report = train_sae(model, SAE_HOOK, [TEXT], d_sae=64, architecture="topk", k=8,
                              batch_tokens=128, **common)  # fmt: skip
        return float(report.history["loss"].iloc[-1])
    _, report = train_transcoder(model, None, [TEXT], d_tc=64, batch_tokens=64, **common)
    return float(report.history["loss"].iloc[-1])


class Peak:
    """The peak resident size over a stretch of a process: :meth:`start` frees what it can and
    resets the kernel's peak to the present size; :meth:`stop` reads how far it rose."""

    def __init__(self):
        self.before = self.growth = None

    def start(self) -> None:
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # else a freed buffer is reused unseen
        Path("/proc/self/clear_refs").write_text("5")  # the peak is now the present size
        self.before = status()["VmRSS"]

    def stop(self) -> None:
        if self.before is not None and self.growth is None:
            self.growth = status()["VmHWM"] - self.before


def watch_steps(kind: str, peak: Peak, evaluation: Peak) -> None:
    """Start ``peak`` when the training has its source (the store opened and checked, the
    model's fingerprint taken, nothing read yet) and stop it when the last step is done (before
    the weights are folded and the held-out figures computed from the model)."""
    import interp.saes.train as sae_train
    import interp.transcoders.fit as fit
    import interp.transcoders.train as tc_train

    def started(original):
        def wrapper(*args, **kwargs):
            out = original(*args, **kwargs)
            peak.start()
            return out

        return wrapper

    def stopped(original):
        def wrapper(*args, **kwargs):
            peak.stop()
            evaluation.start()  # the reading is freed and trimmed by now
            return original(*args, **kwargs)

        return wrapper

    if kind == "sae":
        sae_train._source = started(sae_train._source)
        sae_train._fold = stopped(sae_train._fold)
    else:
        tc_train.store_pairs = started(tc_train.store_pairs)
        fit.fold = stopped(fit.fold)


def watch_budget(found: list) -> None:
    """Keep the :class:`interp.stores.budget.TrainingBudget` each training shares out."""
    import interp.stores.pairs as pairs
    import interp.stores.sae_source as sae_source

    for module in (pairs, sae_source):
        original = module.split_budget

        def kept(*args, _original=original, **kwargs):
            found.append(_original(*args, **kwargs))
            return found[-1]

        module.split_budget = kept


def child(args) -> None:
    import torch

    torch.set_num_threads(1)
    import interp.saes.train
    import interp.transcoders.train
    from interp import load_model
    from interp.stores import ActivationStore

    interp.saes.train.EVAL_TOKENS = args.eval_tokens
    interp.transcoders.train.EVAL_TOKENS = args.eval_tokens
    model = load_model("tiny-induction")
    store = ActivationStore(args.store)
    budgets = []  # what each training gives its reading, its steps and its evaluation
    watch_budget(budgets)
    train(args.kind, model, store, args.max_bytes, 3)  # the warm-up
    train(args.kind, model, store, args.max_bytes, 3)  # (twice: glibc's thresholds settle)
    hooks = list(store.hooks)
    reading = Peak()  # the reading alone, at the training's share: as many batches as it takes
    reading.start()
    which = hooks if len(hooks) > 1 else hooks[0]
    batch_tokens = 128 if len(hooks) == 1 else 64  # as train() takes them
    gen = torch.Generator().manual_seed(0)
    batches = store.batches(which, batch_tokens, generator=gen, max_bytes=budgets[-1].reading)
    held = None
    for _ in range(args.steps):
        held = next(batches)  # the caller holds one batch while the next is made
    reading.stop()
    del batches, held
    whole = Peak()  # one call measured whole, nothing reset inside it
    whole.start()
    start = time.perf_counter()
    loss = train(args.kind, model, store, args.max_bytes, args.steps)
    whole.stop()
    seconds = time.perf_counter() - start
    steps, evaluation = Peak(), Peak()  # the same call again, measured in two stretches
    watch_steps(args.kind, steps, evaluation)
    again = train(args.kind, model, store, args.max_bytes, args.steps)
    evaluation.stop()
    b = budgets[-1]
    print(json.dumps({
        "kind": args.kind, "store_bytes": store_bytes(Path(args.store)),
        "max_bytes": args.max_bytes, "reading": reading.growth, "steps": steps.growth,
        "evaluation_measured": evaluation.growth, "whole": whole.growth, "n_steps": args.steps,
        "state": b.state, "step": b.steps, "evaluation": b.evaluation, "reader": b.reading,
        "margin": b.margin, "planned": b.planned, "seconds": round(seconds, 2), "loss": loss,
        "same_loss": again == loss,
    }))  # fmt: skip


def fill(kind: str, folder: Path, max_bytes: int, ratio: float, copies: int = 20) -> Path:
    """A store of at least ``ratio x max_bytes`` bytes of the bundled model's activations for
    ``kind``: one part filled by the model, then linked ``copies`` times as parts of their own
    (the same activations over again: filling it all would take minutes on a CI machine)."""
    import torch

    from interp import load_model
    from interp.stores import ActivationStore, fill_store

    model = load_model("tiny-induction")
    layers = range(int(model.cfg.n_layers))
    sides = ("hook_in", "hook_out")
    hooks = [SAE_HOOK] if kind == "sae" else [f"blocks.{n}.mlp.{s}" for n in layers for s in sides]
    per_token = 4 * int(model.cfg.d_model) * len(hooks)
    rows = -(-int(ratio * max_bytes) // (per_token * 128 * copies))
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, int(model.cfg.d_vocab), (rows, 128), generator=gen)
    store = fill_store(folder / kind, model, hooks, tokens, progress=False)
    first = store.path / store.parts[0]["part"]
    for k in range(1, copies):
        (store.path / f"part-{k:05d}").mkdir()
        for f in first.iterdir():
            os.link(f, store.path / f"part-{k:05d}" / f.name)
    meta = dict(store.meta, parts=[{"part": f"part-{k:05d}", "tokens": len(store)}
                                   for k in range(copies)], tokens=copies * len(store))  # fmt: skip
    (store.path / "store.json").write_text(json.dumps(meta, indent=1) + "\n")
    return ActivationStore(store.path).path


def measure(kind: str, store: Path, max_bytes: int, steps: int, eval_tokens: int) -> dict:
    """One fresh process's measurement (module docstring)."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    argv = [sys.executable, __file__, "child", kind, str(store), str(max_bytes), str(steps),
            str(eval_tokens)]  # fmt: skip
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"the {kind} measurement failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "child":
        kind, store, max_bytes, steps, eval_tokens = argv[1:]
        child(argparse.Namespace(kind=kind, store=store, max_bytes=int(max_bytes),
                                 steps=int(steps), eval_tokens=int(eval_tokens)))  # fmt: skip
        return 0
    from interp.foundation.sizes import parse_size

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-bytes", default="10MiB")
    parser.add_argument("--ratio", type=float, default=100.0, help="store size / max_bytes")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--eval-tokens", type=int, default=256)
    parser.add_argument("--kinds", default="sae,transcoder")
    parser.add_argument("--copies", type=int, default=20, help="links of the one part filled")
    args = parser.parse_args(argv)
    max_bytes = parse_size(args.max_bytes)
    rows, failed = [], False
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        for kind in args.kinds.split(","):
            store = fill(kind, Path(tmp), max_bytes, args.ratio, args.copies)
            row = measure(kind, store, max_bytes, args.steps, args.eval_tokens)
            print(json.dumps(row), flush=True)
            rows.append(row)
            failed |= row["whole"] > max_bytes or row["reading"] > row["reader"]
    print(
        f"\n{'kind':<12}{'store':>15}{'max_bytes':>12}{'reader':>11}{'reading':>11}"
        f"{'steps':>11}{'whole':>11}{'/ budget':>9}{'state':>9}{'step':>11}{'eval est':>11}"
        f"{'eval':>11}"
    )
    for r in rows:
        ratio = r["whole"] / r["max_bytes"]
        print(
            f"{r['kind']:<12}{r['store_bytes']:>15,}{r['max_bytes']:>12,}{r['reader']:>11,}"
            f"{r['reading']:>11,}{r['steps']:>11,}{r['whole']:>11,}{ratio:>9.2f}"
            f"{r['state']:>9,}{r['step']:>11,}{r['evaluation']:>11,}"
            f"{r['evaluation_measured']:>11,}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
