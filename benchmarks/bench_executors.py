"""Executors: the same edge scores in 1 and 2 shards on a local Ray cluster, local processes
against the whole run in this process, and the overhead a shard adds.

On a GPT-2-width model of 4 layers (12 heads, d_model 768, a vocabulary of 1,000) and an
induction task of ``--rows`` rows, ``eap-ig`` with 5 steps:

- ``whole``: ``discover_circuit(model, task, "eap-ig", top_n=20)`` here;
- ``ray N``: the same with ``executor=Sharding("ray", shards=N)`` on a local Ray cluster of
  ``--cpus`` CPUs (started once; its workers load the model once each: the first run is cold);
- ``local N``: ``Sharding("local", shards=N)``: N fresh processes, each importing torch and
  loading the model;
- ``overhead``: a shard that does next to nothing (a sum, no torch), 16 of them on the warm
  Ray cluster and as local processes: what the executor itself costs a shard. A worker that
  runs a model pays its start once more (import torch, load the model): ``ray 1 (cold)`` less
  ``ray 1``.

    python benchmarks/bench_executors.py [--rows 16] [--cpus 2] [--repeat 2]
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

from interp import load_model  # noqa: E402
from interp.discovery import discover_circuit  # noqa: E402
from interp.foundation.executors import LocalExecutor, RayExecutor, Sharding, run_shards  # noqa: E402
from interp.tasks import induction  # noqa: E402
from tests.checkpoints import make_checkpoint  # noqa: E402


def seconds(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"  # the local processes inherit it
    folder = Path(tempfile.mkdtemp(prefix="interp-bench-"))
    make_checkpoint(folder, arch="gpt2", n_layers=4, n_heads=12, d_model=768, n_ctx=128,
                    vocab_size=1000)  # fmt: skip
    model = load_model(folder, device="cpu")
    task = induction(model, args.rows, seed=0, seq_len=8)
    import ray

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    env = {"PYTHONPATH": os.environ["PYTHONPATH"], "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": env})  # fmt: skip
    print(f"{args.rows} rows, eap-ig 5 steps, 4-layer GPT-2 width; Ray of {args.cpus} CPUs; "
          f"{os.cpu_count()} CPUs here, load average {os.getloadavg()[0]:.1f}")  # fmt: skip

    def run(executor=None):
        return discover_circuit(model, task, "eap-ig", top_n=20, executor=executor).scores

    base = None
    for name, executor in [
        ("whole", None),
        ("ray 1 (cold)", Sharding("ray", 1, progress=False)),
        ("ray 1", Sharding("ray", 1, progress=False)),
        ("ray 2", Sharding("ray", 2, progress=False)),
        ("local 1", Sharding("local", 1, progress=False)),
        ("local 2", Sharding("local", 2, progress=False)),
    ]:
        times = []
        for _ in range(1 if "cold" in name else args.repeat):
            took, scores = seconds(lambda executor=executor: run(executor))
            times.append(took)
        base = scores["score"].to_numpy() if base is None else base
        diff = float(np.abs(scores["score"].to_numpy() - base).max())
        print(f"{name:>13}: {min(times):6.2f} s (max |score - whole| {diff:.1e})")
    from tests.support_executors import SumJob  # no torch: a worker imports next to nothing

    job = SumJob((1.0,) * 16, tempfile.mkdtemp(prefix="interp-bench-log-"))
    for name, make in [("ray", RayExecutor), ("local", lambda: LocalExecutor(args.cpus))]:
        work = tempfile.mkdtemp(prefix="interp-bench-shards-")
        took, _ = seconds(lambda make=make, work=work: run_shards(
            job, 16, make(), work, key={}, progress=False))  # fmt: skip
        print(f"overhead per shard, {name}: {took / 16 * 1000:.0f} ms (16 empty shards)")
    ray.shutdown()


if __name__ == "__main__":
    main()
