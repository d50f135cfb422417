"""Head loadings and QK attribution beside the graph they decompose, in one run on one machine:
the bundled ``tiny-induction`` model and transcoders on the induction prompt of docs/graphs.md
(or a longer random prompt with ``--positions N``).

    python benchmarks/bench_attention.py [--positions N] [--device cuda]
        [--model DIR --transcoders DIR] [--max-feature-nodes N] [--layer L --head H] [--top N]

``--model``/``--transcoders`` take another checkpoint, e.g. the GPU bench of
``../shared/gpu-graph-bench/`` (``SCRATCH/bench-3072-L12/model`` and its
``transcoders/local/bench-plt``); ``--layer``/``--head`` the head whose QK is attributed
(default: the last layer's head 0; the bundled model's induction head L1H3 by default).

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
    parser.add_argument("--model", default="tiny-induction")
    parser.add_argument("--transcoders", default="tiny-induction-transcoders")
    parser.add_argument("--max-feature-nodes", type=int, default=None)
    parser.add_argument("--layer", type=int, default=None)
    parser.add_argument("--head", type=int, default=None)
    parser.add_argument("--top", type=int, default=None, help="qk_attribution's top (None: all)")
    args = parser.parse_args()
    import interp

    model = interp.load_model(args.model, device=args.device)
    tc = interp.load_transcoders(args.transcoders, device=args.device)
    bundled = args.model == "tiny-induction"
    layer = args.layer if args.layer is not None else 1 if bundled else model.cfg.n_layers - 1
    head = args.head if args.head is not None else 3 if bundled else 0
    if args.positions is None:
        tokens = torch.tensor(INDUCTION)
    else:
        gen = torch.Generator().manual_seed(0)
        half = torch.randint(1, model.cfg.d_vocab, (args.positions // 2,), generator=gen)
        tokens = torch.cat([torch.tensor([0]), half, half])[: args.positions]
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    sync()
    start = time.perf_counter()
    graph = interp.attribution_graph(model, tokens, tc, max_feature_nodes=args.max_feature_nodes)
    sync()
    built = time.perf_counter() - start
    pruned = graph.prune()
    start = time.perf_counter()
    table = pruned.head_loadings()
    sync()
    loads = time.perf_counter() - start
    q = len(tokens) - 1
    k = (
        int(torch.nonzero(tokens[:q] == tokens[q]).flatten()[0]) + 1
        if (tokens[:q] == tokens[q]).any()
        else q
    )
    start = time.perf_counter()
    qk = graph.qk_attribution(layer, head, q, k, top=args.top)
    sync()
    one = time.perf_counter() - start
    edges = table.groupby(["target", "source"]).ngroups
    print(f"{len(tokens)} positions, {len(graph.nodes)} nodes, {edges} kept edges, {args.device}")
    print(f"attribution_graph     {built:8.2f} s  1.00x")
    print(f"head_loadings (edges) {loads:8.2f} s  {loads / built:.2f}x")
    print(f"qk_attribution (one)  {one:8.2f} s  {one / built:.2f}x  ({len(qk)} pairs, "
          f"L{layer}H{head} at query {q}, key {k})")  # fmt: skip


if __name__ == "__main__":
    main()
