"""Attribution graphs of many prompts in one call: ``attribution_graph(model, [p1, p2], tc)``.

Each prompt gets the graph :func:`interp.graphs.attribute.attribution_graph` gives it alone
(the same nodes, edges and scores: every prompt is its own clean pass, frozen pass and
backward passes, since a graph's Jacobian is of one prompt). What the prompts share is done
once: every prompt is tokenised and checked before the first graph (so a bad prompt is
refused before any graph is built, naming its index); the transcoders are checked against
the model and converted to the model's device and working dtype (each graph's own conversion
is then a no-op; converting a half-precision set to float32 is a full copy of its weights per
call otherwise); and the attention weights the frozen pass reads for its value path
(:func:`interp.graphs.value_path.value_path_weights`: 0.05 to 0.3 s of CPU a graph on a
GPT-2-small-shaped bridge) are read for the first graph and handed to the others. The saving
is small beside the backward passes (``benchmarks/bench_graph_many.py``: about 4% of the CPU
time of three 12-position prompts on that model).

The single-prompt function is passed in (``one_graph``) rather than imported, so this module
sits below :mod:`interp.graphs.attribute`, which dispatches here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

from interp.engine import to_tokens
from interp.graphs import frozen
from interp.transcoders.loading import check_transcoders_fit

logger = logging.getLogger(__name__)

__all__ = ["graphs_of_prompts", "iter_graphs", "many_prompts", "prompt_tokens"]


def many_prompts(prompts) -> bool:
    """Whether ``prompts`` is a list of prompts (texts, token-id tensors or token-id lists),
    not one prompt (a text, a tensor, or a flat list of token ids)."""
    return (
        isinstance(prompts, list | tuple)
        and len(prompts) > 0
        and all(isinstance(p, str | Tensor | list | tuple) for p in prompts)
    )


def prompt_tokens(model, prompts: Sequence) -> list[Tensor]:
    """Each prompt's token ids ``[pos]`` (on the CPU), every prompt checked before any work;
    errors name the prompt by its index."""
    if not prompts:
        raise ValueError("no prompts given: pass a list of at least one prompt")
    out = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str) and not prompt.strip():
            raise ValueError(f"prompt {i} is blank: pass some text")
        try:
            tokens = to_tokens(model, prompt)
        except ValueError as exc:
            raise ValueError(f"prompt {i}: {exc}") from exc
        if tokens.shape[0] != 1:
            raise ValueError(
                f"prompt {i} has {tokens.shape[0]} rows; each prompt of the list is one prompt"
            )
        tokens = tokens[0].cpu()
        if len(tokens) < 2:
            raise ValueError(
                f"prompt {i} has {len(tokens)} token; a graph needs at least 2 (position 0 has "
                "no feature nodes)"
            )
        out.append(tokens)
    return out


def _shared_transcoders(model, tc):
    """The transcoders checked against ``model`` and on its device in the graph's working
    dtype (float32 at least: a half-precision model's graph is computed in float32)."""
    check_transcoders_fit(model, tc)
    dtype = torch.float64 if model.cfg.dtype == torch.float64 else torch.float32
    return tc.to(device=model.cfg.device, dtype=dtype)


@contextmanager
def _weights_read_once(cache: dict) -> Iterator[None]:
    """While open, :func:`interp.graphs.frozen.frozen_pass` gets the value-path weights of a
    model and layer count from ``cache`` (read there on the first call): the same tensors for
    every graph of one list, whose model does not change between its graphs."""
    read = getattr(frozen, "value_path_weights", None)
    if read is None:  # frozen_pass no longer reads them by that name
        if not cache.get("warned"):
            cache["warned"] = True
            logger.warning("the value-path weights are read once per prompt, not shared")
        yield
        return

    def shared(model, n_layers: int):
        key = (id(model), int(n_layers))
        if key not in cache:
            cache[key] = read(model, n_layers)
        return cache[key]

    frozen.value_path_weights = shared
    try:
        yield
    finally:
        frozen.value_path_weights = read


def iter_graphs(
    one_graph: Callable, model, prompts: Sequence, tc, options: Mapping | None = None
) -> Iterator:
    """The graph of each prompt in turn, each built by ``one_graph(model, tokens, tc,
    **options)`` (``options``: ``attribution_graph``'s keyword arguments). Every prompt and the
    transcoders are checked here, before the first graph (module docstring); a caller that
    writes each graph and lets it go holds one at a time. The model's weights must not change
    while iterating (their reads are shared)."""
    tokens = prompt_tokens(model, prompts)
    tc = _shared_transcoders(model, tc)
    cache: dict = {}

    def build(ids: Tensor):
        with _weights_read_once(cache):
            return one_graph(model, ids, tc, **(options or {}))

    return (build(ids) for ids in tokens)


def graphs_of_prompts(
    one_graph: Callable, model, tokens_or_text: Sequence, tc, options: Mapping | None = None
) -> list:
    """Every prompt's graph, in the order given (:func:`iter_graphs`, collected):
    ``attribution_graph``'s arguments with a list of prompts in ``tokens_or_text``."""
    return list(iter_graphs(one_graph, model, tokens_or_text, tc, options))
