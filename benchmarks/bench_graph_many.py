"""Many prompts in one call against one call per prompt: ``attribution_graph(model, prompts,
tc)`` reads the value-path weights and converts the transcoders once for the list.

    python benchmarks/bench_graph_many.py [--prompts 3] [--positions 12] [--repeat 3] [--threads 1]

On a random GPT-2-small-shaped model (12 layers, d_model 768, a 2,000-token vocabulary) with
sparse random 512-wide transcoders (about 2 features of a layer active a position, so that the
fixed cost of a graph shows), timed side by side (interleaved, medians), in wall-clock and in
this process's CPU time (steadier on a shared machine).
The first graph of both ways is checked equal before timing (tests/graphs/test_graph_many.py
checks every graph).
"""

from __future__ import annotations

import argparse
import time
from statistics import median

import torch

from benchmarks.common import gpt2_small_shaped
from interp.graphs.attribute import attribution_graph
from interp.transcoders.transcoder import TranscoderSet


def sparse_transcoders(model, d_tc: int = 512, seed: int = 0) -> TranscoderSet:
    n, d = model.cfg.n_layers, model.cfg.d_model
    gen = torch.Generator().manual_seed(seed)
    return TranscoderSet(
        [torch.randn(d_tc, d, generator=gen) / d**0.5 for _ in range(n)],
        [torch.full((d_tc,), -2.5) for _ in range(n)],  # ~1% of features fire
        [torch.randn(d_tc, d, generator=gen) / d_tc**0.5 for _ in range(n)],
        [torch.zeros(d) for _ in range(n)],
        name="sparse-random",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--positions", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadiest)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = gpt2_small_shaped(d_vocab=2000, n_ctx=256)
    tc = sparse_transcoders(model)
    gen = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(1, 2000, (args.positions,), generator=gen) for _ in range(args.prompts)
    ]
    together = attribution_graph(model, prompts, tc)  # also the warm-up
    assert torch.equal(together[0].adjacency, attribution_graph(model, prompts[0], tc).adjacency)
    features = [int(g.info["active_features"]) for g in together]
    ways = {
        "one call per prompt": lambda: [attribution_graph(model, p, tc) for p in prompts],
        "one call for the list": lambda: attribution_graph(model, prompts, tc),
    }
    wall: dict[str, list[float]] = {name: [] for name in ways}
    cpu: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.repeat):  # interleaved: drift in the machine's load hits both
        for name, way in ways.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            way()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    print(
        f"{args.prompts} prompts of {args.positions} positions, active features {features}, "
        f"{torch.get_num_threads()} thread(s); medians of {args.repeat}"
    )
    for name in ways:
        print(f"{name:24} {median(wall[name]):7.2f} s wall {median(cpu[name]):7.2f} s CPU")
    one, many = (median(cpu[name]) for name in ways)
    print(f"list / per prompt, CPU time: {many / one:.2f}x")


if __name__ == "__main__":
    main()
