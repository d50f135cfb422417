"""The peak memory of head loadings and QK attribution against their estimate
(``interp.graphs.attention_budget``) and against ``max_bytes``, over a grid: positions,
per-layer and cross-layer transcoders, float32 and bfloat16 models, a GPT-2-shaped model and a
grouped-query Llama (tests/zoo.py).

Each point runs in a fresh child process: it builds a small random model and random ReLU
transcoders (~1% of features active), the prompt's graph (capped at ``--cap`` features) and,
for head loadings, its pruned graph; then it measures one decomposition's peak: on CPU the
host's resident size (VmHWM, reset just before the call through ``/proc/self/clear_refs``)
less the resident size before it; on CUDA ``torch.cuda.max_memory_allocated`` less the memory
allocated before it. Head loadings split every kept edge of the pruned graph; QK attribution
attributes the last layer's head 0 at (last position, middle position) of the unpruned graph.
Budgeted points run with ``max_bytes`` halfway between the least estimate of a smaller batch
and the unbudgeted estimate (so the batch must shrink) and report the peak against it. Every
point frees memory back to the system at once (glibc's ``M_MMAP_THRESHOLD``, what interp does
under ``max_bytes``), so the resident size is the use.

    python benchmarks/bench_attention_memory.py [--quick] [--decompositions heads,qk]
        [--archs gpt2,llama] [--positions 16,64,256] [--kinds per-layer,cross-layer]
        [--dtypes float32,bfloat16] [--cap 256] [--device cuda]

Prints one line per point (estimate / measured, peak / budget) and a summary: the largest
deviation of the estimate and the largest peak over a budget.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ACTIVE = 0.01
D_MODEL, D_TC, N_LAYERS = 128, 512, 2

FULL = {
    "decompositions": ["heads", "qk"],
    "archs": ["gpt2", "llama"],
    "positions": [16, 64, 256],
    "kinds": ["per-layer", "cross-layer"],
    "dtypes": ["float32", "bfloat16"],
    "cap": 256,
}
QUICK = dict(FULL, archs=["gpt2"], positions=[64], kinds=["per-layer"], dtypes=["float32"])


def _model(spec: dict):
    import torch

    from interp import load_model
    from tests.checkpoints import make_checkpoint
    from tests.zoo import make_zoo_checkpoint

    folder = Path(spec["dir"]) / spec["arch"]
    if not (folder / "config.json").exists():
        if spec["arch"] == "gpt2":
            make_checkpoint(folder, arch="gpt2", n_layers=N_LAYERS, n_heads=4, d_model=D_MODEL,
                            n_ctx=1024, vocab_size=1000)  # fmt: skip
        else:  # 4 query heads on 2 key/value heads, rotary, RMSNorm
            wide = {"hidden_size": D_MODEL, "intermediate_size": 4 * D_MODEL}
            make_zoo_checkpoint(folder, spec["arch"], max_position_embeddings=1024, **wide)
    return load_model(folder, device=spec["device"], dtype=getattr(torch, spec["dtype"]))


def _transcoders(model, kind: str):
    from benchmarks.memory_child import random_transcoders

    d = int(model.cfg.d_model)
    return random_transcoders(N_LAYERS, d, D_TC, kind, "bench-attention-memory", ACTIVE)


def _child(spec: dict) -> dict:
    import gc

    sys.path.insert(0, str(ROOT))
    from benchmarks.memory_child import Peak, free_at_once

    free_at_once()
    import torch

    from interp import attribution_graph
    from interp.engine.plan import MemoryBudgetError
    from interp.graphs.heads import head_loadings
    from interp.graphs.qk import qk_attribution

    torch.manual_seed(0)
    device, n_pos = spec["device"], spec["n_pos"]
    model = _model(spec)
    tc = _transcoders(model, spec["kind"]).to(device)
    gen = torch.Generator().manual_seed(0)
    vocab = min(int(model.cfg.d_vocab), 300)
    tokens = torch.cat(
        [torch.zeros(1, dtype=torch.long), torch.randint(1, vocab, (n_pos - 1,), generator=gen)]
    )
    heads = spec["decomposition"] == "heads"
    layer = N_LAYERS - 1

    def decompose(g, **kw):
        if heads:
            return head_loadings(model, tc, g, **kw)
        return qk_attribution(model, tc, g, layer, 0, len(g.tokens) - 1, len(g.tokens) // 2, **kw)

    warm = attribution_graph(model, tokens[:8], tc, batch_size=8)  # warm up
    decompose(warm.prune() if heads else warm)
    g = attribution_graph(model, tokens, tc, max_feature_nodes=spec["cap"])
    tc = g.context["tc"]  # in the graph's dtype
    # head loadings: every kept edge of the pruned graph, or with "unpruned", every edge
    target = g.prune() if heads and not spec.get("unpruned") else g
    del warm, g
    gc.collect()

    peak = Peak(device)
    peak.start()
    try:
        extra = {"batch_size": spec["batch_size"]} if spec.get("batch_size") else {}
        table = decompose(target, max_bytes=spec.get("max_bytes"), **extra)
    except MemoryBudgetError as err:  # refused up front: what it needs
        return {"refused": str(err)}
    peak = peak.stop()
    out = {"peak": peak, "rows": len(table), "nodes": len(target.nodes)}
    for key in ("batch_size", "estimated_bytes", "least_bytes"):
        if key in table.attrs:
            out[key] = table.attrs[key]
    return out


def _run(spec: dict) -> dict:
    sys.path.insert(0, str(ROOT))
    from benchmarks.memory_child import run_child

    return run_child(__file__, spec)


def _options(argv: list[str]) -> tuple[dict, dict]:
    quick = "--quick" in argv
    rest = [a for a in argv if a != "--quick"]
    opts = dict(zip(rest[::2], rest[1::2], strict=False))
    grid = dict(QUICK if quick else FULL)
    for key in ("decompositions", "archs", "positions", "kinds", "dtypes"):
        if f"--{key}" in opts:
            grid[key] = [int(v) if key == "positions" else v for v in opts[f"--{key}"].split(",")]
    if "--cap" in opts:
        grid["cap"] = int(opts["--cap"])
    base = {"device": opts.get("--device", "cpu"), "cap": grid["cap"],
            "dir": opts.get("--dir") or tempfile.mkdtemp(prefix="attention-memory-")}  # fmt: skip
    return grid, base


def main(argv: list[str]) -> None:
    grid, base = _options(argv)
    worst_estimate, worst_budget = 0.0, 0.0
    print("decomposition arch kind dtype positions | batch | estimate measured ratio | "
          "budget peak/budget (batch)")  # fmt: skip
    for what in grid["decompositions"]:
        for arch in grid["archs"]:
            for kind in grid["kinds"]:
                for dtype in grid["dtypes"]:
                    for n_pos in grid["positions"]:
                        spec = dict(base, decomposition=what, arch=arch, kind=kind,
                                    dtype=dtype, n_pos=n_pos)  # fmt: skip
                        r = _run(spec)
                        ratio = r["estimated_bytes"] / r["peak"]
                        worst_estimate = max(worst_estimate, abs(ratio - 1))
                        over = ""
                        if r["batch_size"] > 1:
                            budget = (r["estimated_bytes"] + r["least_bytes"]) // 2
                            b = _run(dict(spec, max_bytes=budget))
                            worst_budget = max(worst_budget, b["peak"] / budget - 1)
                            over = (f"{budget / 2**20:.1f} MiB {b['peak'] / budget:.2f} "
                                    f"(batch {r['batch_size']} -> {b['batch_size']})")  # fmt: skip
                        print(f"{what} {arch} {kind} {dtype} {n_pos} | {r['batch_size']} | "
                              f"{r['estimated_bytes'] / 2**20:.1f} MiB {r['peak'] / 2**20:.1f} "
                              f"MiB {ratio:.2f} | {over}", flush=True)  # fmt: skip
    print(f"largest estimate deviation {worst_estimate:.1%}; largest peak over budget "
          f"{worst_budget:+.1%}")  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print("RESULT " + json.dumps(_child(json.loads(sys.argv[2]))), flush=True)
    else:
        main(sys.argv[1:])
