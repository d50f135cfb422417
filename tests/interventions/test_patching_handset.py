"""A checkpoint whose circuit is set by hand: only head 1.2 writes to the residual stream, so
only it can move information between positions, and patching must find exactly that: on one
pair, and on every row of a task."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2LMHeadModel

from interp import load_model
from interp.interventions import logit_diff, patch_activations
from interp.tasks import Task
from tests.checkpoints import make_checkpoint

EXACT = 1e-5  # float32; the answers below hold exactly in real arithmetic
ONLY = (1, 2)  # the one head whose output projection is left non-zero


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    directory = make_checkpoint(tmp_path_factory.mktemp("handset"), arch="gpt2", seed=1)
    hf = GPT2LMHeadModel.from_pretrained(directory)
    d_head = hf.config.n_embd // hf.config.n_head
    with torch.no_grad():
        for layer, block in enumerate(hf.transformer.h):
            for head in range(hf.config.n_head):
                rows = slice(head * d_head, (head + 1) * d_head)  # c_proj rows reading its z
                # zero: the head writes nothing; x30: a random head's write, made visible
                block.attn.c_proj.weight[rows] *= 30 if (layer, head) == ONLY else 0
    hf.save_pretrained(directory)
    return load_model(directory, device="cpu")


def test_patching_finds_the_hand_set_head_and_position(model):
    clean = model.to_tokens("The cat sat on the mat. The dog sat on the")
    corrupted = clean.clone()
    corrupted[0, 2] = 77  # only position 2 differs; the metric reads the last position
    frame = patch_activations(
        model, clean, corrupted, logit_diff(5, 9), sites=["heads", "resid_pre"]
    )
    assert abs(frame.attrs["clean_metric"] - frame.attrs["corrupted_metric"]) > 1e-3
    heads = frame[frame["site"] == "head"].set_index(["layer", "head"])["recovered"]
    assert abs(heads.loc[ONLY] - 1) <= EXACT  # its clean output at the last position is all
    assert heads.drop(index=ONLY).abs().max() <= EXACT  # zero W_O: patching changes nothing
    resid = frame[frame["site"] == "resid_pre"].set_index(["layer", "pos"])["recovered"]
    for layer in (0, 1):
        assert abs(resid.loc[(layer, 2)] - 1) <= EXACT
        last = len(clean[0]) - 1
        others = [p for p in range(len(clean[0])) if p not in (2, last)]
        assert resid.loc[[(layer, p) for p in others]].abs().max() <= EXACT


def test_over_a_task_the_hand_set_head_recovers_everything_on_every_row(model):
    """Rows of different lengths (right-padded), each corrupted at one position before its last
    and read with its own answer: per row, head 1.2 recovers exactly 1, every other head 0."""
    texts = [
        ("The cat sat on the mat. The dog sat on the", 2),
        ("A dog ran to the park and back", 3),
        ("The mat. The cat", 1),
        ("On the mat the cat sat, and the dog sat on it too", 5),
    ]
    records = []
    for text, position in texts:
        clean = model.to_tokens(text)[0]
        corrupted = clean.clone()
        corrupted[position] = 77 if int(clean[position]) != 77 else 78
        with torch.inference_mode():  # each row's own answer and wrong: the tokens the
            moved = model(clean[None])[0, -1] - model(corrupted[None])[0, -1]  # corruption
        answer, wrong = int(moved.argmax()), int(moved.argmin())  # moves most, apart
        records.append(
            {"clean": clean.tolist(), "corrupted": corrupted.tolist(), "answer": answer}
            | {"wrong": wrong}
        )
    task = Task.from_records(records)
    assert len({len(r["clean"]) for r in records}) == len(records)  # really padded
    assert len({r["answer"] for r in records}) > 1  # rows read different answers
    rows = patch_activations(model, task, sites=["heads"], per_row=True)
    gaps = [
        abs(c - k)
        for c, k in zip(
            rows.attrs["clean_metric_rows"], rows.attrs["corrupted_metric_rows"], strict=True
        )
    ]
    assert min(gaps) > 1e-3  # as the single-pair test above: a gap recovered can divide by
    for i in range(len(records)):
        heads = rows[rows["row"] == i].set_index(["layer", "head"])["recovered"]
        assert len(heads) == model.cfg.n_layers * model.cfg.n_heads
        assert abs(heads.loc[ONLY] - 1) <= EXACT, i
        assert heads.drop(index=ONLY).abs().max() <= EXACT, i
    means = patch_activations(model, task, sites=["heads"]).set_index(["layer", "head"])
    assert abs(means["recovered"].loc[ONLY] - 1) <= EXACT  # from the dataset means too
    assert means["recovered"].drop(index=ONLY).abs().max() <= EXACT
