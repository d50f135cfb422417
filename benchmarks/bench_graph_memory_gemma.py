"""The one-copy backward's memory estimate on Gemma 2 beside GPT-2, measured side by side.

``interp.estimate_graph_bytes``'s one-copy terms were fitted on GPT-2-shaped models
(benchmarks/bench_graph_memory.py); Gemma 2's blocks add two post-norms, whose transposes are
two more ``[batch pos d_model]`` steps per layer in the backward. Each point runs in a fresh
child process (benchmarks/memory_child.py: freed memory returned at once, the peak of the call
less the resident size before it, random ReLU transcoders with ~1% of features active): a
random Gemma 2 checkpoint (tests/zoo.py's, widened: ``--layers``, ``--d-model``, 4 query heads
sharing 2 key/value heads, soft-capping and sliding windows kept) and a GPT-2 checkpoint of the
same layers, width and heads, the same transcoders and tokens, ``backward="one-copy"``::

    python benchmarks/bench_graph_memory_gemma.py [--layers 2] [--d-model 128] [--d-tc 512]
        [--positions 128,256] [--cap 64|none] [--kinds per-layer,cross-layer]
        [--dtype float32]

Prints, per point, each model's estimate, measured peak and their ratio.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ACTIVE = 0.01


def _checkpoint(spec: dict) -> Path:
    from tests.checkpoints import make_checkpoint
    from tests.zoo import make_zoo_checkpoint

    arch, n, d = spec["arch"], spec["layers"], spec["d_model"]
    folder = Path(spec["dir"]) / f"{arch}_{n}_{d}"
    if (folder / "config.json").exists():
        return folder
    if arch == "gpt2":
        make_checkpoint(folder, n_layers=n, n_heads=4, d_model=d, n_ctx=2048, vocab_size=1000)
    else:  # 4 query heads of d_model / 4 sharing 2 key/value heads, as the zoo's Gemma 2
        make_zoo_checkpoint(folder, "gemma2", vocab_size=1000, hidden_size=d,
                            num_hidden_layers=n, head_dim=d // 4, query_pre_attn_scalar=d // 4,
                            intermediate_size=2 * d, max_position_embeddings=2048,
                            sliding_window=64)  # fmt: skip
    return folder


def _child(spec: dict) -> dict:
    sys.path.insert(0, str(ROOT))
    from benchmarks.memory_child import Peak, free_at_once, random_transcoders

    free_at_once()
    import torch

    from interp import attribution_graph, estimate_graph_bytes, load_model

    model = load_model(_checkpoint(spec), device="cpu", dtype=getattr(torch, spec["dtype"]))
    n, d, n_pos, cap = spec["layers"], spec["d_model"], spec["n_pos"], spec["cap"]
    gen = torch.Generator().manual_seed(0)  # the transcoders', then the prompt's
    tc = random_transcoders(n, d, spec["d_tc"], spec["kind"], "bench-gemma", ACTIVE, gen)
    ids = torch.randint(1, 400, (n_pos - 1,), generator=gen)
    tokens = torch.cat([torch.zeros(1, dtype=torch.long), ids])
    attribution_graph(model, tokens[:8], tc, batch_size=8, backward="one-copy")  # warm up
    peak = Peak("cpu")
    peak.start()
    g = attribution_graph(model, tokens, tc, max_feature_nodes=cap, backward="one-copy")
    peak = peak.stop()
    estimate = estimate_graph_bytes(
        model, tc, n_pos, cap, g.info["batch_size"], n_active=g.info["active_features"],
        n_logits=len(g.logit_token_ids), backward="one-copy",
    )  # fmt: skip
    return {"peak": peak, "estimate": estimate, "batch": g.info["batch_size"],
            "active": g.info["active_features"], "backward": g.info["backward"]}  # fmt: skip


def main(argv: list[str]) -> None:
    from benchmarks.memory_child import run_child

    opts = dict(zip(argv[::2], argv[1::2], strict=False))
    base = {"layers": int(opts.get("--layers", 2)), "d_model": int(opts.get("--d-model", 128)),
            "d_tc": int(opts.get("--d-tc", 512)), "dtype": opts.get("--dtype", "float32"),
            "dir": opts.get("--dir") or tempfile.mkdtemp(prefix="graph-memory-gemma-")}  # fmt: skip
    positions = [int(p) for p in opts.get("--positions", "128,256").split(",")]
    cap = opts.get("--cap", "64")
    cap = None if cap == "none" else int(cap)  # none: every active feature kept
    print("kind positions cap | arch batch active | estimate measured estimate/measured")
    for kind in opts.get("--kinds", "per-layer,cross-layer").split(","):
        for n_pos in positions:
            for arch in ("gemma2", "gpt2"):
                spec = dict(base, arch=arch, kind=kind, n_pos=n_pos, cap=cap)
                r = run_child(__file__, spec)
                assert r["backward"] == "one-copy", r
                print(f"{kind} {n_pos} {cap} | {arch} {r['batch']} {r['active']} | "
                      f"{r['estimate'] / 2**20:.1f} MiB {r['peak'] / 2**20:.1f} MiB "
                      f"{r['estimate'] / r['peak']:.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print("RESULT " + json.dumps(_child(json.loads(sys.argv[2]))), flush=True)
    else:
        sys.path.insert(0, str(ROOT))
        main(sys.argv[1:])
