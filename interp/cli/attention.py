"""``interp attention``: one self-contained HTML page with each layer's attention patterns.

    interp attention --model tiny-induction --prompt "A B C A B" --out attention.html

The page opens offline (CircuitsVis inlined once), and the prompt, its tokens and the model
name are shown as text, never read as markup or script.
"""

from __future__ import annotations

import argparse
import logging

from interp.cli.options import (
    add_model_option,
    check_at_most,
    device,
    int_list,
    unique,
)
from interp.cli.output import UsageError, check_out_file, write_file
from interp.cli.sources import load_model

HELP = "write a self-contained HTML page of a prompt's attention patterns, one view per layer"

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_option(parser)
    parser.add_argument("--prompt", required=True, help="the text to run")
    parser.add_argument(
        "--out",
        required=True,
        metavar="FILE.html",
        help="where to write the page (written atomically)",
    )
    parser.add_argument(
        "--layers",
        type=int_list(0),
        nargs="+",
        metavar="L",
        help="layers to show, comma- or space-separated (0,1 or 0 1), each once (default: all)",
    )
    parser.add_argument("--device", type=device, default="cpu", help="torch device (default cpu)")


def run(args: argparse.Namespace) -> int:
    layers = None if args.layers is None else [v for part in args.layers for v in part]
    path = write_attention_page(
        model_name=args.model,
        prompt=args.prompt,
        out=args.out,
        layers=layers,
        device=args.device,
    )
    print(f"wrote {path}")
    return 0


def write_attention_page(*, model_name: str, prompt: str, out, layers=None, device=None):
    """Load ``model_name``, run ``prompt``, and write the attention page to ``out``. The
    arguments and ``out`` are checked before the model loads (:class:`UsageError`)."""
    out = check_out_file(out, suffix=".html")
    if not prompt:
        raise UsageError("--prompt is empty; pass some text with --prompt")
    layers = unique(layers)
    model = load_model(model_name, device=device)
    # imported only now, so that a refused command line starts fast (docs/commands.md)
    from interp.engine import run_cached
    from interp.pages.html import Report

    n_layers = int(model.cfg.n_layers)
    check_at_most(
        "--layers", layers, n_layers - 1, f"the model has {n_layers} layers, 0 to {n_layers - 1}"
    )
    n_tokens = int(model.to_tokens(prompt, truncate=False).shape[-1])
    check_at_most(
        "the prompt's length in tokens",
        n_tokens,
        int(model.cfg.n_ctx),
        "the model's context; pass a shorter --prompt",
    )
    run = run_cached(model, prompt, patterns=True, layers=layers, keep_logits=False)
    tokens = model.to_str_tokens(run.tokens[0])
    patterns = run.patterns()  # [layer batch head q_pos k_pos]
    n_heads = patterns.shape[2]
    logger.info("%d tokens, layers %s", len(tokens), list(run.layers))

    report = Report(f"Attention patterns: {model_name}")
    report.add_text(f"Model: {model_name}\nPrompt ({len(tokens)} tokens): {prompt}")
    report.add_text(
        "Each view shows one layer's heads: a row is a query (destination) token, a "
        "column a key (source) token it attends to. Hover a head to zoom in; "
        "click to keep it."
    )
    for i, layer in enumerate(run.layers):
        report.add_heading(f"Layer {layer}")
        report.add_attention(
            tokens,
            patterns[i, 0],
            head_names=[f"L{layer}H{h}" for h in range(n_heads)],
            caption=f"layer {layer}, {n_heads} heads",
        )
    return write_file(out, report.to_html())
