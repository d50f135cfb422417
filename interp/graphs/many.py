"""Attribution graphs of many prompts in one call: ``attribution_graph(model, [p1, p2], tc)``.

Each prompt gets the graph :func:`interp.graphs.attribute.attribution_graph` gives it alone
(the same nodes, edges and scores: every prompt is its own clean pass, frozen pass and
backward passes, since a graph's Jacobian is of one prompt). What the prompts share is done
once, before the first graph: every prompt is tokenised and checked (so a bad prompt is
refused before any graph is built, naming its index), the transcoders are checked against
the model and converted to the model's device and working dtype once (each graph's own
conversion is then a no-op; converting a half-precision set to float32 is a full copy of
its weights per call otherwise).

The single-prompt function is passed in (``one_graph``) rather than imported, so this module
sits below :mod:`interp.graphs.attribute`, which dispatches here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor

from interp.engine import to_tokens
from interp.transcoders.loading import check_transcoders_fit

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


def iter_graphs(one_graph: Callable, model, prompts: Sequence, tc, **options) -> Iterator:
    """The graph of each prompt in turn, each built by ``one_graph(model, tokens, tc,
    **options)``. Every prompt and the transcoders are checked here, before the first graph
    (module docstring); a caller that writes each graph and lets it go holds one at a time."""
    tokens = prompt_tokens(model, prompts)
    tc = _shared_transcoders(model, tc)
    return (one_graph(model, ids, tc, **options) for ids in tokens)


def graphs_of_prompts(one_graph: Callable, model, tokens_or_text: Sequence, tc, **options) -> list:
    """Every prompt's graph, in the order given (:func:`iter_graphs`, collected):
    ``attribution_graph``'s arguments with a list of prompts in ``tokens_or_text``."""
    return list(iter_graphs(one_graph, model, tokens_or_text, tc, **options))
