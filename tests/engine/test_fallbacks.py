"""No silent fallback (interp.foundation.fallbacks): where a fast path's one-row check fails, the
engine takes the slower path and says so in one warning per process, naming the path; a fast
path that runs out of memory raises (``torch.OutOfMemoryError``), it is never taken for a
model the path cannot follow. Forced here by making the fast path raise."""

from __future__ import annotations

import logging

import pytest
import torch

import interp.engine.passes as passes
import interp.engine.suffix as suffix
from interp.engine.passes import reads_like_forward
from interp.engine.suffix import suffix_like_forward
from interp.foundation.fallbacks import reset_fallback_warnings

TOKENS = torch.tensor([[0, 5, 17, 33, 99, 12, 7, 5]])
READ_AT = torch.tensor([7])


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
