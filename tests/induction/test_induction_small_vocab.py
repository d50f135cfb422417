"""The induction scan on small vocabularies, short contexts and models without BOS.

Repeat lengths are chosen to fit (distinct ordinary tokens per row, and the context) when the
defaults do not, the choice and its reason are recorded, and the scan refuses only when no
length >= 4 fits. Scores are checked against the dense reference on transformers' patterns.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from interp import load_model
from interp.cli import main
from interp.induction import DEFAULT_SEQ_LENS, run_induction_scan
from interp.induction.batches import MIN_SEQ_LEN, choose_seq_lens, distinct_tokens_needed
from interp.induction.scores import scores_from_patterns
from tests.zoo import make_toy_checkpoint

ATOL = 1e-5  # float32 attention weights


def _fits(lens, n_ctx, n_vocab, prefix=1):
    return prefix + 2 * max(lens) <= n_ctx and distinct_tokens_needed(lens) <= n_vocab


def test_defaults_kept_when_they_fit():
    assert choose_seq_lens(DEFAULT_SEQ_LENS, n_ctx=1024, n_vocab=50000) == ([10, 20, 40], None)


@pytest.mark.parametrize(
    "n_ctx, n_vocab, word",
    [
        (64, 50000, "context"),
        (1024, 38, "vocabulary"),
        (1024, 12, "vocabulary"),
        (20, 1000, "context"),
        (1024, 5, "vocabulary"),
        (9, 1000, "context"),
    ],
)
def test_chosen_lengths_fit_and_say_why(n_ctx, n_vocab, word):
    lens, why = choose_seq_lens(DEFAULT_SEQ_LENS, n_ctx=n_ctx, n_vocab=n_vocab)
    assert _fits(lens, n_ctx, n_vocab) and min(lens) >= MIN_SEQ_LEN
    assert word in why and str(n_ctx if word == "context" else n_vocab) in why


def test_chosen_longest_is_maximal_when_the_defaults_cannot_be_kept():
    # the fallback is the family L/4, L/2, L (each >= 4); brute force: no longer L of it fits
    def family(longest):
        return sorted({max(MIN_SEQ_LEN, longest // 4), max(MIN_SEQ_LEN, longest // 2), longest})

    for n_ctx, n_vocab in [(1024, 12), (1024, 5), (9, 1000), (20, 1000), (30, 1000)]:
        lens, why = choose_seq_lens(DEFAULT_SEQ_LENS, n_ctx=n_ctx, n_vocab=n_vocab)
        assert why
        best = max(n for n in range(MIN_SEQ_LEN, 200) if _fits(family(n), n_ctx, n_vocab))
        assert lens == family(best), (n_ctx, n_vocab)
        if len(lens) == 1:  # a single length only when no two lengths (one twice the other) fit
            assert not any(_fits((n, 2 * n), n_ctx, n_vocab) for n in range(MIN_SEQ_LEN, 200))


@pytest.mark.parametrize("n_ctx, n_vocab", [(8, 1000), (1024, 3)])
def test_refuses_only_when_nothing_fits(n_ctx, n_vocab):
    with pytest.raises(ValueError, match=f"no repeat length of at least {MIN_SEQ_LEN}") as info:
        choose_seq_lens(DEFAULT_SEQ_LENS, n_ctx=n_ctx, n_vocab=n_vocab)
    assert "\n" not in str(info.value)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """40-token vocabulary (38 ordinary tokens), context 128: the vocabulary is the limit."""
    directory = make_toy_checkpoint(tmp_path_factory.mktemp("small"), n_ctx=128)
    hf = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
    return directory, load_model(directory, device="cpu"), hf


def _check_against_transformers(result, hf):
    with torch.no_grad():
        patterns = torch.stack(hf(result.batch.tokens, output_attentions=True).attentions)
    want = scores_from_patterns(patterns, result.batch)
    table = result.table.sort_values(["layer", "head"])
    for kind, column in [
        ("induction", "induction_score"),
        ("previous", "prev_token_score"),
        ("duplicate", "duplicate_token_score"),
    ]:
        got = torch.tensor(table[column].values, dtype=torch.float32)
        torch.testing.assert_close(got, want[kind].flatten(), atol=ATOL, rtol=0)


def test_scan_on_a_40_token_vocabulary(small):
    _, model, hf = small
    result = run_induction_scan(model, batch_size=2, ablate=1)
    settings = result.settings
    assert settings["seq_lens"] == [10, 20] and "38" in settings["seq_lens_reason"]
    for row, seq_len in zip(result.batch.tokens, result.batch.seq_lens.tolist(), strict=True):
        body = row[1:]  # after BOS: a + a + filler, all ordinary and a's tokens distinct
        assert len(set(body[:seq_len].tolist())) == seq_len
        filler = body[2 * seq_len :]
        assert not set(filler.tolist()) & set(body[:seq_len].tolist())
    _check_against_transformers(result, hf)


def test_scan_without_bos(small):
    _, model, hf = small
    model.cfg.default_prepend_bos = False  # a model run without a BOS token
    try:
        result = run_induction_scan(model, batch_size=2, ablate=1, seq_lens=(6, 12))
    finally:
        model.cfg.default_prepend_bos = True
    assert result.batch.prefix == 0 and result.settings["bos_token_id"] is None
    assert not (result.batch.tokens[:, 0] == model.tokenizer.bos_token_id).any()
    b, q, k = result.batch.targets("induction")
    assert torch.equal(result.batch.tokens[b, k - 1], result.batch.tokens[b, q])
    assert len(b) == int(result.batch.seq_lens.sum())
    _check_against_transformers(result, hf)
    from interp.pages.induction import build_report

    page = build_report(model, result, "toy").to_html()
    assert "a + a (no BOS)" in page
    assert "random tokens repeated once (no BOS)" in page and "one row of BOS" not in page


def test_attention_view_without_bos_shows_the_two_copies_only(small, monkeypatch):
    _, model, _ = small
    from interp.pages import induction as induction_report

    shown = []
    real = induction_report.run_cached
    monkeypatch.setattr(
        induction_report,
        "run_cached",
        lambda m, tokens, **kw: shown.append(tokens) or real(m, tokens, **kw),
    )
    model.cfg.default_prepend_bos = False
    try:
        result = run_induction_scan(model, batch_size=2, ablate=1, seq_lens=(6, 12))
        induction_report.build_report(model, result, "toy")
    finally:
        model.cfg.default_prepend_bos = True
    assert shown and all(len(tokens) == 2 * 6 for tokens in shown)  # a + a, no filler token


def test_cli_defaults_on_a_40_token_vocabulary(small, tmp_path, capsys):
    directory, _, _ = small
    assert (
        main(
            [
                "induction",
                "--model",
                str(directory),
                "--out",
                str(tmp_path),
                "--batch-size",
                "2",
                "--ablate-top",
                "1",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "do not fit" in err and "[10, 20]" in err
    settings = json.loads((tmp_path / "head_scores.json").read_text())["settings"]
    assert settings["seq_lens"] == [10, 20] and settings["seq_lens_reason"]
    assert "do not fit" in (tmp_path / "report.html").read_text()


def test_given_lengths_that_do_not_fit_are_refused(small):
    _, model, _ = small
    with pytest.raises(ValueError, match="distinct ordinary tokens"):
        run_induction_scan(model, seq_lens=(10, 40), ablate=False, copying=False)
