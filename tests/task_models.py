"""A GPT-2-shaped test model whose tokenizer splits like GPT-2's on the task generators' words.

There is no GPT-2 tokenizer offline, so this builds a byte-level BPE by hand: GPT-2's
pre-tokenizer and byte alphabet, plus merges that make each given word one token. Names and
template words get their leading space (``" Mary"``, ``" went"``), every two-digit string
``"00"``-``"99"`` is one token and ``" 17"`` is one token, so ``" 1732"`` tokenises as
``" 17"`` + ``"32"`` exactly as GPT-2's does. Anything else still tokenises, byte by byte.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from interp import load_model
from interp.tasks import Task
from interp.tasks.words import IOI_TEMPLATES, NAMES, NOUNS, OBJECTS, PLACES
from tests.checkpoints import SPECIAL, make_checkpoint

_BYTES = pre_tokenizers.ByteLevel.alphabet()

# rows the task tests share: an IOI pair (ABC corruption) and a short pair
IOI = {
    "clean": "When Mary and John went to the store, John gave a drink to",
    "corrupted": "When Alice and Eric went to the store, Tom gave a drink to",
    "answer": " Mary",
    "wrong": " John",
    "positions": {"IO": 1, "S1": 3, "S2": 9, "END": -1},
}
SHORT = {
    "clean": "When Mary and John went",
    "corrupted": "When Alice and Eric went",
    "answer": " to",
    "wrong": " Mary",
}


def _byte_form(word: str) -> str:
    """GPT-2's byte-level spelling: a leading space is ``Ġ``."""
    return word.replace(" ", "Ġ")


def task_words(names=NAMES) -> list[str]:
    """Every word the generators' templates and slots use, as GPT-2 would see it."""
    words = {" " + n for n in names} | {" " + w for w in PLACES + OBJECTS + NOUNS}
    for template in IOI_TEMPLATES:
        text = re.sub(r"\{\w+\}", "", template)
        words |= set(re.findall(r" ?[A-Za-z]+", text))
    words |= {" lasted", " from", " the", " year", " to", "The", " 17"}
    return sorted(words)


def gpt2_like_tokenizer(words: list[str], *, digits: bool = True) -> PreTrainedTokenizerFast:
    """A byte-level BPE in which each of ``words`` (and, with ``digits``, every two-digit
    string) is one token; ``<|endoftext|>`` is id 0, BOS, EOS and UNK."""
    vocab = {SPECIAL: 0}
    for char in sorted(_BYTES):
        vocab[char] = len(vocab)
    spaced, plain = [], []
    for word in words:
        (spaced if word.startswith(" ") else plain).append(_byte_form(word))
    if digits:
        plain += [f"{i:02d}" for i in range(100)]
    merges = []
    # words with a leading space merge first, so " 1732" becomes " 17" before "73" can form
    for form in spaced + plain:
        for end in range(2, len(form) + 1):
            if form[:end] not in vocab:
                vocab[form[:end]] = len(vocab)
                merges.append((form[: end - 1], form[end - 1]))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=SPECIAL, eos_token=SPECIAL, unk_token=SPECIAL
    )
    for word in words:
        assert len(fast.encode(word)) == 1, (word, fast.tokenize(word))
    return fast


def gpt2_like_model(directory: Path, *, names=NAMES, digits: bool = True):
    """A 2-layer GPT-2 (BOS prepended, learned positions) with :func:`gpt2_like_tokenizer`."""
    tokenizer = gpt2_like_tokenizer(task_words(names), digits=digits)
    make_checkpoint(directory, arch="gpt2", n_ctx=128, with_tokenizer=False, d_vocab=len(tokenizer))
    tokenizer.save_pretrained(directory)
    return load_model(directory, device="cpu")


def word_level_model(directory: Path, words: list[str]):
    """A GPT-2 whose tokenizer knows only ``words`` (split on whitespace) and
    ``<|endoftext|>``: too few tokens for the generators, which must refuse."""
    vocab = {SPECIAL: 0} | {w: i + 1 for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins with spaces, like WhitespaceSplit
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=SPECIAL, eos_token=SPECIAL, unk_token=SPECIAL
    )
    make_checkpoint(directory, arch="gpt2", n_ctx=32, with_tokenizer=False)
    tokenizer.save_pretrained(directory)
    return load_model(directory, device="cpu")


def random_id_task(lengths, *, seed: int = 0, vocab: int = 300, corrupt: int = 2) -> Task:
    """Rows of random token ids of ``lengths`` (no BOS: a row means the same alone and in a
    batch); each corrupted row redraws its first ``corrupt`` tokens; each row its own answer
    and wrong token. The engine's tests share it."""
    gen = torch.Generator().manual_seed(seed)
    records = []
    for n in lengths:
        clean = torch.randint(1, vocab, (n,), generator=gen)
        corrupted = clean.clone()
        corrupted[:corrupt] = torch.randint(1, vocab, (corrupt,), generator=gen)
        answer, wrong = (int(t) + 1 for t in torch.randperm(vocab - 1, generator=gen)[:2])
        records.append(
            {"clean": clean.tolist(), "corrupted": corrupted.tolist(), "answer": answer}
            | {"wrong": wrong}
        )
    return Task.from_records(records)
