"""ACDC against exact edge patching: time, forward passes and edges per pass, side by side
on the 2-layer zoo models and 4-layer GPT-2-like models (docs/discovery.md, "ACDC").

    PYTHONPATH=. python benchmarks/bench_acdc.py [--threshold 0.01] [--rows 8] [--tokens 16]

``acdc_timings()`` prints one line per model: the graph's edges, then exact edge patching
(``edge_scores(..., "exact")``), ACDC as interp batches it, and ACDC one edge per pass
(``WINDOW = 1``, the plain sequential algorithm): seconds, forward passes, and edges tried per
pass. ACDC's two runs must keep the same edges (checked here).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import interp.discovery.acdc as acdc_module  # noqa: E402
import interp.engine.batched as batched  # noqa: E402
from interp.discovery import EdgeGraph, edge_scores  # noqa: E402
from interp.tasks import Task  # noqa: E402

ARCHS = ("gpt2", "llama", "gpt_neox_parallel", "gptj")  # plain, GQA, parallel, shared norm
FOUR_LAYERS = {  # name -> (arch, tests.checkpoints.make_checkpoint's shape)
    "gpt2 4 layers": ("gpt2", {"n_layers": 4}),
    "gpt2 4 layers, 8 heads, d 256": ("gpt2", {"n_layers": 4, "n_heads": 8, "d_model": 256}),
}


def _model(arch: str, overrides: dict):
    from interp import load_model
    from tests.checkpoints import make_checkpoint
    from tests.zoo import make_zoo_checkpoint

    directory = Path(tempfile.mkdtemp(prefix="interp-bench-acdc-"))
    if overrides:  # a shape of its own: the tests' checkpoint builder
        make_checkpoint(directory, arch=arch, **overrides)
    else:  # the 2-layer zoo model
        make_zoo_checkpoint(directory, arch)
    return load_model(directory, device="cpu")


def _task(model, rows: int, n_pos: int, seed: int = 0) -> Task:
    """Random ids; the corrupted rows differ in a middle span (as tests/test_discovery_*)."""
    g = torch.Generator().manual_seed(seed)
    vocab = int(model.cfg.d_vocab)
    clean = torch.randint(3, vocab, (rows, n_pos), generator=g)
    corrupted = clean.clone()
    corrupted[:, 2 : n_pos // 2] = torch.randint(3, vocab, (rows, n_pos // 2 - 2), generator=g)
    answers = torch.randint(3, vocab, (rows, 2), generator=g)
    answers[:, 1] = torch.where(
        answers[:, 1] == answers[:, 0], answers[:, 0] % 2 + 1, answers[:, 1]
    )
    return Task.from_records(
        [
            {"clean": c.tolist(), "corrupted": k.tolist(), "answer": int(a), "wrong": int(w)}
            for c, k, (a, w) in zip(clean, corrupted, answers, strict=True)
        ]
    )


def _counted(module, fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)``, counting ``module.forward`` calls (forward passes: the
    engine's patched runs, ``interp.engine.batched``, through which discovery removes edges)."""
    count = [0]
    original = module.forward

    def counting(*args, **kwargs):
        count[0] += 1
        return original(*args, **kwargs)

    module.forward = counting
    try:
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        return result, time.perf_counter() - start, count[0]
    finally:
        module.forward = original


def acdc_timings(
    threshold: float = 0.01, rows: int = 8, n_pos: int = 16, quick: bool = False
) -> list[dict]:
    """Print (and return) time, forward passes and edges per pass of exact edge patching,
    batched ACDC and sequential ACDC on each model (module docstring); ``quick``: two 2-layer
    zoo models only (gpt2, llama)."""
    models = {f"{arch} (zoo)": (arch, {}) for arch in (ARCHS[:2] if quick else ARCHS)}
    models |= {} if quick else FOUR_LAYERS
    print(f"{rows} rows x {n_pos} tokens, threshold {threshold}, threads {torch.get_num_threads()}")
    header = "model | edges | exact s / passes / edges per pass | acdc s / passes / edges per pass"
    print(header + " / calls / kept | sequential acdc s / passes")
    results = []
    for name, (arch, overrides) in models.items():
        model = _model(arch, overrides)
        task = _task(model, rows, n_pos)
        n_edges = len(EdgeGraph.from_model(model))
        _, exact_s, exact_passes = _counted(batched, edge_scores, model, task, "exact")
        frame, acdc_s, acdc_passes = _counted(
            batched, acdc_module.acdc, model, task, threshold=threshold
        )
        window = acdc_module.WINDOW
        acdc_module.WINDOW = 1
        try:
            plain, plain_s, plain_passes = _counted(
                batched, acdc_module.acdc, model, task, threshold=threshold
            )
        finally:
            acdc_module.WINDOW = window
        if not plain["in_circuit"].equals(frame["in_circuit"]):
            raise AssertionError(f"{name}: batched and sequential ACDC keep different edges")
        row = {
            "model": name,
            "edges": n_edges,
            "exact_s": exact_s,
            "exact_passes": exact_passes,
            "acdc_s": acdc_s,
            "acdc_passes": acdc_passes,
            "acdc_calls": frame.attrs["calls"],
            "acdc_runs": frame.attrs["runs"],
            "kept": int(frame["in_circuit"].sum()),
            "sequential_s": plain_s,
            "sequential_passes": plain_passes,
        }
        results.append(row)
        print(
            f"{name} | {n_edges} | {exact_s:.2f} / {exact_passes} / "
            f"{n_edges / exact_passes:.0f} | {acdc_s:.2f} / {acdc_passes} / "
            f"{row['acdc_runs'] / acdc_passes:.1f} / {row['acdc_calls']} / {row['kept']} | "
            f"{plain_s:.2f} / {plain_passes}"
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threshold", type=float, default=0.01)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    acdc_timings(args.threshold, args.rows, args.tokens)


if __name__ == "__main__":
    main()
