"""Speed and memory of the factored circuit scores, beside the dense computations.

Run:  python benchmarks/bench_circuits.py [--threads 2] [--repeats 3]

1. GPT-2 small's shape with its real vocabulary (12 layers x 12 heads, d_model 768, d_head 64,
   d_vocab 50,257; random weights built as tensors, nothing downloaded): copying scores of all
   144 heads (target <= 2 s, < 1 GB extra memory) and Q/K/V-composition scores of all head
   pairs (target <= 10 s), with the peak resident memory each adds.
2. The factored paths against the dense ones (vocab x vocab eigenproblems; d_model x d_model
   products) on shapes where dense fits, timed side by side in this run, as ratios.

Timings on a shared machine are noisy: the best of ``--repeats`` runs (after a warm-up call)
is printed with the median. Peak memory is measured in a fresh interpreter per task (peak RSS
minus RSS before the call), so that memory freed earlier cannot hide new allocations. Figures
are printed, never asserted in tests.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from interp.circuits import (
    CircuitWeights,
    composition_scores,
    composition_scores_dense,
    copying_scores,
    copying_scores_dense,
)

COPYING_TARGET_S, COPYING_TARGET_BYTES, COMPOSITION_TARGET_S = 2.0, 1024**3, 10.0


def random_weights(
    *,
    n_layers: int,
    n_heads: int,
    d_model: int,
    d_head: int,
    d_vocab: int,
    seed: int = 0,
    tied: bool = True,
) -> CircuitWeights:
    """GPT-2-like random weights as LayerNorm-folded CircuitWeights (unembed tied to W_E)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int, std: float = 0.02) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).mul_(std)  # in place: no freed temporaries

    W_E = randn(d_vocab, d_model)
    W_U = W_E.T if tied else randn(d_model, d_vocab)  # GPT-2 ties them: a view, no copy
    ln_w = 1 + randn(d_model, std=0.3)
    unembed_in = torch.diag(ln_w)
    unembed_in = unembed_in - unembed_in.mean(dim=0, keepdim=True)  # P diag(w), as folded
    shape_in, shape_out = (n_layers, n_heads, d_model, d_head), (n_layers, n_heads, d_head, d_model)
    return CircuitWeights(
        W_E=W_E,
        W_Q=randn(*shape_in),
        W_K=randn(*shape_in),
        W_V=randn(*shape_in),
        W_O=randn(*shape_out),
        b_Q=randn(n_layers, n_heads, d_head),
        b_K=randn(n_layers, n_heads, d_head),
        b_V=randn(n_layers, n_heads, d_head),
        W_U=W_U,
        unembed_in=unembed_in,
        center_unembed=True,
        attn_scale=d_head**0.5,
        ln_folded=True,
    )


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) for this process; False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_extra_bytes(fn: Callable[[], object]) -> int | None:
    """Peak resident memory ``fn`` adds: peak RSS (VmHWM, reset first) minus RSS before.

    Call it in a process where nothing was freed yet (see ``_memory_child``): memory freed
    earlier stays mapped and would hide new allocations. None where /proc cannot reset it.
    """
    if not _reset_peak():
        return None
    before = _status_kb("VmRSS")
    fn()
    return (_status_kb("VmHWM") - before) * 1024


def measure(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(best seconds, median seconds) of ``repeats`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


GPT2_SMALL = dict(n_layers=12, n_heads=12, d_model=768, d_head=64)
MEMORY_TASKS = {
    "copying": lambda w: copying_scores(w),
    "composition": lambda w: composition_scores(w, "QKV"),
}


def _memory_child(task: str, vocab: int, threads: int) -> None:
    """Runs in a fresh interpreter: build the weights, then measure one task's peak."""
    torch.set_num_threads(threads)
    w = random_weights(**GPT2_SMALL, d_vocab=vocab)
    print(peak_extra_bytes(lambda: MEMORY_TASKS[task](w)))


def memory_in_fresh_process(task: str, vocab: int, threads: int) -> int | None:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--memory-child",
            task,
            "--vocab",
            str(vocab),
            "--threads",
            str(threads),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    value = out.stdout.strip().splitlines()[-1]
    return None if value == "None" else int(value)


def _mb(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 1e6:.0f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=50257, help="d_vocab of part 1")
    parser.add_argument("--memory-child", choices=sorted(MEMORY_TASKS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        _memory_child(args.memory_child, args.vocab, args.threads)
        return
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")

    print(f"1. GPT-2 small shape, d_vocab {args.vocab}, random weights")
    w = random_weights(**GPT2_SMALL, d_vocab=args.vocab)
    extra = memory_in_fresh_process("copying", args.vocab, args.threads)
    best, med = measure(lambda: copying_scores(w), args.repeats)
    ok = best <= COPYING_TARGET_S and (extra is None or extra < COPYING_TARGET_BYTES)
    print(
        f"   copying scores, 144 heads: best {best:.2f} s, median {med:.2f} s, peak extra "
        f"memory {_mb(extra)}  (target <= {COPYING_TARGET_S:.0f} s, < 1 GB: "
        f"{'met' if ok else 'NOT met'})"
    )
    for kind in "QKV":
        best, med = measure(lambda k=kind: composition_scores(w, k), args.repeats)
        print(f"   {kind}-composition alone, 9504 pairs: best {best:.2f} s, median {med:.2f} s")
    extra = memory_in_fresh_process("composition", args.vocab, args.threads)
    best, med = measure(lambda: composition_scores(w, "QKV"), args.repeats)
    print(
        f"   all three kinds in one call: best {best:.2f} s, median {med:.2f} s, peak extra "
        f"memory {_mb(extra)}  (target <= {COMPOSITION_TARGET_S:.0f} s: "
        f"{'met' if best <= COMPOSITION_TARGET_S else 'NOT met'})"
    )

    print("\n2. factored vs dense, side by side (dense: one timed call after a warm-up)")
    small = random_weights(n_layers=2, n_heads=12, d_model=768, d_head=64, d_vocab=512, seed=1)
    fast = measure(lambda: copying_scores(small), args.repeats)
    dense = measure(lambda: copying_scores_dense(small), 1)
    err = (copying_scores(small).copying_score - copying_scores_dense(small).copying_score).abs()
    print(
        f"   copying, 24 heads of GPT-2 small's width, d_vocab 512: factored {fast[0]:.3f} s, "
        f"dense (24 eigenproblems of 512x512, float64) {dense[0]:.2f} s: "
        f"{dense[0] / fast[0]:.0f}x; max |difference| {err.max():.1e}"
    )
    comp = random_weights(n_layers=6, n_heads=8, d_model=256, d_head=32, d_vocab=512, seed=2)
    fast = measure(lambda: composition_scores(comp, "QKV"), args.repeats)
    dense = measure(lambda: composition_scores_dense(comp, "QKV"), 1)
    err = (
        composition_scores(comp, "QKV").score - composition_scores_dense(comp, "QKV").score
    ).abs()
    print(
        f"   composition (Q, K, V), 6 layers x 8 heads, d_model 256: factored {fast[0]:.3f} s, "
        f"dense (d_model x d_model products, float64) {dense[0]:.2f} s: "
        f"{dense[0] / fast[0]:.0f}x; max |difference| {err.max():.1e}"
    )


if __name__ == "__main__":
    main()
