"""Attribution graphs on a random Gemma-2-2B-shaped model (benchmarks/make_gemma_bench.py: bf16
weights, a 16,384-wide per-layer ReLU transcoder on each of its 26 layers, ~1% of features
active) against issue 38's targets on one 80 GB GPU: 1,024 positions in <= 60 s and 8,192
positions capped at 8,192 features in <= 10 minutes::

    python benchmarks/bench_graph_gemma.py OUT [--bench DIR] [--scale 1] [--density 0.01]
        [--device cuda] [--cases 1024:8192:60,8192:8192:600] [--batch N] [--max-bytes 70GB]
        [--ranking auto|dense|sparse]

builds the bench into DIR (default OUT/bench; kept, and reused when its build_stats.json has
the same --scale and --density), then runs each case N_POS:MAX_FEATURE_NODES:TARGET_S[:LIMIT_S]
(MAX_FEATURE_NODES 0: every active feature; ~4.4M at 1,024 positions and 1% density, so the
default 1,024 case is capped at 8,192 like the GPT-2 table's) in its own process, killed after
LIMIT_S (default TARGET_S + 240: loading and the warm-up are not timed). A case loads the model
(bf16) and the transcoders, draws its tokens (BOS id 0, then ids from
torch.Generator().manual_seed(7)), runs one warm-up graph on 16 tokens, then times
``interp.attribution_graph`` between ``torch.cuda.synchronize()`` calls, with the peak
``torch.cuda.max_memory_allocated`` (reset before the timed call) and the peak host RSS. It
records wall seconds, the peak, features, nodes, the batch chosen,
``interp.estimate_graph_bytes`` for that batch (the active features counted) and whether the
target was met: one ``CASE {json}`` line per case, all of it in OUT/gemma_graph.json
(rewritten after each case). On a GPU machine with no network: benchmarks/gpu_gemma.sh and
docs/graphs.md, "GPU bench".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CASES = "1024:8192:60,8192:8192:600"
SEED = 7
WARM = 16
LOAD_S = 240  # a case's allowance for loading the model and the warm-up (not timed)

__all__ = ["run_case", "parse_cases"]


def parse_cases(spec: str) -> list[dict]:
    """``N_POS:MAX_FEATURE_NODES:TARGET_S[:LIMIT_S],...`` as dicts."""
    cases = []
    for item in filter(None, (c.strip() for c in spec.split(","))):
        parts = item.split(":")
        if len(parts) not in (3, 4) or not all(p.isdigit() for p in parts):
            raise ValueError(f"a case is N_POS:MAX_FEATURE_NODES:TARGET_S[:LIMIT_S], got {item!r}")
        n_pos, cap, target = (int(p) for p in parts[:3])
        limit = int(parts[3]) if len(parts) == 4 else target + LOAD_S
        cases.append({"n_pos": n_pos, "max_feature_nodes": cap or None, "target_s": target,
                      "limit_s": limit})  # fmt: skip
    return cases


class _PeakRSS:
    """The process's peak resident memory, sampled every 10 ms."""

    def __enter__(self):
        import psutil

        self.proc = psutil.Process()
        self.peak = self.proc.memory_info().rss
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self):
        while not self.stop:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.01)

    def __exit__(self, *exc):
        self.stop = True
        self.thread.join()


def run_case(bench: Path, n_pos: int, max_feature_nodes: int | None = None, *, device: str = "cuda",
             batch: int | None = None, max_bytes: str | None = None, warm: int = WARM,
             dtype: torch.dtype = torch.bfloat16, ranking: str = "auto"):  # fmt: skip
    """Time one graph on the bench, the model and transcoders loaded in ``dtype``; returns
    (figures, graph); ``graph.context`` holds the model and the transcoders."""
    import interp

    dev = torch.device(device)
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    start = time.perf_counter()
    model = interp.load_model(bench / "model", device=device, dtype=dtype)
    tc = interp.load_transcoders(bench / "transcoders", device=device, dtype=dtype)
    sync()
    load_s = time.perf_counter() - start
    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randint(1, int(model.cfg.d_vocab), (n_pos - 1,), generator=gen)
    tokens = torch.cat([torch.tensor([0]), ids])
    kw = {"max_feature_nodes": max_feature_nodes, "batch_size": batch, "max_bytes": max_bytes}
    kw |= {"ranking": ranking} if max_feature_nodes else {}
    start = time.perf_counter()
    interp.attribution_graph(model, tokens[: min(warm, n_pos)], tc, **kw)
    sync()
    warm_s = time.perf_counter() - start
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
    with _PeakRSS() as rss:
        sync()
        start = time.perf_counter()
        graph = interp.attribution_graph(model, tokens, tc, **kw)
        sync()
        wall_s = time.perf_counter() - start
    nodes = graph.nodes
    n_active = int(graph.info["active_features"])
    chosen = int(graph.info["batch_size"])
    mode = graph.info.get("ranking_mode")  # the ranking the build used (None: uncapped)
    estimate = interp.estimate_graph_bytes(
        model, tc, n_pos, max_feature_nodes, chosen, n_active=n_active,
        n_logits=len(graph.logit_token_ids), ranking=mode or "auto",
    )  # fmt: skip
    res = {
        "n_pos": n_pos, "max_feature_nodes": max_feature_nodes, "device": str(dev),
        "dtype": str(dtype).removeprefix("torch."),
        "wall_s": round(wall_s, 3), "load_s": round(load_s, 1), "warmup_s": round(warm_s, 2),
        "n_active": n_active, "n_features": int(graph.n_features), "n_nodes": len(nodes),
        "n_logits": len(graph.logit_token_ids), "batch_requested": batch, "batch_used": chosen,
        "max_bytes": max_bytes, "estimate_bytes": int(estimate),
        "estimate_bytes_graph": int(graph.info["estimated_bytes"]),
        "ranking_mode": mode, "ranking_entries": graph.info.get("ranking_entries"),
        "ranking_rounds": graph.info.get("ranking_rounds"),
        "ranking_certified": graph.info.get("ranking_certified"),
        "peak_rss_mb": round(rss.peak / 2**20), "interp": interp.__version__,
        "torch": torch.__version__,
    }  # fmt: skip
    if cuda:
        peak = torch.cuda.max_memory_allocated(dev)
        res |= {"gpu_peak_bytes": int(peak), "gpu_peak_above_start_bytes": int(peak - before),
                "gpu_before_bytes": int(before), "gpu_name": torch.cuda.get_device_name(dev),
                "estimate_over_peak": round(estimate / max(1, peak - before), 3)}  # fmt: skip
    return res, graph


def _run_one(argv: list[str]) -> int:  # the child process of one case
    ap = argparse.ArgumentParser()
    ap.add_argument("bench", type=Path)
    ap.add_argument("n_pos", type=int)
    ap.add_argument("cap", type=int)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--max-bytes", default=None)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--ranking", default="auto", choices=("auto", "dense", "sparse"))
    a = ap.parse_args(argv)
    res, _ = run_case(a.bench, a.n_pos, a.cap or None, device=a.device, batch=a.batch,
                      max_bytes=a.max_bytes, dtype=getattr(torch, a.dtype),
                      ranking=a.ranking)  # fmt: skip
    print(json.dumps(res), flush=True)
    return 0


def _child(cmd: list[str], limit: float, log: Path) -> tuple[str, list[dict], float]:
    start = time.perf_counter()
    path = os.pathsep.join(
        filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)])
    )  # INTERP_SRC first
    env = dict(os.environ, PYTHONPATH=path, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with open(log, "a") as f:
        f.write(f"==== {' '.join(cmd)}\n")
        f.flush()
        try:
            p = subprocess.run(
                cmd, stdout=subprocess.PIPE, stderr=f, text=True, timeout=limit, env=env
            )
            status, stdout = ("ok" if p.returncode == 0 else f"exit {p.returncode}"), p.stdout
        except subprocess.TimeoutExpired as e:
            status = f"timeout after {limit:.0f} s"
            stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        f.write(stdout)
    lines = [json.loads(ln) for ln in stdout.splitlines() if ln.startswith("{")]
    return status, lines, round(time.perf_counter() - start, 1)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--one"]:
        return _run_one(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--bench", type=Path, default=None, help="the bench folder (OUT/bench)")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--density", type=float, default=0.01, help="the bench's feature density")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cases", default=CASES)
    ap.add_argument("--batch", type=int, default=None, help="None: attribution_graph's choice")
    ap.add_argument("--max-bytes", default=None)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--ranking", default="auto", choices=("auto", "dense", "sparse"))
    ap.add_argument("--build-limit", type=float, default=540.0, help="seconds for the build")
    a = ap.parse_args(argv)
    cases = parse_cases(a.cases)
    a.out.mkdir(parents=True, exist_ok=True)
    bench, log, result = a.bench or a.out / "bench", a.out / "run.log", a.out / "gemma_graph.json"
    results = {
        "scale": a.scale,
        "density": a.density,
        "device": a.device,
        "cases_spec": a.cases,
        "cases": [],
    }
    stats = bench / "build_stats.json"
    built = json.loads(stats.read_text()) if stats.is_file() else {}
    if (built.get("scale"), built.get("density")) != (a.scale, a.density):
        cmd = [sys.executable, str(HERE / "make_gemma_bench.py"), str(bench)]
        cmd += ["--scale", str(a.scale), "--density", str(a.density)]
        status, _, secs = _child(cmd + ["--device", a.device], a.build_limit, log)
        results["build"] = {"status": status, "seconds": secs}
        if status != "ok":
            result.write_text(json.dumps(results, indent=1))
            print(f"build {status} (see {log})", flush=True)
            return 1
    results["bench"] = json.loads(stats.read_text())
    result.write_text(json.dumps(results, indent=1))
    for case in cases:
        cmd = [sys.executable, str(HERE / "bench_graph_gemma.py"), "--one", str(bench)]
        cmd += [str(case["n_pos"]), str(case["max_feature_nodes"] or 0), "--device", a.device]
        cmd += ["--batch", str(a.batch)] if a.batch else []
        cmd += ["--max-bytes", a.max_bytes] if a.max_bytes else []
        cmd += ["--dtype", a.dtype, "--ranking", a.ranking]
        status, lines, secs = _child(cmd, case["limit_s"], log)
        row = dict(case, status=status, process_s=secs, **(lines[-1] if lines else {}))
        row["target_met"] = bool(lines) and lines[-1]["wall_s"] <= case["target_s"]
        results["cases"].append(row)
        result.write_text(json.dumps(results, indent=1))
        print("CASE " + json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
