"""interp.tasks against a tokenizer: validation messages, padded batches, per-row metrics.

Two tokenizers: a GPT-2-like byte-level BPE (BOS prepended, learned positions; built in
tests/task_models.py, where names and two-digit years are one token) and the bundled model's
(rotary, no BOS by default).
"""

from __future__ import annotations

import math

import pytest
import torch

from interp import load_model
from interp.engine import to_tokens
from interp.tasks import (
    Task,
    TaskError,
    last_logits,
    task_logit_diff,
    task_prob_diff,
)
from interp.tasks.tokens import encode
from tests.task_models import IOI, SHORT, gpt2_like_model

ATOL = 1e-6  # float32 softmax of a handful of logits


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    return gpt2_like_model(tmp_path_factory.mktemp("gpt2-like"))


@pytest.fixture(scope="module")
def bundled():
    return load_model("tiny-induction")


def _one_line(exc) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


# ---- tokenisation errors ---------------------------------------------------------------------


def _refusal(model, change) -> str:
    with pytest.raises(TaskError) as exc:
        Task.from_records([SHORT, dict(SHORT, **change)]).tokens(model)
    return _one_line(exc)


def test_pairs_of_different_lengths_are_refused(gpt2):
    message = _refusal(gpt2, {"corrupted": "When Alice and Ericson went"})
    assert message.startswith("row 2: clean and corrupted tokenise to different lengths (6 vs 9)")
    assert "clean ['<|endoftext|>', 'When', ' Mary', ' and', ' John', ' went']" in message
    assert "' Eric', 's', 'o', 'n', ' went']; a pair must have equal lengths" in message


def test_answers_must_be_one_token_unless_listed(gpt2):
    message = _refusal(gpt2, {"answer": " Johns"})
    assert (
        "row 2: 'answer' ' Johns' tokenises to 2 tokens [' John', 's']; give a "
        "single token, or a list of tokens"
    ) in message
    message = _refusal(gpt2, {"wrong": [" Mary", " Marys"]})
    assert "row 2: 'wrong' ' Marys' tokenises to 2 tokens [' Mary', 's']" in message
    assert "each item of a list must be one token" in message
    assert "lists the token [' Mary'] twice" in _refusal(gpt2, {"answer": [" Mary", " Mary"]})
    assert "answer and wrong share the token(s) [' to']" in _refusal(gpt2, {"wrong": " to"})
    assert "outside the vocabulary" in _refusal(gpt2, {"answer": 10**6})


def test_positions_out_of_range_are_refused(gpt2):
    message = _refusal(gpt2, {"positions": {"IO": 1, "END": 5}})
    assert (
        "row 2: position 'END' = 5 is outside the prompt's 5 tokens ['When', ' Mary', "
        "' and', ' John', ' went'] (valid: 0 to 4, or -5 to -1 from the end)"
    ) in message
    assert "'S1' = -6" in _refusal(gpt2, {"positions": {"S1": -6}})


def test_prompts_the_model_cannot_run_are_refused(gpt2):
    assert "row 2: 'clean'" in _refusal(gpt2, {"clean": [1, 2, 10**6]})
    long = " and" * 200
    message = _refusal(gpt2, {"clean": long, "corrupted": long})
    assert "row 2: 'clean'" in message and "context is 128" in message


def test_a_refused_task_writes_nothing(gpt2, tmp_path):
    bad = Task.from_records([SHORT, dict(SHORT, answer=" Johns")])
    path = tmp_path / "task.jsonl"
    with pytest.raises(TaskError):
        bad.to_jsonl(path, model=gpt2)
    with pytest.raises(TaskError):
        bad.to_csv(tmp_path / "task.csv", model=gpt2)
    assert list(tmp_path.iterdir()) == []
    path.write_text("keep\n", encoding="utf-8")
    with pytest.raises(TaskError):
        bad.to_jsonl(path, model=gpt2)
    assert path.read_text(encoding="utf-8") == "keep\n"
    Task.from_records([SHORT]).to_jsonl(path, model=gpt2)
    assert Task.from_jsonl(path)[0].clean == SHORT["clean"]


def test_file_rows_are_named_with_the_file(gpt2, tmp_path):
    path = tmp_path / "task.jsonl"
    Task.from_records([SHORT, dict(SHORT, answer=" Johns")]).to_jsonl(path)
    with pytest.raises(TaskError, match=r"task\.jsonl row 2: 'answer' ' Johns'"):
        Task.from_jsonl(path).tokens(gpt2)


# ---- padded batches --------------------------------------------------------------------------


def _mixed():
    return Task.from_records(
        [
            dict(IOI),
            dict(SHORT, positions={"END": -1}),
            {"clean": [3, 4, 5], "corrupted": [6, 7, 8], "answer": [9, 10], "wrong": 11},
        ]
    )


def test_padding_is_on_the_right_with_bos_as_to_tokens(gpt2):
    batch = _mixed().tokens(gpt2)
    assert batch.pad_id == 0 and len(batch) == 3
    assert batch.lengths.tolist() == [15, 6, 3] and batch.prefix.tolist() == [1, 1, 0]
    assert batch.clean.shape == batch.corrupted.shape == (3, 15)
    for i, prompt in enumerate([IOI["clean"], SHORT["clean"], [3, 4, 5]]):
        n = int(batch.lengths[i])
        assert batch.clean[i, :n].tolist() == to_tokens(gpt2, prompt)[0].tolist()
        assert (batch.clean[i, n:] == batch.pad_id).all()
    assert batch.clean[2].tolist() == [3, 4, 5] + [0] * 12  # ids run as given: no BOS
    assert batch.mask.sum(1).tolist() == [15, 6, 3] and batch.last.tolist() == [14, 5, 2]
    mary, john, to = (encode(gpt2, w)[0] for w in (" Mary", " John", " to"))
    assert batch.answers == ((mary,), (to,), (9, 10))
    assert batch.wrong == ((john,), (mary,), (11,))
    # positions index the padded batch: +1 for the BOS the model put before the text
    assert batch.positions["IO"].tolist() == [2, -1, -1]
    assert batch.positions["S2"].tolist() == [10, -1, -1]
    assert batch.positions["END"].tolist() == [14, 5, -1]
    ids = batch.clean[0].tolist()
    assert ids[2] == batch.answers[0][0] and ids[4] == ids[10] == batch.wrong[0][0]


def test_padded_rows_give_the_unpadded_logits(gpt2, bundled):
    """Right padding leaves every real token where it was (learned and rotary positions)."""
    for model in (gpt2, bundled):
        task = Task.from_records(
            [
                dict(SHORT, answer=" the", wrong=" a"),
                {
                    "clean": "When the store went to the",
                    "corrupted": "When a store went to the",
                    "answer": " a",
                    "wrong": " the",
                },
            ]
        )
        batch = task.tokens(model)
        with torch.inference_mode():
            padded = model(batch.clean)
            for i in range(len(batch)):
                n = int(batch.lengths[i])
                alone = model(batch.clean[i : i + 1, :n])
                torch.testing.assert_close(padded[i, :n], alone[0], atol=1e-4, rtol=1e-4)


def test_the_bundled_model_gets_no_bos(bundled):
    batch = Task.from_records(
        [{"clean": "def f(a):", "corrupted": "def g(a):", "answer": "\n", "positions": {"END": -1}}]
    ).tokens(bundled)
    assert batch.prefix.tolist() == [0] and batch.wrong is None
    assert batch.clean[0].tolist() == to_tokens(bundled, "def f(a):")[0].tolist()
    assert batch.positions["END"].tolist() == [int(batch.lengths[0]) - 1]


def test_select_trims_padding(gpt2):
    batch = _mixed().tokens(gpt2)
    part = batch.select([2, 1])
    assert part.clean.shape == (2, 6) and part.lengths.tolist() == [3, 6]
    assert part.answers == (batch.answers[2], batch.answers[1])
    assert part.positions["END"].tolist() == [-1, 5]
    assert batch.select(slice(0, 1)).clean.shape == (1, 15)
    with pytest.raises(ValueError, match="select at least one of the 3 rows"):
        batch.select([])
    moved = batch.to("cpu")
    assert torch.equal(moved.clean, batch.clean) and moved.answers == batch.answers


# ---- metrics ---------------------------------------------------------------------------------

LOGITS = torch.tensor(
    [
        [[0.0, 0.0, 0.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0, 9.0], [1.0, 2.0, 0.5, -1.0, 3.0]],
        [[0.3, -0.2, 1.5, 0.7, 2.0], [4.0, 4.0, 4.0, 4.0, 4.0], [0.0, 0.0, 0.0, 0.0, 0.0]],
    ]
)  # [batch 2, pos 3, d_vocab 5]; row 0 is read at pos 2, row 1 (length 2) at pos 0


def _p(row: list[float], token: int) -> float:
    return math.exp(row[token]) / sum(math.exp(x) for x in row)


def test_list_metrics_match_a_hand_computation():
    answers, wrong, lengths = [[1], [0, 2]], [[4], [3, 4, 1]], torch.tensor([3, 1])
    r0, r1 = LOGITS[0, 2].tolist(), LOGITS[1, 0].tolist()
    logit = task_logit_diff(LOGITS, answers, wrong, lengths=lengths)
    hand = [
        r0[1] - r0[4],  # one token each side: the plain logit difference, 2.0 - 3.0
        math.log(_p(r1, 0) + _p(r1, 2)) - math.log(_p(r1, 3) + _p(r1, 4) + _p(r1, 1)),
    ]
    assert logit.tolist() == pytest.approx(hand, abs=ATOL)
    prob = task_prob_diff(LOGITS, answers, wrong, lengths=lengths)
    hand = [_p(r0, 1) - _p(r0, 4), _p(r1, 0) + _p(r1, 2) - _p(r1, 3) - _p(r1, 4) - _p(r1, 1)]
    assert prob.tolist() == pytest.approx(hand, abs=ATOL)
    # without wrong answers: the answers' log-sum-exp of logits, and their probability
    alone = task_logit_diff(LOGITS, answers, lengths=lengths)
    assert alone.tolist() == pytest.approx(
        [r0[1], math.log(math.exp(r1[0]) + math.exp(r1[2]))], abs=ATOL
    )
    prob = task_prob_diff(LOGITS, answers, lengths=lengths)
    assert prob.tolist() == pytest.approx([_p(r0, 1), _p(r1, 0) + _p(r1, 2)], abs=ATOL)


def test_metrics_read_the_last_real_token():
    assert torch.equal(last_logits(LOGITS), LOGITS[:, -1])
    assert torch.equal(last_logits(LOGITS, torch.tensor([2, 1])), LOGITS[[0, 1], [1, 0]])
    assert torch.equal(last_logits(LOGITS[:, 0]), LOGITS[:, 0])
    with pytest.raises(ValueError, match="lengths must lie in"):
        last_logits(LOGITS, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="one token set per row"):
        task_logit_diff(LOGITS, [[1]])


def test_task_tokens_metrics_are_the_functions(gpt2):
    batch = _mixed().tokens(gpt2)
    logits = torch.randn(3, batch.clean.shape[1], gpt2.cfg.d_vocab, requires_grad=True)
    expected = task_logit_diff(logits, batch.answers, batch.wrong, lengths=batch.lengths)
    assert torch.equal(batch.logit_diff(logits), expected)
    assert torch.equal(
        batch.prob_diff(logits),
        task_prob_diff(logits, batch.answers, batch.wrong, lengths=batch.lengths),
    )
    metric = batch.metric("prob_diff")
    assert metric.name == "prob_diff" and "3 rows" in repr(metric)
    batch.logit_diff(logits).sum().backward()  # gradient methods can use it
    assert logits.grad[0, 14].abs().sum() > 0 and logits.grad[0, 13].abs().sum() == 0
    with pytest.raises(ValueError, match="kind must be one of logit_diff, prob_diff"):
        batch.metric("loss")
