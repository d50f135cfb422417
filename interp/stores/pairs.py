"""A store's MLP inputs and outputs, read as the pairs :func:`interp.train_transcoder` trains on.

A store filled by :func:`interp.stores.fill_store` with every layer's ``blocks.L.mlp.hook_in``
and ``blocks.L.mlp.hook_out`` is read in shuffled batches of those hooks together (the same
tokens at each), within ``max_bytes`` (:mod:`interp.stores.reading`), and split into ``x`` and
``y``, ``[batch_tokens layer d_model]`` each.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from interp.stores.activations import ActivationStore
from interp.stores.budget import (
    evaluation_plan,
    split_budget,
    split_rows,
    step_bytes,
)
from interp.stores.reading import least_reading_bytes

__all__ = ["store_pairs"]


def _opened(model, store, layers: Sequence[int], hooks: tuple[str, str]):
    """``store`` opened and checked: of ``model``, holding every layer's ``hooks`` (input,
    output), not filled for an SAE's replay; with the input and output hook names."""
    store = store if isinstance(store, ActivationStore) else ActivationStore(store)
    if store.meta["filled"]["kind"] != "tokens":
        raise ValueError(
            f"{store.path} was filled with fill_training_store for an SAE; fill one for "
            "transcoders with interp.stores.fill_store"
        )
    names_in = [f"blocks.{layer}.{hooks[0]}" for layer in layers]
    names_out = [f"blocks.{layer}.{hooks[1]}" for layer in layers]
    missing = [h for h in names_in + names_out if h not in store.hooks]
    if missing:
        raise ValueError(
            f"{store.path} holds {', '.join(store.hooks)}; a transcoder set trains on every "
            f"layer's {hooks[0]} and {hooks[1]}, and {', '.join(missing)} are missing: fill a "
            "store with those hooks (interp.stores.fill_store)"
        )
    store.check(model, names_in[0])
    return store, names_in, names_out


def store_pairs(
    model, store, layers: Sequence[int], hooks: tuple[str, str], generator: torch.Generator, *,
    batch_tokens: int, max_bytes: int | str | None, held_out: list[Tensor], sizes: dict,
) -> tuple[Iterator[tuple[Tensor, Tensor]], list[Tensor]]:  # fmt: skip
    """``(shuffled (x, y) batches of store, held_out)`` (module docstring), checked before any
    read: the store is of ``model``, holds every layer's ``hooks`` (input, output) and was not
    filled for an SAE's replay. With ``max_bytes``, shared first (:func:`_budget`, by the
    training's ``sizes``) and ``held_out`` split into the passes it allows."""
    store, names_in, names_out = _opened(model, store, layers, hooks)
    if max_bytes is not None:
        max_bytes, held_out = _budget(
            model, store, names_in, names_out, max_bytes, batch_tokens, held_out, **sizes
        )
    n = len(layers)
    batches = store.batches(
        names_in + names_out, batch_tokens, generator=generator, max_bytes=max_bytes
    )
    return ((batch[:, :n], batch[:, n:]) for batch in batches), held_out


def _budget(model, store, names_in, names_out, max_bytes, batch_tokens: int, held_out, *,
            d_tc: int, params: int, w_dec: int, tokens: int, chunk: int):  # fmt: skip
    """``(the reading's bytes, held_out split)``: ``max_bytes`` shared between
    ``train_transcoder``'s ``params`` parameters (``w_dec`` of them its decoder, whose masked
    and normed copies each step makes) and ``tokens`` bytes of token ids, its steps, its
    evaluation (the ``held_out`` rows, ``chunk`` tokens at a time) and the reading
    (:mod:`interp.stores.budget`)."""
    n, d = len(names_in), int(store.meta["d"][names_in[0]])
    row_bytes = 2 * n * d * 4
    evaluation = evaluation_plan(model, held_out, names_in + names_out, row_bytes, params, chunk,
                                 n * (d_tc + 2 * d), max_bytes, tokens)  # fmt: skip
    budget = split_budget(
        max_bytes, params=params, steps=step_bytes(batch_tokens, n * (2 * d + d_tc), w_dec),
        evaluation=evaluation, tokens=tokens, what="transcoders",
        least_reading=least_reading_bytes(len(store), row_bytes, batch_tokens),
    )  # fmt: skip
    return budget.reading, split_rows(held_out, budget.eval_rows)
