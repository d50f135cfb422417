"""The sparse ranking against the dense one, side by side in one run: a capped graph built with
``ranking="dense"`` and with ``ranking="sparse"`` (``--entries`` kept a row; the library's
default is 2^16, more than a small model's columns, where nothing is dropped), each in a fresh
process on the same random GPT-2-shaped model, transcoders (1% of features active) and tokens.

A line per build: CPU seconds of the process (wall seconds too), the peak resident size the
build adds (host VmHWM less the size before; CUDA: max_memory_allocated), the plan's estimate,
and the sparse ranking's certified rounds; then the ratios sparse / dense, how many kept
features differ, and how far apart the rows at the nodes both graphs have are.

    python benchmarks/bench_graph_sparse.py [--positions 512,1024] [--cap 1024] [--batch 32]
        [--entries 4096] [--layers 2] [--d-model 256] [--heads 4] [--d-tc 2048]
        [--threads 1] [--device cpu] [--dir DIR]
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ACTIVE = 0.01  # share of features active per position (the memory benchmark's)


def _child(spec: dict) -> dict:
    import torch

    sys.path.insert(0, str(ROOT))
    from benchmarks.memory_child import Peak, free_at_once, gpt2_graph_case

    free_at_once()
    torch.set_num_threads(spec["threads"])
    import interp
    from interp.graphs import sparse_ranking

    sparse_ranking.ENTRIES = spec["entries"]
    model, tc, tokens = gpt2_graph_case(spec, "bench-sparse", ACTIVE)
    n_pos = spec["n_pos"]
    options = dict(max_feature_nodes=spec["cap"], batch_size=spec["batch"],
                   ranking=spec["ranking"])  # fmt: skip
    interp.attribution_graph(model, tokens[:16], tc, **{**options, "max_feature_nodes": 8})
    peak = Peak(spec["device"])
    peak.start()
    cpu = time.process_time()
    g = interp.attribution_graph(model, tokens, tc, **options)
    cpu = time.process_time() - cpu
    peak = peak.stop()
    features = g.nodes[g.nodes.kind == "feature"][["layer", "pos", "feature"]]
    kept = [tuple(map(int, row)) for row in features.itertuples(index=False)]
    path = Path(spec["dir"]) / f"{spec['ranking']}-{n_pos}.pt"
    torch.save({"kept": kept, "rows": g.rows, "row_nodes": g.row_nodes}, path)
    return {"seconds": cpu, "wall": g.info["seconds"], "peak": peak,
            "estimate": g.info["estimated_bytes"], "active": g.info["active_features"],
            "mode": g.info["ranking_mode"], "rounds": g.info.get("ranking_rounds"),
            "certified": g.info.get("ranking_certified"), "saved": str(path),
            "digest": hashlib.sha256(repr(kept).encode()).hexdigest()[:12]}  # fmt: skip


def _compare(dense: dict, sparse: dict) -> tuple[int, float]:
    """How many kept features differ, and the largest difference between the two graphs' rows
    at the nodes both have (logits, features both keep; at the columns both have), relative to
    the largest entry (the logits' rows come from the same batches: 0 expected; a feature's
    batch may hold other features in the two builds, so rounding may differ)."""
    import torch

    a, b = torch.load(dense["saved"]), torch.load(sparse["saved"])
    shared = sorted(set(a["kept"]) & set(b["kept"]))
    for x in (a, b):
        n_feat, index = len(x["kept"]), {f: i for i, f in enumerate(x["kept"])}
        x["cols"] = torch.tensor(
            [index[f] for f in shared] + list(range(n_feat, x["rows"].shape[1]))
        )
        by_node = {int(node): i for i, node in enumerate(x["row_nodes"])}
        logits = [i for i, node in enumerate(x["row_nodes"].tolist()) if node >= n_feat]
        x["pick"] = torch.tensor(logits + [by_node[index[f]] for f in shared])
    left = a["rows"][a["pick"]][:, a["cols"]]
    right = b["rows"][b["pick"]][:, b["cols"]]
    worst = float((left - right).abs().max() / left.abs().max())
    return len(set(a["kept"]) - set(b["kept"])), worst


def main(argv: list[str]) -> None:
    from benchmarks.memory_child import run_child

    opts = dict(zip(argv[::2], argv[1::2], strict=False))
    base = {"layers": int(opts.get("--layers", 2)), "d_model": int(opts.get("--d-model", 256)),
            "heads": int(opts.get("--heads", 4)), "d_tc": int(opts.get("--d-tc", 2048)),
            "cap": int(opts.get("--cap", 1024)), "batch": int(opts.get("--batch", 32)),
            "entries": int(opts.get("--entries", 4096)),
            "threads": int(opts.get("--threads", 1)), "device": opts.get("--device", "cpu"),
            "dir": opts.get("--dir") or tempfile.mkdtemp(prefix="bench-sparse-")}  # fmt: skip
    print(json.dumps(base))
    print("positions active | ranking | CPU s | wall s | peak MiB | estimate MiB | certified")
    for n_pos in [int(p) for p in opts.get("--positions", "512,1024").split(",")]:
        side = {
            m: run_child(__file__, dict(base, n_pos=n_pos, ranking=m)) for m in ("dense", "sparse")
        }
        for r in side.values():
            print(f"{n_pos} {r['active']} | {r['mode']} | {r['seconds']:.2f} | {r['wall']:.1f} | "
                  f"{r['peak'] / 2**20:.0f} | {r['estimate'] / 2**20:.0f} | "
                  f"{r['certified']}/{r['rounds']}")  # fmt: skip
        differ, worst = _compare(side["dense"], side["sparse"])
        d, s = side["dense"], side["sparse"]
        print(f"{n_pos}: sparse / dense CPU time {s['seconds'] / d['seconds']:.2f}, peak "
              f"{s['peak'] / d['peak']:.2f}; kept features differing: {differ} of {base['cap']}; "
              f"rows at the shared nodes differ by at most {worst:.1e} of the largest")  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print("RESULT " + json.dumps(_child(json.loads(sys.argv[2]))))
    else:
        sys.path.insert(0, str(ROOT))
        main(sys.argv[1:])
