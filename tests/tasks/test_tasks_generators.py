"""interp.tasks generators: induction, IOI and greater-than on three tokenizers.

- GPT-2-like (tests/task_models.py): names, template words and two-digit years are one token,
  " 1732" is " 17" + "32" as in GPT-2; every generator works.
- the bundled model's: no single-token names (IOI refuses unless given names it has), a few
  two-digit tokens (greater-than uses only those years).
- a word-level tokenizer of nine words: every generator refuses, saying found vs needed.
"""

from __future__ import annotations

import pytest

from interp import load_model
from interp.tasks import Task, TaskError, greater_than, induction, ioi
from interp.tasks.tokens import encode
from interp.tasks.words import IOI_TEMPLATES, ordinary_ids
from tests.task_models import gpt2_like_model, word_level_model


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    return gpt2_like_model(tmp_path_factory.mktemp("gpt2-like"))


@pytest.fixture(scope="module")
def bundled():
    return load_model("tiny-induction")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return word_level_model(
        tmp_path_factory.mktemp("words"), "the cat sat on a mat dog ran far".split()
    )


def _id(model, word: str) -> int:
    (token,) = encode(model, word)
    return token


@pytest.mark.parametrize("name", ["gpt2", "bundled"])
def test_induction_rows_repeat_and_corrupt(name, request):
    model = request.getfixturevalue(name)
    task = induction(model, 6, seed=3, seq_len=5)
    bos = [0] if name == "gpt2" else []  # the bundled model runs without BOS
    pool = set(ordinary_ids(model))
    assert len(task) == 6 and not task.has_wrong
    for row in task:
        clean, corrupted = list(row.clean), list(row.corrupted)
        a, b = clean[len(bos) : len(bos) + 5], corrupted[len(bos) : len(bos) + 5]
        assert clean == bos + a + a[:-1] and corrupted == bos + b + a[:-1]
        assert len(set(a + b)) == 10 and set(a + b) <= pool  # distinct; b shares nothing
        assert row.answer == a[-1] and row.meta == {"seq_len": 5}
        pos = row.positions
        assert clean[pos["B"]] == row.answer and clean[pos["A"]] == clean[pos["END"]]
        assert pos["END"] == len(clean) - 1
    batch = task.tokens(model)
    assert batch.prefix.tolist() == [0] * 6  # ids are run as given
    assert batch.clean.shape == (6, len(bos) + 9)


def test_ioi_rows(gpt2):
    task = ioi(gpt2, 8, seed=1)
    assert [r.meta["pattern"] for r in task] == ["ABBA", "BABA"] * 4
    batch = task.tokens(gpt2)
    for i, row in enumerate(task):
        io, s = row.answer, row.wrong
        first, second = (io, s) if row.meta["pattern"] == "ABBA" else (s, io)
        assert row.clean.startswith(IOI_TEMPLATES[row.meta["template"]].split("{A}")[0])
        assert f"{first} and{second}" in row.clean and row.clean.endswith(" to")
        own = encode(gpt2, row.clean)
        pos = row.positions
        assert own[pos["IO"]] == _id(gpt2, io)
        assert own[pos["S1"]] == own[pos["S2"]] == _id(gpt2, s)
        assert pos["S1"] < pos["S2"] and pos["END"] == len(own) - 1
        assert (pos["IO"] < pos["S1"]) == (row.meta["pattern"] == "ABBA")
        # ABC: three fresh names where IO, S1 and S2 were; the subject is not repeated
        corrupted = encode(gpt2, row.corrupted)
        names = [corrupted[pos[k]] for k in ("IO", "S1", "S2")]
        assert len(set(names)) == 3 and not set(names) & {_id(gpt2, io), _id(gpt2, s)}
        assert [t for j, t in enumerate(corrupted) if j not in pos.values()] == [
            t for j, t in enumerate(own) if j not in pos.values()
        ]
        assert batch.positions["IO"][i] == pos["IO"] + 1  # BOS
        assert batch.answers[i] == (_id(gpt2, io),) and batch.wrong[i] == (_id(gpt2, s),)


def test_ioi_refuses_a_tokenizer_without_names(bundled, tiny):
    for model in (bundled, tiny):
        with pytest.raises(TaskError) as exc:
            ioi(model, 4)
        assert str(exc.value).startswith(
            "ioi needs 5 or more names that are one token with a leading space (of 62 "
            "candidates); this model's tokenizer has 0."
        )
        assert "names=" in str(exc.value)


def test_ioi_uses_the_names_it_is_given(bundled):
    names = ["self", "file", "data", "list", "name", "key", "node", "the", "to"]
    task = ioi(bundled, 12, names=names)  # " the" and " to" are template words: left out
    assert {r.answer for r in task} | {r.wrong for r in task} <= {" " + n for n in names[:-2]}
    task.tokens(bundled)
    with pytest.raises(TaskError, match=r"of 5 candidates\); this model's tokenizer has 4\."):
        ioi(bundled, 4, names=["self", "file", "data", "list", "Mary"])


def test_greater_than_rows(gpt2):
    task = greater_than(gpt2, 6, seed=2)
    batch = task.tokens(gpt2)
    for i, row in enumerate(task):
        yy = row.meta["year"]
        assert 2 <= yy <= 98 and f"year 17{yy:02d} to the year 17" in row.clean
        assert row.corrupted == row.clean.replace(f"17{yy:02d}", "1701")
        assert row.answer == tuple(f"{v:02d}" for v in range(yy + 1, 100))
        assert row.wrong == tuple(f"{v:02d}" for v in range(yy + 1))
        own = encode(gpt2, row.clean)
        assert own[row.positions["YY"]] == _id(gpt2, f"{yy:02d}")
        assert own[row.positions["YY"] - 1] == _id(gpt2, " 17")
        assert len(batch.answers[i]) + len(batch.wrong[i]) == 100


def test_greater_than_uses_only_the_years_a_tokenizer_has(bundled):
    digits = {f"{v:02d}" for v in range(100) if len(encode(bundled, f"{v:02d}")) == 1}
    assert 10 < len(digits) < 100  # the bundled vocabulary has some, not all
    task = greater_than(bundled, 5)
    for row in task:
        assert f"{row.meta['year']:02d}" in digits
        assert set(row.answer) | set(row.wrong) == digits
    task.tokens(bundled)


def test_greater_than_refuses_a_tokenizer_without_years(tiny):
    with pytest.raises(TaskError) as exc:
        greater_than(tiny, 3)
    assert str(exc.value).startswith(
        "greater_than needs 1 or more years YY in 02-98 that tokenise as ' 17' + 'YY' (of 97 "
        "candidates); this model's tokenizer has 0."
    )


def test_induction_refuses_too_few_tokens(tiny):
    with pytest.raises(TaskError, match=r"needs 10 or more distinct tokens .* has 9\."):
        induction(tiny, 2, seq_len=5)
    assert len(induction(tiny, 2, seq_len=4)) == 2
    with pytest.raises(ValueError, match="context is 32"):
        induction(tiny, 2, seq_len=20)


@pytest.mark.parametrize("generate", [induction, ioi, greater_than])
def test_generators_are_deterministic_by_seed(generate, gpt2, tmp_path):
    first = generate(gpt2, 6, seed=0)
    assert generate(gpt2, 6, seed=0) == first
    assert generate(gpt2, 6, seed=1) != first
    assert generate(gpt2, 3, seed=0) == first[:3]  # more rows extend, they do not reshuffle
    assert Task.from_jsonl(first.to_jsonl(tmp_path / "t.jsonl", model=gpt2)) == first
    assert Task.from_csv(first.to_csv(tmp_path / "t.csv", model=gpt2)) == first


@pytest.mark.parametrize("n", [0, -1, 2.0, True])
def test_generators_refuse_a_bad_n(n, gpt2):
    with pytest.raises(ValueError, match="n must be a positive number of rows"):
        ioi(gpt2, n)
