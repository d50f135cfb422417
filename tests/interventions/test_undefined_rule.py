"""One rule says when a recovered share is undefined (clean and corrupted metrics numerically
equal, or NaN): patching grids, path patching and circuit discovery all read it."""

import math

import pytest
import torch

from interp.discovery import scores
from interp.interventions import grids, path_nodes


@pytest.mark.parametrize(
    ("clean", "corrupted", "expected"),
    [
        (1.0, 0.0, False),
        (1.0, 1.0, True),
        (1.0, 1.0 + 5e-7, True),  # within EQUAL_RTOL of the larger
        (1.0, 1.0 + 2e-6, False),
        (1e4, 1e4 + 5e-3, True),  # relative to the metrics' size
        (math.nan, 1.0, True),  # a NaN metric: no share to report
        (1.0, math.inf, True),
    ],
)
def test_every_recovered_share_reads_one_rule(clean, corrupted, expected):
    assert grids.undefined(clean, corrupted) is expected
    assert scores._undefined(clean, corrupted) is expected
    assert path_nodes._recoverable(clean, corrupted) is (not expected)
    shares, flagged = grids.recovered(torch.tensor([0.5, 1.0]), clean, corrupted)
    assert flagged is expected
    assert all(math.isnan(s) for s in shares) is expected
