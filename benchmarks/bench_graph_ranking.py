"""The ranking under ``max_feature_nodes`` before and after a change, side by side in one run:
a capped graph built by the code of a git revision (``--before``, default ``main``) and by this
checkout, each in a fresh process on the same random GPT-2-shaped model, transcoders and tokens.

Each build runs on ``--threads`` threads (default 1) under cProfile, timed in CPU seconds of
the process (a shared machine's load inflates them far less than wall time; the wall time is
printed too); a line gives its CPU time, the ranking's share (the functions that
normalise rows and run the series: ``_next_round`` before 0.7.0, ``Ranking.add`` and
``Ranking.next_round`` after), the row table's copies (``_RowTable.add``), the assembly, the
peak resident size of the build (host VmHWM less the size before), and whether the two builds
gave the same graph bit for bit (node table, rows, row order); then each prunes its graph
(``g.prune()``, CPU seconds) and says whether the kept nodes and edges are the same.

    python benchmarks/bench_graph_ranking.py [--before main] [--positions 512,1024]
        [--cap 4096] [--batch 32] [--layers 2] [--d-model 256] [--heads 4] [--d-tc 2048]
        [--threads 1] [--device cpu] [--dir DIR]
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ACTIVE = 0.01  # share of features active per position (the memory benchmark's)
# (file suffix, function name) of what ranks features, before and after 0.7.0
RANKING = {("attribute.py", "_next_round"), ("ranking.py", "add"), ("ranking.py", "next_round")}
ROW_COPIES = {("attribute.py", "add")}  # _RowTable.add, less the Ranking.add it calls
ASSEMBLY = {("attribute.py", "_assemble")}


def _digest(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else p.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _child(spec: dict) -> dict:
    import cProfile
    import pstats

    import torch

    sys.path.append(str(ROOT))  # after PYTHONPATH: the revision's interp, not this checkout's
    # the revision's benchmarks too, so this builds its case itself (memory_child's
    # gpt2_graph_case is newer than the revisions it compares)
    from benchmarks.memory_child import Peak, free_at_once, random_transcoders

    free_at_once()
    torch.set_num_threads(spec["threads"])
    import interp
    from tests.checkpoints import make_checkpoint

    n, d, heads = spec["layers"], spec["d_model"], spec["heads"]
    folder = Path(spec["dir"]) / f"model{n}_{d}_{heads}"
    if not (folder / "config.json").exists():
        make_checkpoint(folder, arch="gpt2", n_layers=n, n_heads=heads, d_model=d,
                        n_ctx=2048, vocab_size=1000)  # fmt: skip
    model = interp.load_model(folder, device=spec["device"])
    gen = torch.Generator().manual_seed(0)
    tc = random_transcoders(n, d, spec["d_tc"], "per-layer", "bench-ranking", ACTIVE, gen)
    tc = tc.to(spec["device"])
    n_pos = spec["n_pos"]
    tokens = torch.cat([torch.zeros(1, dtype=torch.long),
                        torch.randint(1, 400, (n_pos - 1,), generator=gen)])  # fmt: skip
    interp.attribution_graph(model, tokens[:8], tc, batch_size=8)  # warm up
    peak, profile = Peak(spec["device"]), cProfile.Profile(time.process_time)
    peak.start()
    cpu = time.process_time()
    profile.enable()
    g = interp.attribution_graph(model, tokens, tc, max_feature_nodes=spec["cap"],
                                 batch_size=spec["batch"])  # fmt: skip
    profile.disable()
    cpu = time.process_time() - cpu
    peak = peak.stop()
    stats = pstats.Stats(profile).stats

    def seconds(names: set) -> float:
        return sum(
            v[3] for (file, _, name), v in stats.items()
            if any(file.endswith(f) and name == fn for f, fn in names)
        )  # fmt: skip

    cpu_prune = time.process_time()
    pruned = g.prune()
    cpu_prune = time.process_time() - cpu_prune
    nodes = g.nodes.to_csv(index=False).encode()
    return {"interp": str(Path(interp.__file__).parents[1]), "seconds": cpu,
            "wall": g.info["seconds"], "peak": peak,
            "ranking": seconds(RANKING),
            "row_copies": seconds(ROW_COPIES) - seconds({("ranking.py", "add")}),
            "assembly": seconds(ASSEMBLY), "active": g.info["active_features"],
            "ranked_on": g.info.get("ranking"),
            "graph": _digest(nodes, g.rows, g.row_nodes), "prune": cpu_prune,
            "pruned": _digest(pruned.kept_nodes, pruned.kept_edges)}  # fmt: skip


def _checkout(rev: str, into: Path) -> str:
    """The tracked files of ``rev`` under ``into``; its commit."""
    commit = subprocess.run(["git", "rev-parse", rev], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()  # fmt: skip
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True,
                             check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return commit


def _run(code: Path, spec: dict) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(code)}, check=False,
    )  # fmt: skip
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{code} failed on {spec}:\n{out.stderr[-3000:]}")


def main(argv: list[str]) -> None:
    opts = dict(zip(argv[::2], argv[1::2], strict=False))
    scratch = Path(tempfile.mkdtemp(prefix="bench-ranking-"))
    before = scratch / "before"
    before.mkdir()
    commit = _checkout(opts.get("--before", "main"), before)
    base = {"layers": int(opts.get("--layers", 2)), "d_model": int(opts.get("--d-model", 256)),
            "heads": int(opts.get("--heads", 4)), "d_tc": int(opts.get("--d-tc", 2048)),
            "cap": int(opts.get("--cap", 4096)), "batch": int(opts.get("--batch", 32)),
            "threads": int(opts.get("--threads", 1)),
            "device": opts.get("--device", "cpu"),
            "dir": opts.get("--dir") or str(scratch)}  # fmt: skip
    print(f"before: {commit[:10]}; after: this checkout; {json.dumps(base)}")
    print("positions active | code | CPU s: build ranking (share) row-copies assembly | wall s "
          "| peak MiB | ranked on | graph | prune CPU s, pruned graph")  # fmt: skip
    print(f"before's code: {before}; after's: {ROOT}")
    for n_pos in [int(p) for p in opts.get("--positions", "512,1024").split(",")]:
        spec = dict(base, n_pos=n_pos)
        side = {"before": _run(before, spec), "after": _run(ROOT, spec)}
        for name, code in (("before", before), ("after", ROOT)):
            if side[name]["interp"] != str(code):
                raise RuntimeError(f"{name} imported interp from {side[name]['interp']}")
        for name, r in side.items():
            print(f"{n_pos} {r['active']} | {name} | {r['seconds']:.2f} {r['ranking']:.2f} "
                  f"({r['ranking'] / r['seconds']:.0%}) {r['row_copies']:.2f} "
                  f"{r['assembly']:.2f} | {r['wall']:.1f} | {r['peak'] / 2**20:.0f} | "
                  f"{r['ranked_on']} | "
                  f"{r['graph']} | {r['prune']:.2f} {r['pruned']}")  # fmt: skip
        same = side["before"]["graph"] == side["after"]["graph"]
        same_pruned = side["before"]["pruned"] == side["after"]["pruned"]
        ratio = side["after"]["seconds"] / side["before"]["seconds"]
        share = side["after"]["ranking"] / side["before"]["ranking"]
        print(f"{n_pos}: CPU time after / before {ratio:.2f} (the ranking's {share:.2f}); "
              f"the same graph bit for bit: {same}, pruned alike: {same_pruned}")  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print("RESULT " + json.dumps(_child(json.loads(sys.argv[2]))))
    else:
        main(sys.argv[1:])
