"""Reproduce the bundled SAE ("tiny-induction-sae") from an activation store on disk.

Run:  python experiments/train_bundled_sae_from_store.py [--store DIR] [--shards 2] [--steps N]

Fills a store with exactly the activations ``train_sae`` draws for the bundled SAE's settings
(experiments/train_bundled_sae.py's ``SAEConfig``: seed 0, 512 features, topk 16, 3,000 steps
of 1,024 tokens), computed in ``--shards`` local processes
(:func:`interp.stores.training.fill_training_store`), then trains from the store on one thread
with deterministic algorithms, and compares the weights and the held-out figures with the
shipped SAE's. ``--steps`` (fewer steps) or ``--memory`` compare with a run in memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["OMP_NUM_THREADS"] = "1"  # the store's workers inherit it
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from experiments.train_bundled_sae import DEFAULT_OUT, HOOK, MODEL, SAEConfig  # noqa: E402
from interp.foundation.executors import LocalExecutor  # noqa: E402
from interp.models.loading import load_model  # noqa: E402
from interp.saes.train import train_sae  # noqa: E402
from interp.stores.training import fill_training_store  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, default=None, help="default: a temporary folder")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--memory", action="store_true", help="also train in memory, compare")
    args = parser.parse_args(argv)
    cfg = SAEConfig(**({} if args.steps is None else {"steps": args.steps}))
    torch.set_num_threads(cfg.threads)
    torch.use_deterministic_algorithms(True)
    root = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    model = load_model(MODEL, device="cpu")
    store_dir = args.store or Path(tempfile.mkdtemp(prefix="interp-sae-store-"))
    settings = dict(d_sae=cfg.d_sae, steps=cfg.steps, batch_tokens=cfg.batch_tokens, seed=cfg.seed)
    start = time.perf_counter()
    store = fill_training_store(
        store_dir, model, HOOK, shards=args.shards, executor=LocalExecutor(args.shards), **settings
    )
    fill_s = time.perf_counter() - start
    print(
        f"filled {len(store.parts)} parts, {len(store):,} vectors, "
        f"{store.nbytes(HOOK) / 2**20:.0f} MiB in {fill_s:.0f} s ({args.shards} processes)"
    )
    train = dict(architecture=cfg.architecture, k=cfg.k, lr=cfg.lr, progress=False, **settings)
    sae, report = train_sae(model, HOOK, store=store, **train)
    print(
        f"trained from the store in {report.seconds:.0f} s: L0 {report.l0:.2f}, explained "
        f"variance {report.explained_variance:.4f}, MSE {report.mse:.6f}, dead "
        f"{len(report.dead_features)}"
    )
    shipped = load_file(DEFAULT_OUT / "sae_weights.safetensors")
    if args.steps is None:
        figures = json.loads((DEFAULT_OUT / "TRAINING.json").read_text())["figures"]
        print(f"shipped: {figures}")
        same = {n: torch.equal(getattr(sae, n).detach(), shipped[n]) for n in shipped}
        print(f"weights equal to the shipped SAE's: {same}")
    if args.steps is not None or args.memory:
        memory, again = train_sae(model, HOOK, **train)
        print(
            f"trained in memory in {again.seconds:.0f} s: L0 {again.l0:.2f}, explained "
            f"variance {again.explained_variance:.4f}, MSE {again.mse:.6f}, dead "
            f"{len(again.dead_features)}"
        )
        same = {n: torch.equal(getattr(sae, n), getattr(memory, n)) for n in shipped}
        print(f"weights equal to the in-memory SAE's: {same}")
        if args.steps is None:
            print(
                "in memory = shipped:",
                {n: torch.equal(getattr(memory, n).detach(), shipped[n]) for n in shipped},
            )
    print(json.dumps({"config": dataclasses.asdict(cfg), "fill_seconds": round(fill_s, 1)}))
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
