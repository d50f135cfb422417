"""Head loadings and QK attribution beside the graph they decompose, in one run on one machine:
the bundled ``tiny-induction`` model and transcoders on the induction prompt of docs/graphs.md
(or a longer random prompt with ``--positions N``).

    python benchmarks/bench_attention.py [--positions N] [--device cuda]

Prints the seconds of ``attribution_graph``, of ``head_loadings`` over every kept edge of the
pruned graph, and of one ``qk_attribution`` (a frozen pass and 2 x d_head backward rows), each
with its ratio to the graph's.
"""

from __future__ import annotations

import argparse
import time

import torch

INDUCTION = [0, 812, 1403, 377, 1952, 640, 1187, 95, 1530, 812, 1403, 377, 1952]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    import interp

    model = interp.load_model("tiny-induction", device=args.device)
    tc = interp.load_transcoders("tiny-induction-transcoders", device=args.device)
    if args.positions is None:
        tokens = torch.tensor(INDUCTION)
    else:
        gen = torch.Generator().manual_seed(0)
        half = torch.randint(1, model.cfg.d_vocab, (args.positions // 2,), generator=gen)
        tokens = torch.cat([torch.tensor([0]), half, half])[: args.positions]
    start = time.perf_counter()
    graph = interp.attribution_graph(model, tokens, tc)
    built = time.perf_counter() - start
    pruned = graph.prune()
    start = time.perf_counter()
    table = pruned.head_loadings()
    loads = time.perf_counter() - start
    q = len(tokens) - 1
    k = (
        int(torch.nonzero(tokens[:q] == tokens[q]).flatten()[0]) + 1
        if (tokens[:q] == tokens[q]).any()
        else q
    )
    start = time.perf_counter()
    qk = graph.qk_attribution(1, 3, q, k)
    one = time.perf_counter() - start
    edges = table.groupby(["target", "source"]).ngroups
    print(f"{len(tokens)} positions, {len(graph.nodes)} nodes, {edges} kept edges, {args.device}")
    print(f"attribution_graph     {built:8.2f} s  1.00x")
    print(f"head_loadings (edges) {loads:8.2f} s  {loads / built:.2f}x")
    print(f"qk_attribution (one)  {one:8.2f} s  {one / built:.2f}x  ({len(qk)} pairs)")


if __name__ == "__main__":
    main()
