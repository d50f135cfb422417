"""``interp induction``: find the induction heads of a model and write a report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from interp.cli.options import (
    MAX_SEED,
    add_model_option,
    check_at_most,
    device,
    int_between,
    int_list,
    memory_size,
)
from interp.cli.output import UsageError, check_out_dir, staged_output, terminal_table
from interp.cli.sources import load_model

HELP = "find a model's induction heads; write head_scores.csv/.json and report.html"
FILES = ["head_scores.csv", "head_scores.json", "report.html"]
MAX_BATCH_SIZE = 1024  # rows per repeat length; more only costs memory


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_option(parser)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("induction-report"),
        help="output directory (default ./induction-report)",
    )
    parser.add_argument(
        "--seed",
        type=int_between(0, MAX_SEED),
        default=0,
        help="seeds the random tokens (default 0)",
    )
    parser.add_argument(
        "--seq-lens",
        type=int_list(1),
        default=None,
        help="comma-separated repeat lengths (default 10,20,40, or what fits the "
        "context and vocabulary)",
    )
    parser.add_argument(
        "--batch-size",
        type=int_between(1, MAX_BATCH_SIZE),
        default=4,
        help=f"rows per repeat length, 1 to {MAX_BATCH_SIZE} (default 4)",
    )
    parser.add_argument(
        "--ablate-top",
        type=int_between(0),
        default=None,
        help="mean-ablate only the top N heads by induction score (default all)",
    )
    parser.add_argument("--no-ablation", action="store_true", help="skip the ablation check")
    parser.add_argument("--device", type=device, default="cpu", help="torch device (default cpu)")
    parser.add_argument(
        "--device-map",
        default=None,
        help="accelerate device map for models larger than memory, e.g. auto "
        "(layers beyond --max-memory are offloaded to disk)",
    )
    parser.add_argument(
        "--max-memory",
        type=memory_size,
        default=None,
        help="with --device-map: the most the device (--device) may hold for "
        "weights, e.g. 1GiB or 500MB",
    )
    parser.add_argument(
        "--max-bytes",
        type=memory_size,
        default=None,
        help="memory budget per forward pass, e.g. 500MB: the batch is split "
        "into chunks that fit (same results)",
    )


def run(args: argparse.Namespace) -> int:
    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    out = check_out_dir(args.out)
    if args.no_ablation and args.ablate_top is not None:
        raise UsageError("--ablate-top and --no-ablation contradict each other; pass one")
    if args.max_memory is not None and args.device_map is None:
        raise UsageError("--max-memory needs --device-map (e.g. --device-map auto)")
    say(f"loading {args.model} ...")
    if args.device_map is None:
        model = load_model(args.model, device=args.device)
    else:
        key = (
            "cpu"
            if args.device == "cpu"
            else (int(args.device.split(":")[1]) if ":" in args.device else 0)
        )
        max_memory = None if args.max_memory is None else {key: args.max_memory}
        model = load_model(args.model, device_map=args.device_map, max_memory=max_memory)
    # imported only now, so that a refused command line starts fast (docs/commands.md)
    from interp.induction import run_induction_scan
    from interp.pages.induction import render_outputs

    seq_lens = args.seq_lens  # None: the scan fits the defaults to the context and vocabulary
    longest = (int(model.cfg.n_ctx) - 1) // 2  # BOS + a + a fits the context
    check_at_most(
        "--seq-lens",
        seq_lens,
        longest,
        f"BOS + two copies must fit the model's context of {model.cfg.n_ctx} tokens",
    )
    n_heads = int(model.cfg.n_layers) * int(model.cfg.n_heads)
    check_at_most("--ablate-top", args.ablate_top, n_heads, f"the model has {n_heads} heads")
    ablate = False if args.no_ablation else (True if args.ablate_top is None else args.ablate_top)
    say(f"scanning {model.cfg.n_layers * model.cfg.n_heads} heads (seed {args.seed}) ...")
    result = run_induction_scan(
        model,
        seq_lens=seq_lens,
        batch_size=args.batch_size,
        seed=args.seed,
        ablate=ablate,
        progress=True,
        max_bytes=args.max_bytes,
    )
    if result.settings["seq_lens_reason"]:
        say(f"{result.settings['seq_lens_reason']}; used {result.settings['seq_lens']}")
    say("writing the report ...")
    contents = render_outputs(model, result, str(args.model))
    with staged_output(out, owns=FILES) as stage:
        for name, text in contents.items():
            stage.write_text(name, text)
    paths = stage.written
    table = result.table
    found = table[table["is_induction"]]
    print(
        f"repeated-half loss {result.loss_repeated_half:.3f} vs first half "
        f"{result.loss_first_half:.3f}"
    )
    print(terminal_table(table.head(5), decimals=3))
    names = [f"L{a}H{b}" for a, b in zip(found["layer"], found["head"], strict=True)]
    print(f"induction heads: {', '.join(names) or 'none'}")
    for path in paths:
        print(f"wrote {path}")
    return 0
