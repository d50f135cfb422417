"""Metrics: token text resolved with the model's tokenizer, and batch-averaging metrics read
row by row, the same way in patch_activations and path_patch."""

from __future__ import annotations

import pytest
import torch

from interp import load_model, run_cached
from interp.attribution import TokenError
from interp.interventions import (
    answer_loss,
    logit_diff,
    patch_activations,
    path_patch,
    path_patch_senders,
    probability,
)
from interp.interventions.metrics import is_scalar

CLEAN = "def f(data, text):\n    return data"
CORRUPTED = "def f(text, data):\n    return data"


@pytest.fixture(scope="module")
def bundled():
    return load_model("tiny-induction")


def _id(model, text: str) -> int:
    (token,) = model.to_tokens(text, prepend_bos=False)[0].tolist()
    return int(token)


def _values(frame):
    return torch.tensor(frame["metric"].to_numpy(dtype=float))


@pytest.mark.parametrize(
    "make",
    [lambda a, w: logit_diff(a, w), lambda a, w: probability(a), lambda a, w: answer_loss(a)],
)
def test_token_text_gives_the_numbers_of_its_id(bundled, make):
    data, text = _id(bundled, " data"), _id(bundled, " text")
    kwargs = dict(sites=["heads"], method="both")
    by_text = patch_activations(bundled, CLEAN, CORRUPTED, make(" data", " text"), **kwargs)
    by_id = patch_activations(bundled, CLEAN, CORRUPTED, make(data, text), **kwargs)
    assert torch.equal(_values(by_text), _values(by_id))
    assert by_text.attrs["clean_metric"] == by_id.attrs["clean_metric"]
    assert make(" data", " text").resolve(bundled) == make(data, text)
    paths = [
        path_patch(bundled, CLEAN, CORRUPTED, sender=(0, 1), receivers="logits", metric=m)
        for m in (make(" data", " text"), make(data, text))
    ]
    assert paths[0].table["metric"].tolist() == paths[1].table["metric"].tolist()


def test_text_that_is_not_one_token_is_refused_showing_its_tokens(bundled):
    with pytest.raises(
        TokenError,
        match=r"' Johns' tokenises to 4 tokens \[' J', 'o', 'h', 'ns'\]; pass a single-token",
    ):
        patch_activations(bundled, CLEAN, CORRUPTED, logit_diff(" Johns", " text"))
    with pytest.raises(TokenError, match=r"tokenises to \d+ tokens .*single-token wrong"):
        path_patch(
            bundled,
            CLEAN,
            CORRUPTED,
            sender=(0, 1),
            receivers="logits",
            metric=logit_diff(" data", " xyzzy"),
        )
    with pytest.raises(ValueError, match=r"holds token text; call metric.resolve\(model\)"):
        logit_diff(" data")(torch.zeros(1, 3, 8))
    with pytest.raises(ValueError, match="the answer is empty"):
        probability("")


def _metrics(model):
    """The same logit difference as a per-row metric and as a TransformerLens-style scalar."""
    data, text = _id(model, " data"), _id(model, " text")

    def scalar(logits):
        return (logits[:, -1, data] - logits[:, -1, text]).mean()

    return logit_diff(data, text), scalar


def test_a_batch_averaging_metric_gives_the_per_row_numbers_in_patch_activations(bundled):
    rows, scalar = _metrics(bundled)
    assert is_scalar(scalar, run_cached(bundled, CLEAN).logits)
    assert not is_scalar(rows, run_cached(bundled, CLEAN).logits)
    kwargs = dict(sites=["resid_pre", "heads"], method="both", max_rows=16)
    ours = patch_activations(bundled, CLEAN, CORRUPTED, scalar, **kwargs)
    reference = patch_activations(bundled, CLEAN, CORRUPTED, rows, **kwargs)
    assert torch.allclose(_values(ours), _values(reference), atol=1e-6, rtol=0)
    assert ours.attrs["metric_name"] == "scalar"
    assert ours.attrs["clean_metric"] == pytest.approx(reference.attrs["clean_metric"], abs=1e-6)


def test_a_batch_averaging_metric_gives_the_per_row_numbers_in_path_patching(bundled):
    rows, scalar = _metrics(bundled)
    one = [
        path_patch(bundled, CLEAN, CORRUPTED, sender=(0, 2), receivers="logits", metric=m)
        for m in (scalar, rows)
    ]
    assert one[0].table["metric"].tolist() == pytest.approx(
        one[1].table["metric"].tolist(), abs=1e-6
    )
    many = [
        path_patch_senders(
            bundled, CLEAN, CORRUPTED, receivers="logits", metric=m, senders_per_pass=3
        )
        for m in (scalar, rows)
    ]
    assert many[0].table["metric"].tolist() == pytest.approx(
        many[1].table["metric"].tolist(), abs=1e-6
    )


def test_run_patched_says_what_a_batch_averaging_metric_is(bundled):
    from interp.interventions import run_patched

    _, scalar = _metrics(bundled)
    with pytest.raises(
        ValueError, match="one number for a batch of 2 patched runs.*patch_activations"
    ):
        run_patched(bundled, CLEAN, [[], []], scalar)
