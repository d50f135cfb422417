"""Activation patching vs TransformerLens, and attribution patching in forward-pass units.

Targets (issue 13), on a GPT-2-small-shaped model on CPU:
- the exact residual-stream grid (every layer x every position, ``resid_pre``) costs <= 0.5x
  TransformerLens's ``get_act_patch_resid_pre`` on the same inputs, with the same numbers;
- the attribution-patching grid over every site costs <= 4 forward passes.

Both sides include the clean run that caches the patched activations.

    python benchmarks/bench_patching.py [--n-tokens 20] [--repeat 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from transformer_lens import patching as tl_patching  # noqa: E402

from benchmarks.common import gpt2_small_shaped, time_side_by_side  # noqa: E402
from interp.interventions import GRIDS, logit_diff, patch_activations  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-tokens", type=int, default=20, help="prompt length (with BOS)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = gpt2_small_shaped()
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(1, 600, (1, args.n_tokens), generator=gen)
    clean[0, 0] = model.tokenizer.bos_token_id
    corrupted = clean.clone()
    corrupted[0, 1 : args.n_tokens // 2] = torch.randint(
        1, 600, (args.n_tokens // 2 - 1,), generator=gen
    )
    metric = logit_diff(int(clean[0, 1]), int(clean[0, 2]))
    n_layers = int(model.cfg.n_layers)
    print(
        f"model: GPT-2-small-shaped random (12 layers x 12 heads, d_model 768, d_vocab "
        f"{model.cfg.d_vocab}); {args.n_tokens} tokens; torch threads {torch.get_num_threads()}"
    )

    def ours():
        return patch_activations(model, clean, corrupted, metric, sites=["resid_pre"])

    def theirs():
        with torch.inference_mode():
            _, cache = model.run_with_cache(clean, names_filter=lambda n: "resid_pre" in n)
            return tl_patching.get_act_patch_resid_pre(
                model, corrupted, cache, lambda logits: metric(logits)[0]
            )

    ours_grid = torch.tensor(ours()["metric"].to_numpy()).reshape(n_layers, -1)
    difference = float((ours_grid - theirs().double()).abs().max())

    def forward():
        with torch.inference_mode():
            model(corrupted)

    def attribution():
        patch_activations(model, clean, corrupted, metric, sites=list(GRIDS), method="attribution")

    times = time_side_by_side(
        {"interp resid_pre grid": ours, "TL get_act_patch_resid_pre": theirs}, repeat=args.repeat
    )
    cost = time_side_by_side(
        {"plain forward": forward, "attribution grid": attribution}, repeat=args.repeat
    )
    n_cells = len(
        patch_activations(model, clean, corrupted, metric, sites=list(GRIDS), method="attribution")
    )
    ratio = times["interp resid_pre grid"] / times["TL get_act_patch_resid_pre"]
    passes = cost["attribution grid"] / cost["plain forward"]
    for name, seconds in {**times, **cost}.items():
        print(f"{name:>28}: {seconds:7.3f} s")
    print(
        f"resid_pre grid: {n_layers} layers x {args.n_tokens} positions; max |ours - TL| = "
        f"{difference:.2e}"
    )
    print(f"interp / TL = {ratio:.2f} (target <= 0.5): {'OK' if ratio <= 0.5 else 'MISSED'}")
    print(
        f"attribution grid over every site ({n_cells} cells: {', '.join(GRIDS)}) = "
        f"{passes:.2f} forward passes (target <= 4): {'OK' if passes <= 4 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
