"""What the generators may use: words that are one token for a model, and the word lists.

A generated prompt pair must tokenise to equal lengths, and its answers must be one token,
so the generators only put in the slots that vary (names, years, random tokens) words that the
model's tokenizer keeps as one token, leading space included (``" Mary"``). The fixed text of a
template may tokenise any way: both prompts of a pair share it.
"""

from __future__ import annotations

from collections.abc import Sequence

from interp.engine import to_tokens
from interp.tasks.rows import TaskError

__all__ = [
    "NAMES",
    "PLACES",
    "OBJECTS",
    "NOUNS",
    "IOI_TEMPLATES",
    "single_tokens",
    "ordinary_ids",
    "bos_prefix",
    "need",
]

# fmt: off

# first names from the IOI paper's list; each is used as " Name", after a space
NAMES = (
    "Aaron", "Adam", "Alan", "Alex", "Alice", "Amy", "Andrew", "Anna", "Anthony", "Arthur",
    "Austin", "Brian", "Charles", "Charlie", "Daniel", "David", "Dean", "Edward", "Emily",
    "Eric", "Eva", "Frank", "George", "Grace", "Henry", "Ian", "Jack", "Jacob", "James",
    "Jane", "Jason", "Jennifer", "Jessica", "John", "Joseph", "Justin", "Kate", "Kevin", "Kyle",
    "Laura", "Lisa", "Luke", "Maria", "Mark", "Martin", "Mary", "Max", "Michael", "Paul",
    "Peter", "Rachel", "Richard", "Robert", "Rose", "Ryan", "Sarah", "Scott", "Simon",
    "Thomas", "Tom", "Victoria", "William",
)
# IOI's places: free text in the template, so any tokenisation will do
PLACES = ("store", "garden", "restaurant", "school", "hospital", "office", "house", "station")
# IOI's objects: free text as well
OBJECTS = ("ring", "kiss", "bone", "basketball", "computer", "necklace", "drink", "snack")
# greater-than's events (Hanna et al. 2023): "The {noun} lasted from the year 17YY to ..."
NOUNS = ("war", "expedition", "voyage", "campaign", "pilgrimage", "reign", "project",
         "occupation", "dynasty", "contract", "tour", "operation")
# fmt: on

# IOI templates (Wang et al. 2022): {A} and {B} are IO and S in either order, {S} the repeat
IOI_TEMPLATES = (
    "When {A} and {B} went to the {place}, {S} gave a {object} to",
    "Then, {A} and {B} went to the {place}. {S} gave a {object} to",
    "Then, {A} and {B} had a lot of fun at the {place}. {S} gave a {object} to",
    "Then, {A} and {B} were working at the {place}. {S} decided to give a {object} to",
    "After {A} and {B} went to the {place}, {S} gave a {object} to",
    "While {A} and {B} were working at the {place}, {S} gave a {object} to",
    "When {A} and {B} got a {object} at the {place}, {S} decided to give it to",
    "Then, {A} and {B} had a long argument, and afterwards {S} said to",
)


def _encode_all(model, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text alone (no BOS), in one tokenizer call."""
    if getattr(model, "tokenizer", None) is None:
        raise TaskError("this model has no tokenizer; the task generators need one")
    if not texts:
        return []
    # model.to_tokens pads a batch; the tokenizer itself gives each text's own ids
    out = model.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    return [list(ids) for ids in out]


def single_tokens(model, words: Sequence[str]) -> dict[str, int]:
    """The words (as given, e.g. ``" Mary"``) that are one token for ``model``, with their ids.

    A special token (the unknown token a word-level tokenizer gives an unknown word) does not
    count, nor does a second word with the same id.
    """
    special = set(getattr(model.tokenizer, "all_special_ids", []) or [])
    found: dict[str, int] = {}
    for word, ids in zip(words, _encode_all(model, words), strict=True):
        if (
            len(ids) == 1
            and ids[0] not in special
            and ids[0] < int(model.cfg.d_vocab)
            and ids[0] not in found.values()
        ):
            found[word] = ids[0]
    return found


def ordinary_ids(model) -> list[int]:
    """Ids of non-special tokens below ``d_vocab`` that decode and re-encode to themselves."""
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise TaskError("this model has no tokenizer; the task generators need one")
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids = [
        i
        for i in sorted(set(tokenizer.get_vocab().values()))
        if i not in special and i < int(model.cfg.d_vocab)
    ]
    texts = tokenizer.batch_decode([[i] for i in ids])
    again = _encode_all(model, texts)
    return [i for i, text, back in zip(ids, texts, again, strict=True) if text and back == [i]]


def bos_prefix(model) -> list[int]:
    """The ids the model puts before a text prompt: ``[BOS]`` or nothing, exactly as
    :func:`interp.engine.to_tokens` does for this model."""
    with_bos = to_tokens(model, "a")[0].tolist()
    without = to_tokens(model, "a", prepend_bos=False)[0].tolist()
    return with_bos[: len(with_bos) - len(without)]


def need(generator: str, what: str, found: int, needed: int, hint: str) -> None:
    """Refuse when fewer than ``needed`` usable words exist for this tokenizer."""
    if found < needed:
        raise TaskError(
            f"{generator} needs {needed} or more {what}; this model's tokenizer has {found}. {hint}"
        )
