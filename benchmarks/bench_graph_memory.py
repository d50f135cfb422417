"""The peak memory of ``interp.attribution_graph`` against ``interp.estimate_graph_bytes``'s
estimate and against ``max_bytes``, over a grid: positions, capped and uncapped, per-layer and
cross-layer transcoders, float32 and bfloat16 models.

Each point runs in a fresh child process: it loads a small random GPT-2-shaped model
(tests/checkpoints.py) and random ReLU transcoders (~1% of features active), counts the prompt's
active features, and then measures the build's peak: on CPU the host's resident size (VmHWM,
reset just before the call through ``/proc/self/clear_refs``) less the resident size before
it; on CUDA ``torch.cuda.max_memory_allocated`` less the memory allocated before it. The
estimate is ``estimate_graph_bytes`` with the prompt's active features and the batch the build
chose. Budgeted points run with ``max_bytes`` halfway between the least estimate of a smaller
batch and the unbudgeted estimate, plus the planner's ``HEADROOM`` (``interp.graphs.budget``:
the estimate fills at most ``max_bytes`` less it), so the batch must shrink, and report the
peak against that ``max_bytes``. Every point frees blocks of ``FREED_AT`` bytes or more back
to the system at once (glibc's ``M_MMAP_THRESHOLD``, what interp sets under ``max_bytes``), so
the resident size is the use.

    python benchmarks/bench_graph_memory.py [--quick] [--device cuda] [--layers 2]
        [--d-model 128] [--heads 4] [--d-tc 512] [--positions 16,64] [--uncapped-up-to 64]
        [--cap 256]
        [--kinds per-layer,cross-layer] [--dtypes float32,bfloat16]
        [--backwards one-copy,batched] [--threads 1,2] [--budget no] [--json FILE]

Prints one line per point (estimate / measured, peak / budget) and a summary: the largest
deviation of the estimate and the largest peak over a budget. ``--backwards`` runs each point
once per row step (``attribution_graph(backward=...)``; default ``auto``), one after the other,
and prints their peaks and times side by side with the ratio batched / one-copy;
``--threads 1,2`` runs each point once per thread count (``torch.set_num_threads`` in the
child before anything runs; default: the child's own, ``torch.get_num_threads()``): MKL keeps
matmul buffers per thread, and the estimate counts them;
``--budget no`` skips the budgeted runs; ``--json FILE`` appends each point's figures to FILE
(one JSON line: the spec, the unbudgeted run, the budget, the budgeted run).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ACTIVE = 0.01

FULL = {  # the grid of docs/graphs.md, "Memory and scale"
    "positions": [16, 32, 64, 128, 256, 512, 1024, 2048],
    "uncapped_up_to": 128,  # an uncapped graph of more positions takes long on two CPU cores
    "cap": 256,
    "kinds": ["per-layer", "cross-layer"],
    "dtypes": ["float32", "bfloat16"],
}
QUICK = {
    "positions": [32, 256],
    "uncapped_up_to": 32,
    "cap": 64,
    "kinds": ["per-layer", "cross-layer"],
    "dtypes": ["float32", "bfloat16"],
}


def _child(spec: dict) -> dict:
    sys.path.insert(0, str(ROOT))
    from benchmarks.memory_child import Peak, free_at_once, random_transcoders
    from interp.graphs.budget import FREED_AT

    free_at_once(FREED_AT)  # what a build under max_bytes sets
    import torch

    if spec.get("threads"):  # before any matmul: MKL sizes its buffers per thread
        torch.set_num_threads(int(spec["threads"]))

    from interp import attribution_graph, estimate_graph_bytes, load_model
    from interp.engine import trim_freed_memory
    from interp.graphs.budget import least_bytes
    from tests.checkpoints import make_checkpoint

    torch.manual_seed(0)
    device, n_pos = spec["device"], spec["n_pos"]
    heads = spec.get("heads", 4)
    folder = Path(spec["dir"]) / f"model{spec['layers']}_{spec['d_model']}_{heads}"
    if not (folder / "config.json").exists():
        make_checkpoint(folder, arch="gpt2", n_layers=spec["layers"], n_heads=heads,
                        d_model=spec["d_model"], n_ctx=2048, vocab_size=1000)  # fmt: skip
    dtype = getattr(torch, spec["dtype"])
    model = load_model(folder, device=device, dtype=dtype)
    n, d, d_tc = spec["layers"], spec["d_model"], spec["d_tc"]
    gen = torch.Generator().manual_seed(0)  # the transcoders', then the prompt's
    tc = random_transcoders(n, d, d_tc, spec["kind"], "bench-memory", ACTIVE, gen).to(device)
    tokens = torch.cat(
        [torch.zeros(1, dtype=torch.long), torch.randint(1, 400, (n_pos - 1,), generator=gen)]
    )
    cap, budget = spec["cap"], spec.get("max_bytes")
    # warm up on the point's own path (capped: the ranking's code), so that what the build
    # first touches of the libraries' code (file pages, ~0.6 MiB for the ranking's) is not
    # counted as its memory
    attribution_graph(model, tokens[:8], tc, batch_size=8, max_feature_nodes=cap and 16,
                      backward=spec.get("backward", "auto"))  # fmt: skip

    # the build trims glibc's heap itself (run_cached, after its clean pass), handing back the
    # free holes the warm-up left resident: counted in the size before the call, they made the
    # peak less the size before miss what the build then refilled of them, by a layout's
    # chance (a 16-position graph peaked at 2.9-3.9 MiB in fresh processes; trimmed first,
    # 4.1-4.2 in five of six). Trimmed here, the size before is what is in use
    trim_freed_memory()
    peak = Peak(device)
    peak.start()
    backward = spec.get("backward", "auto")
    g = attribution_graph(model, tokens, tc, max_feature_nodes=cap, max_bytes=budget,
                          backward=backward)  # fmt: skip
    peak = peak.stop()
    n_active = g.info["active_features"]
    path = g.info["backward"]
    estimate = estimate_graph_bytes(model, tc, n_pos, cap, g.info["batch_size"],
                                    n_active=n_active, n_logits=len(g.logit_token_ids),
                                    backward=path)  # fmt: skip

    def at(batch: int) -> int:
        return estimate_graph_bytes(model, tc, n_pos, cap, batch, n_active=n_active,
                                    n_logits=len(g.logit_token_ids), backward=path)  # fmt: skip

    one = least_bytes(at, max(1, g.info["batch_size"] // 2))  # a smaller batch's least
    return {"peak": peak, "estimate": estimate, "one": one, "batch": g.info["batch_size"],
            "active": n_active, "seconds": g.info["seconds"], "backward": path,
            "threads": torch.get_num_threads()}  # fmt: skip


def _run(spec: dict) -> dict:
    sys.path.insert(0, str(ROOT))
    from benchmarks.memory_child import run_child

    return run_child(__file__, spec)


def main(argv: list[str]) -> None:
    opts = dict(zip(argv[::2], argv[1::2], strict=False)) if "--quick" not in argv else {}
    if "--quick" in argv:
        rest = [a for a in argv if a != "--quick"]
        opts = dict(zip(rest[::2], rest[1::2], strict=False))
    grid = dict(QUICK if "--quick" in argv else FULL)
    grid["backwards"] = opts.get("--backwards", "auto").split(",")
    threads = [int(t) for t in opts["--threads"].split(",")] if "--threads" in opts else [None]
    budgeted = opts.get("--budget", "yes") != "no"
    record = opts.get("--json")
    for key in ("positions", "kinds", "dtypes"):  # e.g. --positions 16,64 --kinds per-layer
        if f"--{key}" in opts:
            grid[key] = [int(v) if key == "positions" else v for v in opts[f"--{key}"].split(",")]
    for key in ("uncapped_up_to", "cap"):
        if f"--{key.replace('_', '-')}" in opts:
            grid[key] = int(opts[f"--{key.replace('_', '-')}"])
    base = {"device": opts.get("--device", "cpu"), "layers": int(opts.get("--layers", 2)),
            "d_model": int(opts.get("--d-model", 128)), "d_tc": int(opts.get("--d-tc", 512)),
            "heads": int(opts.get("--heads", 4)),
            "dir": opts.get("--dir") or tempfile.mkdtemp(prefix="graph-memory-")}  # fmt: skip
    sys.path.insert(0, str(ROOT))
    from interp.graphs.budget import HEADROOM

    ratios, over_budget = [], []  # estimate / measured, and budgeted peak / budget
    print("kind dtype positions cap backward threads | batch active | estimate measured ratio | "
          "seconds | budget peak/budget")  # fmt: skip
    points = [
        (kind, dtype, n_pos, cap, t)
        for t in threads
        for kind in grid["kinds"]
        for dtype in grid["dtypes"]
        for n_pos in grid["positions"]
        for cap in (None, grid["cap"])
        if cap is not None or n_pos <= grid["uncapped_up_to"]
    ]
    for kind, dtype, n_pos, cap, t in points:
        side = {}
        for backward in grid["backwards"]:
            spec = dict(base, kind=kind, dtype=dtype, n_pos=n_pos, cap=cap,
                        backward=backward, threads=t)  # fmt: skip
            r = side[backward] = _run(spec)
            ratio = r["estimate"] / r["peak"]
            ratios.append(ratio)
            # the planner fills max_bytes less HEADROOM: halfway between a smaller
            # batch's least estimate and this one's, plus HEADROOM, fits a smaller batch
            budget = (r["estimate"] + r["one"]) // 2 + HEADROOM
            b = None
            if budgeted and r["batch"] > 1:
                b = _run(dict(spec, max_bytes=budget))
            over = ""
            if b is not None:
                over = f"{budget / 2**20:.1f} MiB {b['peak'] / budget:.2f} "
                over += f"(batch {b['batch']}: estimate / measured "
                over += f"{b['estimate'] / b['peak']:.2f})"
                over_budget.append(b["peak"] / budget)
            if record:  # every figure of the point, one JSON line
                with open(record, "a") as f:
                    f.write(json.dumps({"spec": spec, "free": r, "budget": budget,
                                        "budgeted": b}) + "\n")  # fmt: skip
            print(f"{kind} {dtype} {n_pos} {cap} {r['backward']} {r['threads']} | "
                  f"{r['batch']} "
                  f"{r['active']} | {r['estimate'] / 2**20:.1f} MiB "
                  f"{r['peak'] / 2**20:.1f} MiB {ratio:.2f} | {r['seconds']:.1f} s | "
                  f"{over}", flush=True)  # fmt: skip
        if {"batched", "one-copy"} <= side.keys():
            old, new = side["batched"], side["one-copy"]
            print(
                f"  batched / one-copy: peak {old['peak'] / new['peak']:.1f}x, "
                f"time {old['seconds'] / new['seconds']:.2f}x",
                flush=True,
            )
    worst_estimate = max(abs(r - 1) for r in ratios)
    worst_budget = max(over_budget, default=1.0) - 1
    print(f"{len(ratios)} points: estimate / measured {min(ratios):.2f}-{max(ratios):.2f}, "
          f"{sum(abs(r - 1) > 0.15 for r in ratios)} outside +-15%; peak / budget "
          f"{min(over_budget, default=0):.2f}-{max(over_budget, default=0):.2f} over "
          f"{len(over_budget)} budgeted runs")  # fmt: skip
    print(f"largest estimate deviation {worst_estimate:.1%}; largest peak over budget "
          f"{worst_budget:+.1%}")  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print("RESULT " + json.dumps(_child(json.loads(sys.argv[2]))), flush=True)
    else:
        main(sys.argv[1:])
