"""Induction-head detection: targets, fast path vs dense reference, TransformerLens agreement,
fixed-offset heads told apart, determinism, and the command's files."""

from __future__ import annotations

import random

import pandas as pd
import pytest
import torch
from transformer_lens.head_detector import detect_head

from interp import load_model
from interp.engine import run_cached
from interp.induction import (
    RepeatedTokens,
    detect_induction_heads,
    ordinary_token_ids,
    repeated_tokens,
    run_induction_scan,
    scan_heads,
)
from interp.induction.scores import scores_from_patterns
from tests.checkpoints import make_checkpoint

ATOL = 1e-5  # float32 attention weights, sums of at most a few hundred terms

# a made-up vocabulary of words, so that random word tokens decode to text that re-encodes to
# the same ids: TransformerLens's detect_head takes text
_WORDS = [
    " " + "".join(random.Random(i).choices("bcdfghjklmnpqrstvwz", k=3)) + "a" for i in range(300)
]


@pytest.fixture(scope="module")
def word_model(tmp_path_factory):
    directory = make_checkpoint(
        tmp_path_factory.mktemp("words"),
        arch="gpt2",
        n_ctx=128,
        vocab_size=600,
        corpus=["".join(_WORDS)] * 3,
    )
    return load_model(directory, device="cpu")


def _batch(model, seq_lens=(5, 8, 12), batch_size=2, seed=0) -> RepeatedTokens:
    vocab = ordinary_token_ids(model.tokenizer, model.cfg.d_vocab)
    return repeated_tokens(
        vocab,
        seq_lens=seq_lens,
        batch_size=batch_size,
        bos_id=model.tokenizer.bos_token_id,
        seed=seed,
    )


def test_targets_point_where_they_claim(gpt2_model):
    batch = _batch(gpt2_model)
    tokens = batch.tokens
    b, q, k = batch.targets("induction")
    assert len(b) == int(batch.seq_lens.sum())  # one target per query of every second copy
    assert torch.equal(tokens[b, k - 1], tokens[b, q]) and bool((k <= q).all())
    b, q, k = batch.targets("duplicate")
    assert torch.equal(tokens[b, k], tokens[b, q]) and bool((k < q).all())
    b, q, k = batch.targets("previous")
    assert torch.equal(k, q - 1)
    b, q, k = batch.targets("control")
    # filler tokens have no earlier copy at all
    for row, pos in zip(b.tolist(), q.tolist(), strict=True):
        assert tokens[row, pos] not in tokens[row, :pos]
    assert tokens[:, 0].eq(gpt2_model.tokenizer.bos_token_id).all()


def test_rows_draw_distinct_ordinary_tokens(word_model):
    vocab = ordinary_token_ids(word_model.tokenizer, word_model.cfg.d_vocab)
    assert len(vocab) >= 64
    assert word_model.tokenizer.bos_token_id not in vocab.tolist()
    batch = _batch(word_model, seq_lens=(10, 20))
    for row, seq_len in zip(batch.tokens, batch.seq_lens.tolist(), strict=True):
        body = row[1:]
        assert len(set(body.tolist())) == len(body) - seq_len  # only the repeat repeats


def test_fast_scan_equals_dense_reference(gpt2_model):
    batch = _batch(gpt2_model)
    fast = scan_heads(gpt2_model, batch)
    patterns = run_cached(gpt2_model, batch.tokens, patterns=True).patterns()
    dense = scores_from_patterns(patterns, batch)
    for kind, expected in dense.items():
        assert torch.allclose(fast.scores[kind], expected, atol=ATOL), kind


def test_scores_match_transformer_lens_detect_head(word_model):
    """TL scores attention on the template divided by all query rows; ours averages over the
    rows that have a target. Per row: TL = ours * n_targets / n_pos, exactly."""
    batch = _batch(word_model, seq_lens=(6, 10), batch_size=2)
    tl_names = {
        "induction": "induction_head",
        "duplicate": "duplicate_token_head",
        "previous": "previous_token_head",
    }
    for row in range(len(batch.tokens)):
        single = RepeatedTokens(batch.tokens[row : row + 1], batch.seq_lens[row : row + 1])
        text = word_model.tokenizer.decode(single.tokens[0, 1:])
        assert torch.equal(word_model.to_tokens(text)[0].cpu(), single.tokens[0])
        ours = scan_heads(word_model, single).scores
        n_pos = single.tokens.shape[1]
        for kind, name in tl_names.items():
            n_targets = len(single.targets(kind)[0])
            theirs = detect_head(word_model, text, name)
            assert torch.allclose(theirs, ours[kind] * n_targets / n_pos, atol=ATOL), kind


def test_rankings_agree_with_detect_head(word_model):
    batch = _batch(word_model, seq_lens=(10,), batch_size=3)
    table = detect_induction_heads(
        word_model, seq_lens=(10,), batch_size=3, ablate=False, copying=False
    )
    texts = [word_model.tokenizer.decode(row[1:]) for row in batch.tokens]
    theirs = detect_head(word_model, texts, "induction_head")  # [layer head], mean over rows
    theirs = pd.Series(theirs.flatten().numpy(), name="tl")
    ours = table.sort_values(["layer", "head"])["induction_score"].reset_index(drop=True)
    assert ours.rank().tolist() == theirs.rank().tolist()


def _synthetic_patterns(batch: RepeatedTokens, fixed_offset: int) -> torch.Tensor:
    """Head 0: a perfect induction head. Head 1: attends ``fixed_offset`` back. Else BOS."""
    n_rows, n_pos = batch.tokens.shape
    pattern = torch.zeros(1, n_rows, 2, n_pos, n_pos)
    pattern[..., 0] = 1.0  # BOS by default
    b, q, k = batch.targets("induction")
    pattern[0, b, 0, q, :] = 0.0
    pattern[0, b, 0, q, k] = 1.0
    q = torch.arange(fixed_offset, n_pos)
    pattern[0, :, 1, q, :] = 0.0
    pattern[0, :, 1, q, q - fixed_offset] = 1.0
    return pattern


def test_fixed_offset_head_is_told_apart_from_induction(gpt2_model):
    batch = _batch(gpt2_model, seq_lens=(5, 8, 12), batch_size=2)
    scores = scores_from_patterns(_synthetic_patterns(batch, fixed_offset=7), batch)
    induction, offset = 0, 1
    assert scores["induction"][0, induction] == pytest.approx(1.0)
    assert scores["control"][0, induction] == pytest.approx(0.0)
    # the offset head matches the induction target only at repeat length 8 ...
    assert 0.0 < scores["induction"][0, offset] < 0.5
    # ... and attends the same offset on fresh tokens, where no earlier copy exists
    assert scores["control"][0, offset] > 0.2


def test_same_seed_same_csv_bytes(gpt2_model):
    from interp.pages.induction import table_csv

    def once(seed):
        return table_csv(
            detect_induction_heads(gpt2_model, seq_lens=(5, 10), seed=seed, ablate=2, copying=False)
        )

    assert once(3) == once(3)
    assert once(3) != once(4)


def test_table_columns_and_undefined_values(gpt2_model):
    table = detect_induction_heads(gpt2_model, seq_lens=(5,), ablate=1, copying=False)
    assert list(table.columns[:8]) == [
        "layer",
        "head",
        "induction_score",
        "prev_token_score",
        "duplicate_token_score",
        "copying_score",
        "ablation_loss_increase",
        "is_induction",
    ]
    assert len(table) == gpt2_model.cfg.n_layers * gpt2_model.cfg.n_heads
    assert table["ablation_loss_increase"].notna().sum() == 1  # only what was measured
    assert table["offset_control_score"].isna().all()  # one length: no filler, undefined
    assert table["copying_score"].isna().all()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"seq_lens": (40,)}, "context"),
        ({"seq_lens": (1,)}, "at least 2"),
        ({"batch_size": 0, "seq_lens": (5,)}, "batch_size"),
    ],
)
def test_bad_settings(gpt2_model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        run_induction_scan(gpt2_model, ablate=False, copying=False, **kwargs)


def test_bundled_model_induction_heads_are_found():
    """The shipped model's circuit, found by the detector: induction heads in layer 1 that
    survive every check, fed by a previous-token head in layer 0 whose ablation breaks them."""
    model = load_model("tiny-induction", device="cpu")
    result = run_induction_scan(model, seed=0, ablate=True)
    table = result.table
    found = table[table["is_induction"]]
    assert len(found) >= 1 and set(found["layer"]) == {1}
    assert found["induction_score_min"].max() >= 0.7
    assert (found["copying_score"] > 0).all()
    assert result.loss_repeated_half <= 0.25 * result.loss_first_half
    prev = table.sort_values("prev_token_score").iloc[-1]
    assert prev["layer"] == 0 and prev["prev_token_score"] >= 0.5
    # without the previous-token head the repeat is no longer predicted
    gain = result.loss_first_half - result.loss_repeated_half
    assert prev["ablation_loss_increase"] >= 0.5 * gain
