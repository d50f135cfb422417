"""What a dictionary (an SAE, transcoders) trains on: token rows from text, and the bundled
model's own training mix.

The bundled model (``tiny-induction``, experiments/train_bundled_model.py) was trained on two
halves per step: windows of the standard library's ``.py`` source, and synthetic ``a + a``
repeats of uniform random ordinary tokens. :func:`stdlib_sources` and
:func:`repeated_random_tokens` are that script's own generators (it imports them from here),
so ``train_sae(model, hook)`` (and ``train_transcoder``) with no texts sees the distribution the
model was trained on.

:class:`TokenRows` turns either source into seeded batches of token rows; every random draw
comes from the one ``torch.Generator`` it is given. :func:`hook_activations` reads their
activations at hooks through the engine (``run_cached``), a BOS at position 0 left out (SAEs,
transcoders and stores read them so). Moved here from ``interp.saes.data`` in 0.6.0 (the old
path went in 0.7.0).
"""

from __future__ import annotations

import random
import sysconfig
import weakref
from collections.abc import Sequence
from pathlib import Path

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.engine import run_cached

__all__ = [
    "SKIP_DIRS",
    "TokenRows",
    "activations_at",
    "hook_activations",
    "kept",
    "repeated_random_tokens",
    "stdlib_sources",
]

# package folders that are mostly tests or GUI code, not representative Python
SKIP_DIRS = ("idlelib", "lib2to3", "site-packages", "test", "tests", "turtledemo")
N_SPECIAL = 1  # id 0 is <|endoftext|> in the bundled tokenizer; ordinary ids are the rest
WINDOW = 128  # tokens per text row: the bundled model's training windows
BUNDLED_CHARS = 3_000_000  # of stdlib source for texts=None: ~1M tokens, tokenised in seconds
REP_LEN = (4, 80)  # the bundled model's synthetic repeat lengths, inclusive
BOS_PROB = 0.5  # share of synthetic rows that start with BOS, as in training


def stdlib_sources(max_chars: int, seed: int) -> list[str]:
    """The standard library's .py files (no tests), shuffled by seed, up to max_chars."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        f for f in root.rglob("*.py") if not set(SKIP_DIRS) & set(f.relative_to(root).parts)
    )
    random.Random(seed).shuffle(files)
    texts, total = [], 0
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a few files are latin-1 test fixtures; not worth special-casing
        texts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    if not texts:
        raise RuntimeError(
            f"no readable .py files under {root}; is the standard library installed?"
        )
    return texts


def repeated_random_tokens(
    d_vocab: int,
    rep_len: int,
    batch: int,
    generator: torch.Generator,
    *,
    bos_id: int | None,
) -> Int[Tensor, "batch pos"]:
    """``[BOS] + a + a`` (or ``a + a`` when bos_id is None), a uniform over ordinary ids."""
    half = torch.randint(N_SPECIAL, d_vocab, (batch, rep_len), generator=generator)
    parts = [half, half]
    if bos_id is not None:
        parts.insert(0, torch.full((batch, 1), bos_id, dtype=torch.long))
    return torch.cat(parts, dim=1)


# the standard library's stream for texts=None, per tokenizer: tokenising its 3M characters
# takes seconds, and every train_sae call (a sweep makes many) would repeat the same work
_STDLIB_STREAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _stream(tokenizer, texts: Sequence[str], sep: int | None) -> Tensor:
    """The documents' ids joined into one stream, ``sep`` after each."""
    ids: list[int] = []
    for encoded in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(encoded)
        if sep is not None:
            ids.append(sep)
    return torch.tensor(ids, dtype=torch.long)


def _stdlib_stream(tokenizer, sep: int | None) -> Tensor:
    """:func:`_stream` of the default texts, kept per tokenizer (and its vocabulary's size,
    which grows if tokens are added to it)."""
    key = (BUNDLED_CHARS, len(tokenizer), sep)
    try:
        kept = _STDLIB_STREAMS.setdefault(tokenizer, {})
    except TypeError:  # a tokenizer that cannot be weakly referenced: no cache
        kept = {}
    if key not in kept:
        texts = [t for t in stdlib_sources(BUNDLED_CHARS, seed=0) if t]  # as user texts
        kept[key] = _stream(tokenizer, texts, sep)
    return kept[key].clone()


def _separator(tokenizer) -> int | None:
    """The id put between documents: EOS, else BOS, else none."""
    for token_id in (tokenizer.eos_token_id, tokenizer.bos_token_id):
        if token_id is not None:
            return int(token_id)
    return None


class TokenRows:
    """Seeded rows of token ids for a dictionary's activations.

    Text (the user's, or the standard library's source when ``texts`` is None) is tokenised
    once, joined into one stream with EOS between documents, and cut into random windows.
    With ``texts=None`` every draw also adds ``a + a`` repeats of about as many tokens (the
    bundled model's training mix). The last ``holdout`` share of the stream is kept apart for
    evaluation (:meth:`held_out`).
    """

    def __init__(
        self,
        model,
        texts: Sequence[str] | None,
        generator: torch.Generator,
        *,
        holdout: float = 0.05,
    ):
        tokenizer = model.tokenizer
        if tokenizer is None:
            raise ValueError("the model has no tokenizer; load it with one to train a dictionary")
        self.synthetic = texts is None
        sep = _separator(tokenizer)
        if texts is None:
            stream = _stdlib_stream(tokenizer, sep)
        else:
            if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
                raise ValueError("texts must be a list of strings (documents), not one string")
            texts = [t for t in texts if t]
            if not texts:
                raise ValueError("texts is empty: pass some documents, or None for the default")
            stream = _stream(tokenizer, texts, sep)
        n_ctx = int(model.cfg.n_ctx)
        self.window = min(WINDOW, n_ctx)
        n_held = max(self.window, int(len(stream) * holdout))
        if len(stream) < n_held + 2 * self.window:
            raise ValueError(
                f"texts give {len(stream)} tokens; pass at least "
                f"{n_held + 2 * self.window} (windows of {self.window} plus a held-out share)"
            )
        self.train_ids, self.held_ids = stream[:-n_held], stream[-n_held:]
        self.d_vocab = int(model.cfg.d_vocab)
        self.bos_id = tokenizer.bos_token_id
        self.n_ctx = n_ctx
        self.generator = generator

    def _windows(self, ids: Tensor, rows: int, gen: torch.Generator) -> Int[Tensor, "batch pos"]:
        n = self.window
        starts = torch.randint(0, len(ids) - n + 1, (rows,), generator=gen)
        return torch.stack([ids[s : s + n] for s in starts.tolist()])

    def draw(self, n_tokens: int) -> list[Int[Tensor, "batch pos"]]:
        """Batches of rows (all rows of a batch equally long) holding about n_tokens."""
        gen = self.generator
        if not self.synthetic:
            return [self._windows(self.train_ids, -(-n_tokens // self.window), gen)]
        half = n_tokens // 2
        batches = [self._windows(self.train_ids, max(1, -(-half // self.window)), gen)]
        done = 0
        while done < n_tokens - half:
            high = min(REP_LEN[1], (self.n_ctx - 1) // 2)
            rep_len = int(torch.randint(REP_LEN[0], high + 1, (1,), generator=gen))
            with_bos = self.bos_id is not None and bool(torch.rand(1, generator=gen) < BOS_PROB)
            rows = max(1, (n_tokens - half - done) // (2 * rep_len))
            rows = min(rows, max(1, 2048 // (2 * rep_len)))  # keep each pass small
            bos = self.bos_id if with_bos else None
            batches.append(repeated_random_tokens(self.d_vocab, rep_len, rows, gen, bos_id=bos))
            done += rows * 2 * rep_len
        return batches

    def held_out(self, n_tokens: int, seed: int) -> list[Int[Tensor, "batch pos"]]:
        """Rows of the held-out text (and, with texts=None, repeats), drawn from their own
        seed so that evaluation does not move the training draws."""
        gen = torch.Generator().manual_seed(seed)
        text_tokens = n_tokens // 2 if self.synthetic else n_tokens
        rows = max(1, -(-text_tokens // self.window))
        batches = [self._windows(self.held_ids, rows, gen)]
        if self.synthetic:  # the other half: repeats of a fixed length, the same every run
            rep_len = 20
            rows = max(1, (n_tokens - rows * self.window) // (2 * rep_len))
            ids = repeated_random_tokens(self.d_vocab, rep_len, rows, gen, bos_id=None)
            batches.append(ids)
        return batches


def kept(tokens: Int[Tensor, "rows pos"], bos: int | None) -> Bool[Tensor, "rows pos"]:
    """True where a position's activation is kept: every one but a BOS at position 0 (its
    activation is a constant outlier)."""
    keep = torch.ones(tokens.shape, dtype=torch.bool)
    if bos is not None:
        keep[:, 0] = tokens[:, 0] != bos
    return keep


def hook_activations(
    model, hooks: Sequence[str], tokens: Int[Tensor, "rows pos"]
) -> dict[str, Float[Tensor, "n d"]]:
    """Every hook's float32 activations at the :func:`kept` positions of ``tokens``, from one
    forward pass (an SAE's buffers, a transcoder's pairs, a store's parts)."""
    run = run_cached(model, tokens, hooks=list(hooks), keep_logits=False, prepend_bos=False)
    keep = kept(tokens, getattr(model.tokenizer, "bos_token_id", None))
    out = {}
    for hook in hooks:
        acts = run.activations[hook]
        if acts.dim() != 3:
            raise ValueError(
                f"hook '{hook}' gives activations of shape {tuple(acts.shape)}; dictionaries and "
                "stores read [batch pos d] hooks such as blocks.L.hook_resid_pre"
            )
        out[hook] = acts[keep.to(acts.device)].float()
    return out


def activations_at(model, hook: str, batches: Sequence[Tensor]) -> Float[Tensor, "n d_in"]:
    """The activations at ``hook`` of every kept token of ``batches`` (rows of token ids), as
    one ``[n d_in]`` tensor."""
    return torch.cat([hook_activations(model, [hook], tokens)[hook] for tokens in batches])
