"""Activation patching vs TransformerLens, and attribution patching in forward-pass units.

Targets (issues 13 and 19), on a GPT-2-small-shaped model on CPU:
- ``pair``: the exact residual-stream grid of one prompt pair (every layer x every position,
  ``resid_pre``) costs <= 0.5x TransformerLens's ``get_act_patch_resid_pre`` on the same
  inputs, with the same numbers; the attribution-patching grid over every site costs <= 4
  forward passes;
- ``task``: the same ``resid_pre`` grid over a task of ``--task-rows`` rows (each with its own
  answer and wrong token, read at its last token), against ``get_act_patch_resid_pre`` on the
  same batch with the task's metric averaged over rows: <= 0.5x its time, the same numbers
  (max |ours - TL| <= 1e-4).

Both sides include the clean run that caches the patched activations.

    python benchmarks/bench_patching.py [--n-tokens 20] [--repeat 3] [--threads 1]
        [--task-rows 32] [--task-tokens 10] [--task-repeat 1] [--only pair|task]
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
from interp.tasks import Task  # noqa: E402


def _verdict(ratio: float, target: float = 0.5) -> str:
    return (
        f"interp / TL = {ratio:.2f} (target <= {target}): {'OK' if ratio <= target else 'MISSED'}"
    )


def pair(model, args) -> None:
    """One prompt pair: the resid_pre grid against TL, and attribution in forward passes."""
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(1, 600, (1, args.n_tokens), generator=gen)
    clean[0, 0] = model.tokenizer.bos_token_id
    corrupted = clean.clone()
    corrupted[0, 1 : args.n_tokens // 2] = torch.randint(
        1, 600, (args.n_tokens // 2 - 1,), generator=gen
    )
    metric = logit_diff(int(clean[0, 1]), int(clean[0, 2]))
    n_layers = int(model.cfg.n_layers)

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
    print(f"pair: {args.n_tokens} tokens")
    for name, seconds in {**times, **cost}.items():
        print(f"{name:>28}: {seconds:7.3f} s")
    print(
        f"resid_pre grid: {n_layers} layers x {args.n_tokens} positions; max |ours - TL| = "
        f"{difference:.2e}"
    )
    print(_verdict(ratio))
    print(
        f"attribution grid over every site ({n_cells} cells: {', '.join(GRIDS)}) = "
        f"{passes:.2f} forward passes (target <= 4): {'OK' if passes <= 4 else 'MISSED'}"
    )


def _task(model, n_rows: int, n_tokens: int) -> Task:
    """``n_rows`` pairs of ``n_tokens`` token ids (BOS first), the first half after BOS
    corrupted, each row with its own answer and wrong token."""
    gen = torch.Generator().manual_seed(1)
    records = []
    for _ in range(n_rows):
        clean = torch.randint(1, 600, (n_tokens,), generator=gen)
        clean[0] = model.tokenizer.bos_token_id
        corrupted = clean.clone()
        corrupted[1 : max(2, n_tokens // 2)] = torch.randint(
            1, 600, (max(1, n_tokens // 2 - 1),), generator=gen
        )
        answer, wrong = (int(t) + 1 for t in torch.randperm(599, generator=gen)[:2])
        records.append(
            {"clean": clean.tolist(), "corrupted": corrupted.tolist(), "answer": answer}
            | {"wrong": wrong}
        )
    return Task.from_records(records)


def task(model, args) -> None:
    """A task of ``--task-rows`` rows: the resid_pre grid against TL on the same batch."""
    batch = _task(model, args.task_rows, args.task_tokens).tokens(model)
    metric = batch.metric("logit_diff")  # per row, at each row's last token, own answer
    n_layers = int(model.cfg.n_layers)

    def ours():
        return patch_activations(model, batch, sites=["resid_pre"])

    def theirs():
        with torch.inference_mode():
            _, cache = model.run_with_cache(batch.clean, names_filter=lambda n: "resid_pre" in n)
            return tl_patching.get_act_patch_resid_pre(
                model, batch.corrupted, cache, lambda logits: metric(logits).mean()
            )

    # the first runs give the numbers and are the warm-up of the timing
    ours_grid = torch.tensor(ours()["metric"].to_numpy()).reshape(n_layers, -1)
    difference = float((ours_grid - theirs().double()).abs().max())
    times = time_side_by_side(
        {"interp task resid_pre grid": ours, "TL get_act_patch_resid_pre": theirs},
        repeat=args.task_repeat,
        warm_up=False,
    )
    ratio = times["interp task resid_pre grid"] / times["TL get_act_patch_resid_pre"]
    print(f"task: {args.task_rows} rows x {args.task_tokens} tokens (logit_diff per row, mean)")
    for name, seconds in times.items():
        print(f"{name:>28}: {seconds:7.3f} s")
    print(
        f"resid_pre grid: {n_layers} layers x {args.task_tokens} positions over "
        f"{args.task_rows} rows; max |ours - TL| = {difference:.2e} (target <= 1e-4): "
        f"{'OK' if difference <= 1e-4 else 'MISSED'}"
    )
    print(_verdict(ratio))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-tokens", type=int, default=20, help="pair prompt length (with BOS)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of the pair grids")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--task-rows", type=int, default=32)
    parser.add_argument("--task-tokens", type=int, default=10, help="task row length (with BOS)")
    parser.add_argument("--task-repeat", type=int, default=1, help="timed runs of the task grids")
    parser.add_argument("--only", choices=["pair", "task"], help="run one of the two")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = gpt2_small_shaped()
    print(
        f"model: GPT-2-small-shaped random (12 layers x 12 heads, d_model 768, d_vocab "
        f"{model.cfg.d_vocab}); torch threads {torch.get_num_threads()}"
    )
    if args.only in (None, "pair"):
        pair(model, args)
    if args.only in (None, "task"):
        task(model, args)


if __name__ == "__main__":
    main()
