"""Patched runs at MLP sites share passes with other runs on every zoo architecture.

``run_patched`` runs the shared prefix once and repeats its rows at the first patched layer, so
a hook after that sees several runs' blocks of rows. OPT's MLP flattens batch and position
(``[rows * pos, d_model]``), and once the rows were repeated mid-pass the bridge no longer
restores them at ``hook_mlp_out``: before the fix, two runs with an MLP site failed there with
an IndexError. Each run's numbers are checked against the prompt run alone with its
interventions (``run_cached``).
"""

from __future__ import annotations

import pytest
import torch

from interp.engine import Intervention, Site, run_cached, run_patched
from tests.zoo import ZOO_ARCHS

ATOL = 1e-5  # float32 logits of differently shaped passes


@pytest.mark.parametrize("arch", ZOO_ARCHS)
def test_runs_at_mlp_sites_give_the_numbers_of_each_run_alone(zoo, arch):
    model = zoo.model(arch)
    tokens = torch.tensor([[1, 5, 7, 9, 3, 11]])
    source = run_cached(model, tokens.flip(1), hooks=["blocks.0.hook_mlp_out"])
    last = int(model.cfg.n_layers) - 1
    runs = [
        [Intervention(Site("mlp_out", 0), "zero")],
        [Intervention(Site("mlp_out", 0, pos=2), "patch", source=source["blocks.0.hook_mlp_out"])],
        [Intervention(Site("attn_out", 0)), Intervention(Site("mlp_out", last, pos=-1))],
        [Intervention(Site("mlp_out", last), "mean")],
    ]

    def metric(logits):
        return logits[:, -1, 3] - logits[:, -1, 4]

    values = run_patched(model, tokens, runs, metric)
    for p, run in enumerate(runs):
        alone = metric(run_cached(model, tokens, interventions=run).logits)
        assert torch.allclose(values[p], alone[0], atol=ATOL, rtol=0), (arch, p)
