"""Heads whose OV or QK circuit is exactly or numerically zero: NaN plus a flag, never a crash.

The toy (tests/zoo.py ``toy_zero_heads``) has L0H1 with W_O = 0 and L1H2 with W_V = 0 (OV
circuits exactly zero) and L1H3 with W_Q = W_K = 0 (QK circuit exactly zero).
"""

from __future__ import annotations

import logging

import pandas as pd
import pytest
import torch

from interp.circuits import (
    circuit_weights,
    composition_scores,
    composition_scores_dense,
    copying_scores,
    copying_scores_dense,
    ov_eigenvalues,
    top_copied_tokens,
)
from interp.circuits import copying as copying_module
from interp.foundation.fallbacks import reset_fallback_warnings
from interp.induction import detect_induction_heads

ZERO_OV = {(0, 1), (1, 2)}


@pytest.fixture(scope="module")
def toy(zoo):
    return zoo.model("toy_zero_heads")


def _flagged(df: pd.DataFrame) -> set[tuple[int, int]]:
    return set(zip(df.loc[df["undefined"], "layer"], df.loc[df["undefined"], "head"], strict=True))


@pytest.mark.parametrize("scores", [copying_scores, copying_scores_dense])
def test_copying_zero_ov_heads_undefined(toy, scores):
    df = scores(toy)
    assert _flagged(df) == ZERO_OV
    assert df.loc[df["undefined"], "copying_score"].isna().all()
    assert df.loc[~df["undefined"], "copying_score"].between(-1, 1).all()


@pytest.mark.parametrize("scores", [composition_scores, composition_scores_dense])
def test_composition_zero_sides_undefined(toy, scores):
    df = scores(toy, "QKV", baseline_samples=10)
    src = list(zip(df["src_layer"], df["src_head"], strict=True))
    dst = list(zip(df["dst_layer"], df["dst_head"], strict=True))
    expected = [
        s == (0, 1) or (k in "QK" and d == (1, 3)) or (k == "V" and d == (1, 2))
        for s, d, k in zip(src, dst, df["kind"], strict=True)
    ]
    assert df["undefined"].tolist() == expected
    assert df["score"].isna().tolist() == expected


def test_composition_fast_flags_match_dense(toy):
    fast = composition_scores(toy, "QKV", baseline_samples=10)
    dense = composition_scores_dense(toy, "QKV", baseline_samples=10)
    assert fast["undefined"].tolist() == dense["undefined"].tolist()
    ok = ~fast["undefined"]
    assert (fast.loc[ok, "score"] - dense.loc[ok, "score"]).abs().max() <= 1e-4


def test_numerically_zero_head_is_flagged(toy):
    w = circuit_weights(toy)
    W_V = w.W_V.clone()
    W_V[0, 0] = 1e-42  # float32 denormals: every product underflows to zero
    tiny = type(w)(**{**{f: getattr(w, f) for f in w.__dataclass_fields__}, "W_V": W_V})
    df = copying_scores(tiny)
    assert (0, 0) in _flagged(df)
    assert _flagged(copying_scores_dense(tiny)) == _flagged(df)


def test_solver_failure_is_undefined_not_a_crash(toy, monkeypatch, caplog):
    reset_fallback_warnings()
    real = torch.linalg.eigvals

    def flaky(matrix):  # LAPACK "fails" on the batched call and on head L0H0 alone
        if matrix.ndim > 2 or torch.equal(matrix, first):
            raise torch.linalg.LinAlgError("did not converge")
        return real(matrix)

    inner, _ = copying_module._ov_inner(circuit_weights(toy))
    first = inner[0, 0].double()
    monkeypatch.setattr(torch.linalg, "eigvals", flaky)
    with caplog.at_level(logging.WARNING, logger="interp.circuits.copying"):
        df = copying_scores(toy)
        assert _flagged(df) == ZERO_OV | {(0, 0)}
        assert df["copying_score"].notna().sum() == 8 - 3
        eig = ov_eigenvalues(toy)
        assert eig[0, 0].isnan().all() and not eig[0, 2].isnan().any()
    # the slower per-head path is not silent: one warning, however often it runs
    said = [r.getMessage() for r in caplog.records if "did not converge" in r.getMessage()]
    assert len(said) == 1 and "each head's matrix alone" in said[0], said


def test_solver_out_of_memory_is_raised(toy, monkeypatch):
    def oom(matrix):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")

    monkeypatch.setattr(torch.linalg, "eigvals", oom)
    with pytest.raises(torch.OutOfMemoryError):
        copying_scores(toy)


def test_non_finite_weights_are_undefined(toy):
    w = circuit_weights(toy)
    W_O = w.W_O.clone()
    W_O[1, 0, 0, 0] = float("nan")
    broken = type(w)(**{**{f: getattr(w, f) for f in w.__dataclass_fields__}, "W_O": W_O})
    assert (1, 0) in _flagged(copying_scores(broken))


def test_top_copied_tokens_of_a_zero_head(toy):
    df = top_copied_tokens(toy, 0, 1, k=5)
    assert df.attrs["undefined"] is True and df.empty
    live = top_copied_tokens(toy, 0, 0, k=5)
    assert live.attrs["undefined"] is False and len(live) == 5


def test_induction_scan_copying_column(toy):
    table = detect_induction_heads(toy, ablate=False)
    by_head = table.set_index(["layer", "head"])["copying_score"]
    assert by_head.loc[list(ZERO_OV)].isna().all()
    assert by_head.drop(index=list(ZERO_OV)).notna().all()
