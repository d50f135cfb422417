"""No silent fallback (interp.foundation.fallbacks): where a fast path's one-row check fails, the
engine takes the slower path and says so in one warning per process, naming the path; a fast
path that runs out of memory raises (``torch.OutOfMemoryError``), it is never taken for a
model the path cannot follow. Forced here by making the fast path raise."""

from __future__ import annotations

import logging

import pytest
import torch

import interp.engine.batch_plan as batch_plan
import interp.engine.batched as batched
import interp.engine.passes as passes
import interp.engine.suffix as suffix
from interp.engine import Intervention, Site, run_cached, run_patched
from interp.engine.passes import reads_like_forward
from interp.engine.suffix import suffix_like_forward
from interp.foundation.fallbacks import reset_fallback_warnings

TOKENS = torch.tensor([[0, 5, 17, 33, 99, 12, 7, 5]])
READ_AT = torch.tensor([7])
HOOK = "blocks.1.hook_resid_pre"


@pytest.fixture(autouse=True)
def fresh_warnings():
    reset_fallback_warnings()
    yield
    reset_fallback_warnings()


def _warnings(caplog, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelname == "WARNING"]


def _raising(error: BaseException):
    def fail(*args, **kwargs):
        raise error

    return fail


def test_the_one_position_read_falls_back_with_one_warning(gpt2_model, monkeypatch, caplog):
    assert reads_like_forward(gpt2_model, TOKENS, READ_AT)  # the fast read, no warning
    assert not _warnings(caplog, "interp.engine.passes")
    monkeypatch.setattr(passes, "forward_read", _raising(AttributeError("no ln_final here")))
    with caplog.at_level(logging.WARNING, logger="interp.engine.passes"):
        for _ in range(3):
            assert not reads_like_forward(gpt2_model, TOKENS, READ_AT)
    said = _warnings(caplog, "interp.engine.passes")
    assert len(said) == 1, said
    assert "forward_read" in said[0] and "full logits" in said[0]
    assert "AttributeError: no ln_final here" in said[0]


def test_the_one_position_read_raises_out_of_memory(gpt2_model, monkeypatch, caplog):
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(passes, "forward_read", _raising(oom))
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):
        reads_like_forward(gpt2_model, TOKENS, READ_AT)
    assert not _warnings(caplog, "interp.engine.passes")


def test_the_suffix_pass_falls_back_with_one_warning(gpt2_model, monkeypatch, caplog):
    assert suffix_like_forward(gpt2_model, TOKENS, READ_AT)
    monkeypatch.setattr(suffix, "suffix_pass", _raising(RuntimeError("a shape it cannot follow")))
    with caplog.at_level(logging.WARNING, logger="interp.engine.suffix"):
        for _ in range(3):
            assert not suffix_like_forward(gpt2_model, TOKENS, READ_AT)
    said = _warnings(caplog, "interp.engine.suffix")
    assert len(said) == 1, said
    assert "suffix_pass" in said[0] and "dense passes" in said[0]


def test_the_suffix_pass_raises_out_of_memory(gpt2_model, monkeypatch, caplog):
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(suffix, "suffix_pass", _raising(oom))
    with pytest.raises(torch.OutOfMemoryError):
        suffix_like_forward(gpt2_model, TOKENS, READ_AT)
    assert not _warnings(caplog, "interp.engine.suffix")


def test_a_mismatch_is_a_fallback_too(gpt2_model, monkeypatch, caplog):
    # the read runs but gives other logits (a model with a final step after the unembedding)
    real = passes.forward_read
    monkeypatch.setattr(passes, "forward_read", lambda *a, **k: real(*a, **k) + 1.0)
    with caplog.at_level(logging.WARNING, logger="interp.engine.passes"):
        assert not reads_like_forward(gpt2_model, TOKENS, READ_AT)
        assert not reads_like_forward(gpt2_model, TOKENS, READ_AT)
    said = _warnings(caplog, "interp.engine.passes")
    assert len(said) == 1 and "differ" in said[0], said


def test_suffix_states_over_budget_fall_back_with_one_warning(gpt2_model, monkeypatch, caplog):
    # the base run's keys and values do not fit max_bytes (state_bytes made huge): the dense
    # passes run, the same numbers, and one warning says so
    tokens = torch.tensor([[0, 5, 17, 33, 99, 12, 7, 5], [0, 9, 8, 7, 6, 5, 4, 3]])
    read_at = torch.tensor([7, 7])
    source = run_cached(gpt2_model, tokens, hooks=["blocks.1.hook_resid_pre"])
    runs = [
        [Intervention(Site("resid_pre", 1, pos=pos), "patch", source=source[HOOK])]
        for pos in (3, 5)
    ]

    def row_metric(logits, rows):  # logits read at each row's last token: [batch d_vocab]
        return logits[:, 7]

    calls = []
    real = batched.suffix_pass
    monkeypatch.setattr(batched, "suffix_pass", lambda *a, **k: calls.append(1) or real(*a, **k))
    fast = run_patched(gpt2_model, tokens, runs, row_metric=row_metric, read_at=read_at)
    assert calls  # the suffix passes ran
    calls.clear()
    monkeypatch.setattr(batch_plan, "state_bytes", lambda *a: 10**15)
    dense = []
    with caplog.at_level(logging.WARNING, logger="interp.engine.batch_plan"):
        for _ in range(2):
            dense.append(
                run_patched(
                    gpt2_model,
                    tokens,
                    runs,
                    row_metric=row_metric,
                    read_at=read_at,
                    max_bytes="1GB",
                )  # fmt: skip
            )
    assert not calls  # the dense passes ran
    said = _warnings(caplog, "interp.engine.batch_plan")
    assert len(said) == 1 and "dense passes" in said[0], said
    torch.testing.assert_close(dense[0], fast, atol=1e-5, rtol=0)
