"""Induction scan vs one plain forward pass vs TransformerLens's detect_head, side by side.

Target (issue 6): the scan (all heads; induction, previous-token and duplicate-token scores and
the losses, no ablations) costs <= 1.2x one plain forward pass on the same batch of a
GPT-2-small-shaped model on CPU, and is faster than detect_head for the same three scores.

    python benchmarks/bench_induction.py [--batch-size 4] [--seq-lens 10,20,40]
"""

from __future__ import annotations

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from transformer_lens.head_detector import detect_head  # noqa: E402

from benchmarks.common import gpt2_small_shaped, time_side_by_side  # noqa: E402
from interp.induction import ordinary_token_ids, repeated_tokens, scan_heads  # noqa: E402

# made-up words, so that random tokens decode to text detect_head re-encodes to the same ids
WORDS = [
    " " + "".join(random.Random(i).choices("bcdfghjklmnpqrstvwz", k=3)) + "a" for i in range(300)
]
TL_HEADS = ("induction_head", "previous_token_head", "duplicate_token_head")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=4, help="rows per repeat length")
    parser.add_argument("--seq-lens", default="10,20,40")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(2)
    seq_lens = [int(v) for v in args.seq_lens.split(",")]

    model = gpt2_small_shaped(corpus=["".join(WORDS)] * 3)
    vocab = ordinary_token_ids(model.tokenizer, 600)
    batch = repeated_tokens(
        vocab,
        seq_lens=seq_lens,
        batch_size=args.batch_size,
        bos_id=model.tokenizer.bos_token_id,
        seed=0,
    )
    texts = [model.tokenizer.decode(row[1:]) for row in batch.tokens]
    assert all(
        torch.equal(model.to_tokens(t)[0].cpu(), row)
        for t, row in zip(texts, batch.tokens, strict=True)
    )
    print(
        f"model: GPT-2-small-shaped random (12 layers x 12 heads, d_model 768, d_vocab "
        f"{model.cfg.d_vocab}); batch {tuple(batch.tokens.shape)}; torch threads "
        f"{torch.get_num_threads()}"
    )

    def forward():
        with torch.inference_mode():
            model(batch.tokens)

    def scan():
        scan_heads(model, batch)

    def tl_detect_head():
        with torch.inference_mode():
            for name in TL_HEADS:
                detect_head(model, texts, name)

    times = time_side_by_side({"plain forward": forward, "interp scan": scan}, repeat=args.repeat)
    # detect_head is an order of magnitude slower: timed once, beside a forward pass of its own
    slow = time_side_by_side({"plain forward": forward, "detect_head x3": tl_detect_head}, repeat=1)
    base = times["plain forward"]
    print(f"{'plain forward':>16}: {base:7.3f} s")
    print(
        f"{'interp scan':>16}: {times['interp scan']:7.3f} s  "
        f"({times['interp scan'] / base:5.2f}x plain forward)"
    )
    print(
        f"{'detect_head x3':>16}: {slow['detect_head x3']:7.3f} s  "
        f"({slow['detect_head x3'] / slow['plain forward']:5.2f}x plain forward)"
    )
    ratio = times["interp scan"] / base
    speedup = (slow["detect_head x3"] / slow["plain forward"]) / ratio
    print(f"scan / forward = {ratio:.2f} (target <= 1.2): {'OK' if ratio <= 1.2 else 'MISSED'}")
    print(f"detect_head / scan = {speedup:.1f}x (target > 1): {'OK' if speedup > 1 else 'MISSED'}")


if __name__ == "__main__":
    main()
