"""Circuit discovery: EAP and EAP-IG in forward-pass units and against TransformerLens, exact
edge patching's time and passes, side by side in one run.

Targets (issue 20), on a GPT-2-small-shaped model (12 layers, 12 heads, d_model 768, a
vocabulary of 1,000) and a task of 16 rows of 26 tokens:
- ``eap``: ``edge_scores(..., "eap")`` <= 10 forward passes of the task's batch, and <= 0.1x
  TransformerLens 4.3's edge ``attribution_patch`` on the same rows, with equal scores (summed
  over positions; max |ours - TL| <= 1e-4 x max |TL|); EAP-IG with 5 steps <= 6x EAP's time;
  EAP under a ``max_bytes`` that splits the rows gives the same numbers;
- ``exact``: exact edge patching on the 2-layer zoo models and a 4-layer GPT-2: time, forward
  passes and edges per pass (every pass batched).

TransformerLens's metric sees one row's logits and not its index, so every row shares one
answer and one wrong token; rows differ in their tokens. ``--quick``: a 2-layer GPT-2 shape,
4 rows of 10 tokens, two zoo models (gpt2, llama) in the exact and ACDC sections (CI-sized).
``--device cuda`` where a GPU exists.

    python benchmarks/bench_discovery.py [--quick] [--device cpu|cuda] [--threads 1]
        [--rows 16] [--tokens 26] [--repeat 3] [--skip-tl] [--only eap exact acdc]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.common import time_side_by_side  # noqa: E402
from interp import load_model  # noqa: E402
from interp.discovery import EdgeGraph, edge_scores  # noqa: E402
from interp.tasks import Task  # noqa: E402


def _synced(fn, device: str):
    def run():
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return out

    return run


def _task(model, n_rows: int, n_tokens: int, *, seed: int = 1) -> Task:
    """``n_rows`` random pairs of ``n_tokens`` ids, the middle third corrupted; one answer and
    one wrong token for every row (TransformerLens's metric cannot tell rows apart)."""
    gen = torch.Generator().manual_seed(seed)
    vocab = min(int(model.cfg.d_vocab), 600)
    answer, wrong = (int(t) + 3 for t in torch.randperm(vocab - 3, generator=gen)[:2])
    records = []
    for _ in range(n_rows):
        clean = torch.randint(3, vocab, (n_tokens,), generator=gen)
        corrupted = clean.clone()
        lo, hi = n_tokens // 3, max(n_tokens // 3 + 1, 2 * n_tokens // 3)
        corrupted[lo:hi] = torch.randint(3, vocab, (hi - lo,), generator=gen)
        records.append(
            {"clean": clean.tolist(), "corrupted": corrupted.tolist(), "answer": answer}
            | {"wrong": wrong}
        )
    return Task.from_records(records)


def _gpt2(args, n_layers: int, n_heads: int, d_model: int):
    from tests.checkpoints import make_checkpoint

    directory = Path(tempfile.mkdtemp(prefix="interp-bench-"))
    make_checkpoint(
        directory,
        arch="gpt2",
        n_layers=n_layers,
        n_heads=n_heads,
        d_model=d_model,
        n_ctx=128,
        vocab_size=600,
        d_vocab=1000,
        randomize_ln=False,
    )
    return load_model(directory, device=args.device)


def _tl_name(node) -> str:
    if node.kind == "embed":
        return "embed"
    if node.kind in ("attn_head_out", "q_input", "k_input", "v_input"):
        tail = "" if node.kind == "attn_head_out" else "." + node.kind[0]
        return f"L{node.layer}H{node.head}{tail}"
    return "logits" if node.kind == "logits" else f"MLP{node.layer}"


def _transformer_lens(model, batch) -> tuple[dict[str, float], float]:
    """TL's edge attribution summed over positions, by our edge names, and its seconds."""
    from transformer_lens.tools.analysis.attribution_patching import (
        EdgeAttributionConfig,
        attribution_patch,
    )

    a, w = batch.answers[0][0], batch.wrong[0][0]
    start = time.perf_counter()
    result = attribution_patch(
        model,
        batch.clean.to(model.cfg.device),
        batch.corrupted.to(model.cfg.device),
        lambda logits: logits[0, -1, a] - logits[0, -1, w],
        EdgeAttributionConfig(granularity="edge"),
    )
    seconds = time.perf_counter() - start
    summed: dict[str, float] = {}
    for (u, v), value in result.edge_scores.items():
        name = f"{_tl_name(u)}->{_tl_name(v)}"
        summed[name] = summed.get(name, 0.0) + float(value)
    return summed, seconds


def eap(args) -> None:
    """EAP and EAP-IG in forward passes, against TL's edge attribution_patch."""
    shape = (2, 12, 768) if args.quick else (12, 12, 768)
    model = _gpt2(args, *shape)
    batch = _task(model, args.rows, args.tokens).tokens(model)
    graph = EdgeGraph.from_model(model)
    tokens = batch.corrupted.to(args.device)
    print(
        f"\n== eap: GPT-2 shape ({shape[0]} layers x {shape[1]} heads, d_model {shape[2]}, "
        f"d_vocab {model.cfg.d_vocab}), {len(graph)} edges; task {args.rows} rows x "
        f"{args.tokens} tokens; device {args.device}"
    )

    def forward():
        with torch.inference_mode():
            model(tokens)

    def ours():
        return edge_scores(model, batch, "eap")

    def ours_ig():
        return edge_scores(model, batch, "eap-ig", ig_steps=5)

    fns = {"forward pass": forward, "eap": ours, "eap-ig (5 steps)": ours_ig}
    times = time_side_by_side(
        {k: _synced(f, args.device) for k, f in fns.items()}, repeat=args.repeat
    )
    for name, seconds in times.items():
        print(f"{name:>24}: {seconds:8.3f} s")
    passes = times["eap"] / times["forward pass"]
    ig_ratio = times["eap-ig (5 steps)"] / times["eap"]
    print(f"eap = {passes:.2f} forward passes (target <= 10): {'OK' if passes <= 10 else 'MISSED'}")
    print(f"eap-ig(5) / eap = {ig_ratio:.2f} (target <= 6): {'OK' if ig_ratio <= 6 else 'MISSED'}")

    whole = ours()
    span = whole.attrs["clean_metric"] - whole.attrs["corrupted_metric"]
    split = edge_scores(model, batch, "eap", max_rows=max(1, args.rows // 4))
    gap = float(np.abs(split["score"] - whole["score"]).max())
    print(f"eap with {max(1, args.rows // 4)} rows per pass: max |split - whole| = {gap:.1e}")
    if args.skip_tl:
        print("TransformerLens: skipped (--skip-tl)")
        return
    theirs, tl_seconds = _transformer_lens(model, batch)
    tl = np.array([theirs[e] for e in whole["edge"]])
    mine = whole["score"].to_numpy() * span  # back to the metric's unit, as TL's
    diff = float(np.abs(tl - mine).max())
    rel = diff / float(np.abs(tl).max())
    same = set(theirs) == set(whole["edge"]) and rel <= 1e-4
    ratio = times["eap"] / tl_seconds
    print(f"{'TL attribution_patch':>24}: {tl_seconds:8.3f} s (one run)")
    print(
        f"scores vs TL: max |ours - TL| = {diff:.2e}, relative to max |TL| {rel:.2e} "
        f"(target <= 1e-4): {'OK' if same else 'MISSED'}"
    )
    print(f"eap / TL = {ratio:.4f} (target <= 0.1): {'OK' if ratio <= 0.1 else 'MISSED'}")


def _count_passes():
    """Wrap the engine's pass in patched runs (``engine.batched.forward``, through which
    discovery's removals run) to count them; returns (counter, undo)."""
    import interp.engine.batched as batched

    original = batched.forward
    counter = {"passes": 0, "rows": 0}

    def counting(model, tokens, *a, **k):
        counter["passes"] += 1
        counter["rows"] += int(tokens.shape[0])
        return original(model, tokens, *a, **k)

    batched.forward = counting
    return counter, lambda: setattr(batched, "forward", original)


def exact(args) -> None:
    """Exact edge patching: time, passes and edges per pass on small models."""
    from tests.zoo import Zoo

    zoo = Zoo(Path(tempfile.mkdtemp(prefix="interp-bench-zoo-")))
    names = ["gpt2", "llama"] if args.quick else ["gpt2", "gpt_neox", "gpt_neox_parallel"]
    names += [] if args.quick else ["llama", "qwen2", "mistral", "opt", "gptj", "phi", "gemma2"]
    rows, n_tokens = (4, 8) if args.quick else (8, 12)
    print(f"\n== exact edge patching: task {rows} rows x {n_tokens} tokens; device {args.device}")
    print(
        f"{'model (zoo: 2 layers)':>24} {'edges':>6} {'seconds':>8} {'fwd units':>9} "
        f"{'per edge':>8} {'passes':>6} {'edges/pass':>10}"
    )
    models = [(n, lambda n=n: load_model(zoo.directory(n), device=args.device)) for n in names]
    if not args.quick:  # 479 edges: most of the section's time, left out of --quick
        models.append(("gpt2, 4 layers, d 128", lambda: _gpt2(args, 4, 4, 128)))
    for label, build in models:
        model = build()
        try:
            graph = EdgeGraph.from_model(model)
        except ValueError as refused:
            print(f"{label:>24}: not scored ({str(refused).split(';')[0]})")
            continue
        batch = _task(model, rows, n_tokens).tokens(model)
        tokens = batch.corrupted.to(args.device)

        def forward(model=model, tokens=tokens):
            with torch.inference_mode():
                model(tokens)

        one = time_side_by_side({"f": _synced(forward, args.device)}, repeat=args.repeat)["f"]
        counter, undo = _count_passes()
        try:
            start = time.perf_counter()
            edge_scores(model, batch, "exact")
            if args.device == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
        finally:
            undo()
        n = counter["passes"]
        print(
            f"{label:>24} {len(graph):>6} {seconds:>8.2f} {seconds / one:>9.0f} "
            f"{seconds / one / len(graph):>8.2f} {n:>6} {len(graph) / n:>10.1f}"
        )
    print(
        "(passes: patched passes, beside the clean and corrupted runs; fwd units: seconds / "
        "one forward pass of the task's batch; per edge: fwd units / edges)"
    )


def acdc(args) -> None:
    """ACDC's timings against exact edge patching and sequential ACDC (benchmarks/bench_acdc.py)."""
    from benchmarks.bench_acdc import acdc_timings

    print("\n== acdc")
    acdc_timings(rows=min(args.rows, 8), quick=args.quick)


# The sections, in the order they run.
SECTIONS = {"eap": eap, "exact": exact, "acdc": acdc}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small models, CI-sized")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, help="task rows (default 16; quick 4)")
    parser.add_argument("--tokens", type=int, help="tokens per row (default 26; quick 10)")
    parser.add_argument("--repeat", type=int, help="timed runs (default 3; quick 1)")
    parser.add_argument("--skip-tl", action="store_true", help="leave out TransformerLens")
    parser.add_argument("--only", nargs="+", choices=list(SECTIONS), help="these sections")
    args = parser.parse_args()
    args.rows = args.rows or (4 if args.quick else 16)
    args.tokens = args.tokens or (10 if args.quick else 26)
    args.repeat = args.repeat or (1 if args.quick else 3)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no GPU is visible to torch here; use --device cpu")
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {args.device}")
    for name, section in SECTIONS.items():
        if args.only is None or name in args.only:
            section(args)


if __name__ == "__main__":
    main()
