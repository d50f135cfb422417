"""Many prompts in one call against one call per prompt: ``attribution_graph(model, prompts,
tc)`` reads the value-path weights and converts the transcoders once for the list.

    python benchmarks/bench_graph_many.py [--prompts 4] [--positions 12] [--repeat 3]

On a random GPT-2-small-shaped model (12 layers, d_model 768, a 2,000-token vocabulary) with
sparse random 512-wide transcoders (about 2 features of a layer active a position, so that the
fixed cost of a graph shows), timed side by side (interleaved, medians; benchmarks/common.py).
The first graph of both ways is checked equal before timing (tests/graphs/test_graph_many.py
checks every graph).
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import gpt2_small_shaped, time_side_by_side
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
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    model = gpt2_small_shaped(d_vocab=2000, n_ctx=256)
    tc = sparse_transcoders(model)
    gen = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(1, 2000, (args.positions,), generator=gen) for _ in range(args.prompts)
    ]
    together = attribution_graph(model, prompts, tc)  # also the warm-up
    assert torch.equal(together[0].adjacency, attribution_graph(model, prompts[0], tc).adjacency)
    features = [int(g.info["active_features"]) for g in together]
    times = time_side_by_side(
        {
            "one call per prompt": lambda: [attribution_graph(model, p, tc) for p in prompts],
            "one call for the list": lambda: attribution_graph(model, prompts, tc),
        },
        repeat=args.repeat,
        warm_up=False,
    )
    print(f"{args.prompts} prompts of {args.positions} positions, active features {features}")
    for name, seconds in times.items():
        print(f"{name:24} {seconds:7.2f} s")
    ratio = times["one call for the list"] / times["one call per prompt"]
    print(f"list / per prompt: {ratio:.2f}x")


if __name__ == "__main__":
    main()
