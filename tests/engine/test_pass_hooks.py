"""``run_patched(pass_hooks=...)``: runs that bring their own hooks per pass (discovery's edge
runs) give each run what that run alone gives, however the runs and rows are split into passes.

Each run here adds its own vector to the residual stream entering a layer, on its block of the
pass's rows only; the reference runs every (run, row) alone with the same addition as a plain
hook (``engine.run_logits``).
"""

from __future__ import annotations

import pytest
import torch

from interp.engine import run_logits, run_patched

ATOL = 1e-5  # float32 logits of differently shaped batches (2 layers, d_model 64)
N_ROWS, N_POS = 3, 6


def _setup(model):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, int(model.cfg.d_vocab), (N_ROWS, N_POS), generator=g)
    d_model = int(model.cfg.d_model)
    # run p: (layer, a vector per task row) added to blocks.{layer}.hook_resid_pre
    runs = [(p % 2, torch.randn(N_ROWS, 1, d_model, generator=g)) for p in range(5)]
    return tokens, runs


def _row_metric(logits, rows):
    return logits[:, -1, 7] - logits[:, -1, 3]


def _pass_hooks(runs, seen):
    def hooks(members: list[int], rows: slice) -> list:
        seen.append((list(members), rows))
        n = rows.stop - rows.start

        def add(block: int, vector):
            def hook(act, hook):
                out = act.clone()
                out[block * n : (block + 1) * n] += vector[rows]
                return out

            return hook

        return [
            (f"blocks.{runs[p][0]}.hook_resid_pre", add(block, runs[p][1]))
            for block, p in enumerate(members)
        ]

    return hooks


@pytest.mark.parametrize("max_rows", [None, 7, 2, 1])
def test_each_run_is_what_it_gives_alone(gpt2_model, max_rows):
    tokens, runs = _setup(gpt2_model)
    seen: list = []
    values = run_patched(
        gpt2_model, tokens, runs, row_metric=_row_metric, max_rows=max_rows,
        pass_hooks=_pass_hooks(runs, seen),
    )  # fmt: skip
    for p, (layer, vector) in enumerate(runs):
        for i in range(N_ROWS):

            def hook(act, hook, v=vector[i]):
                return act + v

            alone = run_logits(
                gpt2_model, tokens[i : i + 1], before=[(f"blocks.{layer}.hook_resid_pre", hook)]
            )
            assert abs(float(values[p, i]) - float(_row_metric(alone, None)[0])) < ATOL, (p, i)
    covered = sorted(
        (p, r) for members, rows in seen for p in members for r in range(rows.start, rows.stop)
    )
    assert covered == [(p, r) for p in range(len(runs)) for r in range(N_ROWS)]  # each once
    if max_rows == 1:
        assert all(len(members) == 1 and rows.stop - rows.start == 1 for members, rows in seen)


def test_pass_hooks_take_no_read_at(gpt2_model):
    tokens, runs = _setup(gpt2_model)
    with pytest.raises(ValueError, match="read_at"):
        run_patched(
            gpt2_model, tokens, runs, row_metric=_row_metric, read_at=torch.full((N_ROWS,), 5),
            pass_hooks=_pass_hooks(runs, []),
        )  # fmt: skip
